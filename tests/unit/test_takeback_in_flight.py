"""A false alarm taken back while a recovery is in flight (issue 21, Build item 1).

The controller's core on fakes, stepped by hand (the tier of ``test_executor.py``). Two kinds
of returned server:

* **the app's home** (it holds the home primary): s1 is declared failed while alive, p
  recovers on s2 (interim, then target), and s1 is heard from again at each step of that
  recovery;
* **the server of a recovery** (it holds only smaller models, or a target still loading):
  p's home s1 dies for good, p recovers on s2, and s2 is declared failed while alive in the
  middle of that recovery, then heard from again. "Tight": s1 and s2 are the only servers, so
  s2's failover finds no room for p; "room": s3 and s4 are there too.

Every test checks the end: the app served by its best placement (its home, or its recovery
target), never by an interim promoted over a target; no replica left loading or unloading;
every model an agent holds accounted for by a record and every ready replica held.
"""

from __future__ import annotations

import asyncio

from controller.records import AppStatus, ServerState
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    SMALL,
    Controller,
    app_record,
    new_cluster,
    replica,
)
from tests.unit.scenario import run
from understudy.wire.protocol import ModelState

SCENARIO_LIMIT_S = 8.0
"""How long one scenario here may run before it fails rather than hangs."""

SERVES = ("serving", "upgraded", "failback")
"""Event kinds that make a replica the app's primary."""


def cluster(servers: tuple[str, ...] = ("s1", "s2", "s3", "s4"),
            auto_unload: bool = True) -> Controller:
    """One app, p, served by its home primary (s1, LARGE); 1000 MB a server."""
    return new_cluster([app_record("p", [replica("s1", LARGE)], serving=("s1", LARGE))],
                       servers=servers, auto_unload=auto_unload)


def replicas(ctl: Controller) -> list[tuple[str, str, Role, ModelState]]:
    return sorted((r.server_id, r.variant, r.role, r.state)
                  for r in ctl.store.app("p").replicas)


def has_replica(ctl: Controller, server_id: str) -> bool:
    return any(r.server_id == server_id for r in ctl.store.app("p").replicas)


def pending(ctl: Controller, op: str, server_id: str, variant: str) -> bool:
    return ctl.agents.find(op, server_id, "p", variant) is not None


async def served_by(ctl: Controller, server_id: str, variant: str) -> None:
    await ctl.agents.timeline.until(lambda: ctl.store.app("p").serving == (server_id, variant))


async def settle(ctl: Controller, *failovers: asyncio.Future[None]) -> None:
    """Answer every command from now on; wait for the failovers and all background work."""
    ctl.agents.auto_load = True
    ctl.agents.auto_unload = True
    while ctl.agents.complete_all():
        await asyncio.sleep(0)
    await asyncio.gather(*failovers)
    await ctl.executor.idle()
    ctl.agents.complete_all()
    await ctl.executor.idle()


def assert_settled_on(ctl: Controller, server_id: str, variant: str, revived_at: int) -> None:
    """p serves from (server, variant) as its primary, and records and agents agree."""
    record = ctl.store.app("p")
    assert record.serving == (server_id, variant)
    serving = record.serving_replica()
    assert serving is not None and (serving.role, serving.state) == (Role.PRIMARY,
                                                                      ModelState.READY)
    assert record.status is (AppStatus.SERVING if variant == LARGE else AppStatus.DEGRADED)
    # Never an interim promoted: after the revival, only the final variant became primary.
    promoted = [(e.kind, e.server_id, e.variant) for e in ctl.sink.delivered[revived_at:]
                if e.kind in SERVES]
    assert all(v == LARGE for _, _, v in promoted), promoted
    # No replica left loading or unloading.
    states = {r.state for r in record.replicas}
    assert states == {ModelState.READY}, replicas(ctl)
    # Every model a live agent holds is a READY replica in the records, and the reverse.
    servers = ctl.store.all_servers()
    recorded = {(r.server_id, "p", r.variant) for r in record.replicas}
    held = {(s, a, v) for s, server in servers.items() if server.state is not ServerState.FAILED
            for a, v in ctl.agents.held(s)}
    assert held == recorded
    assert not ctl.agents.pending


# --- the app's home is heard from again ---------------------------------------------------


async def home_declared(ctl: Controller) -> asyncio.Future[None]:
    """s1 declared failed while alive; p's recovery on s2 starts (interim SMALL loading)."""
    failover = asyncio.ensure_future(
        ctl.lifecycle.fail_server("s1", "heartbeats late", ctl.clock.time()))
    await ctl.agents.wait_pending("load", "s2", "p", SMALL)
    assert ("s2", LARGE, Role.UPGRADE, ModelState.LOADING) in replicas(ctl)
    return failover


def test_home_heard_while_the_interim_still_loads_takes_the_app_back_home() -> None:
    async def body() -> None:
        ctl = cluster()
        failover = await home_declared(ctl)
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s1")
        assert ctl.store.app("p").serving == ("s1", LARGE)
        await settle(ctl, failover)
        assert_settled_on(ctl, "s1", LARGE, revived_at)
        assert ctl.agents.find("load", "s2", "p", LARGE) is None  # never sent

    run(body, SCENARIO_LIMIT_S)


def test_home_heard_while_the_interim_serves_and_the_target_loads() -> None:
    async def body() -> None:
        ctl = cluster()
        failover = await home_declared(ctl)
        await ctl.agents.complete_load("s2", "p", SMALL)
        await served_by(ctl, "s2", SMALL)
        await ctl.agents.wait_pending("load", "s2", "p", LARGE)
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s1")
        assert ctl.store.app("p").serving == ("s1", LARGE)
        await settle(ctl, failover)
        assert_settled_on(ctl, "s1", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


def test_home_heard_after_the_target_loaded_and_before_the_interim_was_unloaded() -> None:
    async def body() -> None:
        ctl = cluster(auto_unload=False)
        failover = await home_declared(ctl)
        await ctl.agents.complete_load("s2", "p", SMALL)
        await ctl.agents.complete_load("s2", "p", LARGE)
        await served_by(ctl, "s2", LARGE)
        await ctl.agents.wait_pending("unload", "s2", "p", SMALL)  # not answered yet
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s1")
        assert ctl.store.app("p").serving == ("s1", LARGE)
        await settle(ctl, failover)
        assert_settled_on(ctl, "s1", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


# --- the server of a recovery is heard from again ----------------------------------------


async def recovery_server_declared(ctl: Controller, *, target_sent: bool
                                   ) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
    """s1 dies; p recovers on s2; s2 is declared failed while alive; its failover is planned.

    ``target_sent``: s2 serves p's interim and loads its target when declared; otherwise
    s2 is still loading the interim.
    """
    ctl.agents.disconnect("s1")
    first = asyncio.ensure_future(ctl.lifecycle.fail_server("s1", "dead", ctl.clock.time()))
    await ctl.agents.wait_pending("load", "s2", "p", SMALL)
    if target_sent:
        await ctl.agents.complete_load("s2", "p", SMALL)
        await served_by(ctl, "s2", SMALL)
        await ctl.agents.wait_pending("load", "s2", "p", LARGE)
    second = asyncio.ensure_future(
        ctl.lifecycle.fail_server("s2", "heartbeats late", ctl.clock.time()))
    await ctl.agents.timeline.until(lambda: not has_replica(ctl, "s2"))  # forgotten
    return first, second


def test_tight_recovery_server_heard_while_its_target_loads_keeps_the_target() -> None:
    """The issue's case: the interim was made primary and the loading target a stray."""
    async def body() -> None:
        ctl = cluster(servers=("s1", "s2"))
        first, second = await recovery_server_declared(ctl, target_sent=True)
        assert ctl.store.app("p").status is AppStatus.UNAVAILABLE  # no room anywhere else
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")
        # The held interim serves meanwhile, as an interim; the target is still wanted.
        record = ctl.store.app("p")
        assert record.serving == ("s2", SMALL)
        assert ("s2", SMALL, Role.INTERIM, ModelState.READY) in replicas(ctl)
        assert ("s2", LARGE, Role.UPGRADE, ModelState.LOADING) in replicas(ctl)
        assert ctl.agents.find("unload", "s2", "p", LARGE) is None
        await ctl.agents.complete_load("s2", "p", LARGE)
        await served_by(ctl, "s2", LARGE)
        await settle(ctl, first, second)
        assert_settled_on(ctl, "s2", LARGE, revived_at)
        assert ("unload", "s2", LARGE) not in [
            (e.what, e.server_id, e.variant) for e in ctl.agents.commands("unload")]

    run(body, SCENARIO_LIMIT_S)


def test_recovery_server_heard_while_its_target_loads_keeps_it_over_a_new_recovery() -> None:
    async def body() -> None:
        ctl = cluster()
        first, second = await recovery_server_declared(ctl, target_sent=True)
        assert has_replica(ctl, "s3")  # s2's failover recovers p on s3
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")
        assert ctl.store.app("p").serving == ("s2", SMALL)
        assert ("s2", LARGE, Role.UPGRADE, ModelState.LOADING) in replicas(ctl)
        await ctl.agents.complete_load("s2", "p", LARGE)
        await served_by(ctl, "s2", LARGE)
        await settle(ctl, first, second)
        assert_settled_on(ctl, "s2", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


def test_recovery_server_heard_after_its_target_loaded_serves_that_target() -> None:
    async def body() -> None:
        ctl = cluster(servers=("s1", "s2"))
        first, second = await recovery_server_declared(ctl, target_sent=True)
        # The target's load ends while s2 is marked failed: nothing is sent to s2.
        await ctl.agents.complete_load("s2", "p", LARGE)
        await ctl.agents.timeline.until(lambda: ctl.agents.held("s2") == {
            ("p", SMALL), ("p", LARGE)})
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")
        assert ctl.store.app("p").serving == ("s2", LARGE)
        await settle(ctl, first, second)
        assert_settled_on(ctl, "s2", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


def test_tight_recovery_server_holding_only_its_interim_loads_the_target_again() -> None:
    """Declared while the interim loaded: the target was never sent, and is forgotten."""
    async def body() -> None:
        ctl = cluster(servers=("s1", "s2"))
        first, second = await recovery_server_declared(ctl, target_sent=False)
        await ctl.agents.complete_load("s2", "p", SMALL)
        await ctl.agents.timeline.until(lambda: ctl.agents.held("s2") == {("p", SMALL)})
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")
        await served_by(ctl, "s2", SMALL)
        # Not left on the interim: its target loads where it serves.
        await ctl.agents.wait_pending("load", "s2", "p", LARGE)
        await settle(ctl, first, second)
        assert_settled_on(ctl, "s2", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


def test_tight_recovery_server_heard_while_its_interim_loads_loads_the_target_too() -> None:
    async def body() -> None:
        ctl = cluster(servers=("s1", "s2"))
        first, second = await recovery_server_declared(ctl, target_sent=False)
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")  # the interim's load is still pending
        await ctl.agents.wait_pending("load", "s2", "p", LARGE)
        # The loading interim is kept, as an interim: it never goes over the target.
        assert ("s2", SMALL, Role.INTERIM, ModelState.LOADING) in replicas(ctl)
        await settle(ctl, first, second)
        assert_settled_on(ctl, "s2", LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)


def test_recovery_server_heard_while_its_interim_loads_ends_on_a_target() -> None:
    """With room elsewhere: wherever the target is, the app ends on it and nothing is left."""
    async def body() -> None:
        ctl = cluster()
        first, second = await recovery_server_declared(ctl, target_sent=False)
        revived_at = len(ctl.sink.delivered)
        await ctl.returns.revive("s2")
        await settle(ctl, first, second)
        serving = ctl.store.app("p").serving
        assert serving is not None and serving[1] == LARGE
        assert_settled_on(ctl, serving[0], LARGE, revived_at)

    run(body, SCENARIO_LIMIT_S)
