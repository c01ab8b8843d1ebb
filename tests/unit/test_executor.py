"""The executor tier: the controller's core on fakes, stepped by hand (STYLE.md item 11).

Every test drives the real Executor, ServerLifecycle, ServerReturns, Orchestrator and
WarmPlanner against ``tests/unit/fakes.py``: agent loads stay pending until the test answers
them, so the order of events and commands is the test's to check. Nothing sleeps: the tests
wait on conditions (``Timeline.until``) and on ``Executor.idle()``, under a hard timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.executor import Locks
from controller.records import AppSpec, AppStatus, ServerState
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    MEDIUM,
    SITES,
    SMALL,
    Controller,
    app_record,
    build_controller,
    replica,
)
from tests.unit.controller_harness import new_cluster as harness_cluster
from tests.unit.fakes import FakeStore, ManualClock
from tests.unit.scenario import run
from understudy.wire.protocol import ModelState

SCENARIO_LIMIT_S = 8.0
"""How long one scenario here may run before it fails rather than hangs."""

Command = tuple[str, str, str, str, bool]
"""(op, server, app, variant, urgent) of an agent command."""


def new_cluster(apps: list[Any], *, auto_load: bool = False, auto_unload: bool = True,
                memory_mb: float = 1000.0) -> Controller:
    return harness_cluster(apps, auto_load=auto_load, auto_unload=auto_unload,
                           memory_mb=memory_mb)


def failover_apps() -> list[Any]:
    """s1 serves a critical app (warm backup on s2) and two apps without backups."""
    return [
        app_record("crit", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM)],
                   serving=("s1", LARGE), critical=True),
        app_record("p1", [replica("s1", LARGE)], serving=("s1", LARGE)),
        app_record("p2", [replica("s1", MEDIUM)], serving=("s1", MEDIUM), variant=MEDIUM),
    ]


def commands(ctl: Controller, *ops: str, start: int = 0) -> list[Command]:
    return [(e.what, e.server_id or "", e.app_id, e.variant or "", e.urgent)
            for e in ctl.agents.commands(*(ops or ("load", "unload")))[start:]]


def events(ctl: Controller) -> list[tuple[str, str, str | None, str | None]]:
    return [(e.kind, e.app_id, e.server_id, e.variant) for e in ctl.sink.delivered]


def placement(ctl: Controller) -> dict[str, Any]:
    """What the records say, without times: status, serving, home, replicas."""
    return {a: (r.status, r.serving, r.home,
                sorted((x.server_id, x.variant, x.role, x.state) for x in r.replicas))
            for a, r in ctl.store.all_apps().items()}


def assert_consistent(ctl: Controller) -> None:
    """Records and agents agree: every replica READY and held, nothing held unrecorded.

    A failed server's models are lost with it and not counted.
    """
    servers = ctl.store.all_servers()
    recorded = set()
    for app_id, record in ctl.store.all_apps().items():
        for r in record.replicas:
            assert r.state is ModelState.READY, (app_id, r)
            recorded.add((r.server_id, app_id, r.variant))
        assert record.serving is not None and record.serving_replica() is not None, app_id
    held = {(s, a, v) for s, server in servers.items() if server.state is not ServerState.FAILED
            for a, v in ctl.agents.held(s)}
    assert recorded == held
    assert not ctl.agents.pending


async def event_delivered(ctl: Controller, kind: str, app_id: str) -> None:
    await ctl.agents.timeline.until(lambda: (kind, app_id) in ctl.sink.kinds())


async def load_sent(ctl: Controller, server_id: str, app_id: str, variant: str) -> None:
    await ctl.agents.timeline.until(
        lambda: ctl.agents.find("load", server_id, app_id, variant) is not None)


# --- failover ------------------------------------------------------------------------------


def test_failover_announces_warm_switches_first_then_interims_then_upgrades() -> None:
    async def body() -> Controller:
        ctl = new_cluster(failover_apps())
        ctl.agents.disconnect("s1")  # a dead server's agent is gone
        failover = asyncio.ensure_future(
            ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time()))
        await load_sent(ctl, "s3", "p1", SMALL)
        await load_sent(ctl, "s4", "p2", SMALL)
        # The warm switch reached the clients before the agents heard anything.
        first = ctl.agents.timeline.entries[0]
        assert (first.what, first.app_id, first.server_id, first.variant) == (
            "warm_switch", "crit", "s2", SMALL)
        switch = ctl.sink.delivered[0]
        assert (switch.failed_server, switch.failure_at, switch.seq) == (
            "s1", ctl.clock.time(), 1)
        assert [(i["kind"], i["server_id"]) for i in ctl.store.intents_now()] == [
            ("failover", "s1")]
        assert ctl.store.server("s1").state is ServerState.FAILED
        crit = ctl.store.app("crit")
        assert crit.serving == ("s2", SMALL) and crit.status is AppStatus.DEGRADED
        p1 = ctl.store.app("p1")
        assert (p1.status, p1.serving) == (AppStatus.RECOVERING, None)
        assert sorted((r.server_id, r.variant, r.role, r.state) for r in p1.replicas) == [
            ("s3", LARGE, Role.UPGRADE, ModelState.LOADING),
            ("s3", SMALL, Role.INTERIM, ModelState.LOADING)]
        assert commands(ctl) == [("load", "s3", "p1", SMALL, True),
                                 ("load", "s4", "p2", SMALL, True)]

        detected_at = ctl.clock.time()
        ctl.clock.advance(2.0)
        await ctl.agents.complete_load("s3", "p1", SMALL, load_s=0.3)
        await event_delivered(ctl, "interim_serving", "p1")
        assert ctl.store.app("p1").serving == ("s3", SMALL)
        interim = ctl.sink.delivered[-1]
        assert (interim.load_s, interim.failure_at, interim.time) == (
            0.3, detected_at, detected_at + 2.0)
        assert ctl.store.app("p1").updated_at == detected_at + 2.0
        assert len(commands(ctl)) == 2  # no upgrade while an interim is still loading
        await ctl.agents.complete_load("s4", "p2", SMALL)
        await load_sent(ctl, "s3", "p1", LARGE)
        await load_sent(ctl, "s4", "p2", MEDIUM)
        await ctl.agents.complete_load("s3", "p1", LARGE)
        await event_delivered(ctl, "upgraded", "p1")
        await ctl.agents.complete_load("s4", "p2", MEDIUM)
        await event_delivered(ctl, "upgraded", "p2")
        # The failover's last step, the warm re-plan, backs the switched app up again.
        await load_sent(ctl, "s4", "crit", LARGE)
        assert ctl.store.intents_now() != []  # done only once the re-plan is applied
        await ctl.agents.complete_load("s4", "crit", LARGE)
        await failover
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    assert events(ctl) == [
        ("warm_switch", "crit", "s2", SMALL),
        ("interim_serving", "p1", "s3", SMALL),
        ("interim_serving", "p2", "s4", SMALL),
        ("upgraded", "p1", "s3", LARGE),
        ("upgraded", "p2", "s4", MEDIUM),
        ("backup_ready", "crit", "s4", LARGE)]
    assert [e.seq for e in ctl.sink.delivered] == list(range(1, 7))
    assert commands(ctl) == [
        ("load", "s3", "p1", SMALL, True), ("load", "s4", "p2", SMALL, True),
        ("load", "s3", "p1", LARGE, False), ("load", "s4", "p2", MEDIUM, False),
        ("unload", "s3", "p1", SMALL, False), ("unload", "s4", "p2", SMALL, False),
        ("load", "s4", "crit", LARGE, False)]
    assert not [c for c in commands(ctl, "load", "unload", "inventory") if c[1] == "s1"]
    assert ctl.store.intents_now() == []
    assert [i["kind"] for i in ctl.store.intents_written] == ["failover"]
    assert placement(ctl) == {
        "crit": (AppStatus.DEGRADED, ("s2", SMALL), ("s1", LARGE),
                 [("s2", SMALL, Role.PRIMARY, ModelState.READY),
                  ("s4", LARGE, Role.WARM, ModelState.READY)]),
        "p1": (AppStatus.SERVING, ("s3", LARGE), ("s1", LARGE),
               [("s3", LARGE, Role.PRIMARY, ModelState.READY)]),
        "p2": (AppStatus.SERVING, ("s4", MEDIUM), ("s1", MEDIUM),
               [("s4", MEDIUM, Role.PRIMARY, ModelState.READY)])}
    assert_consistent(ctl)


# --- a false alarm taken back ------------------------------------------------------------


async def _false_alarm(ctl: Controller) -> tuple[int, asyncio.Future[None]]:
    """s1 declared failed while alive; p1's interim serves, p2's loads; then s1 is heard."""
    failover = asyncio.ensure_future(
        ctl.lifecycle.fail_server("s1", "heartbeats late", ctl.clock.time()))
    await ctl.agents.complete_load("s3", "p1", SMALL)
    await event_delivered(ctl, "interim_serving", "p1")
    await load_sent(ctl, "s4", "p2", SMALL)
    revived_at = len(ctl.agents.commands("load", "unload"))
    await ctl.returns.revive("s1")
    return revived_at, failover


def test_a_false_alarm_mid_recovery_switches_back_without_loads_and_retires_the_rest() -> None:
    async def body() -> tuple[Controller, int, list[Any]]:
        ctl = new_cluster(failover_apps())
        revived_at, failover = await _false_alarm(ctl)
        after_revive = events(ctl)
        assert ctl.watch.false_alarms == ["s1"]
        assert ctl.store.server("s1").state is ServerState.UP
        # The in-flight interim is retired: unloaded once its load completes.
        assert ctl.store.app("p2").replica("s4", SMALL).state is ModelState.UNLOADING
        await ctl.agents.complete_load("s4", "p2", SMALL)
        ctl.agents.auto_load = True
        ctl.agents.complete_all()
        await failover
        await ctl.executor.idle()
        return ctl, revived_at, after_revive

    ctl, revived_at, after_revive = run(body, SCENARIO_LIMIT_S)
    assert after_revive == [
        ("warm_switch", "crit", "s2", SMALL),
        ("interim_serving", "p1", "s3", SMALL),
        ("failback", "crit", "s1", LARGE),
        ("failback", "p1", "s1", LARGE),
        ("serving", "p2", "s1", MEDIUM)]  # p2's clients had nothing since the failure
    after = commands(ctl, start=revived_at)
    assert not [c for c in after if c[0] == "load" and c[1] == "s1"]  # adopted, not loaded
    assert ("unload", "s3", "p1", SMALL, False) in after  # the serving interim
    assert ("unload", "s4", "p2", SMALL, False) in after  # the in-flight interim
    assert {a: (r.serving, r.status) for a, r in ctl.store.all_apps().items()} == {
        "crit": (("s1", LARGE), AppStatus.SERVING),
        "p1": (("s1", LARGE), AppStatus.SERVING),
        "p2": (("s1", MEDIUM), AppStatus.SERVING)}
    assert ctl.store.intents_now() == []
    assert_consistent(ctl)


def test_a_retired_target_whose_stage_had_not_started_is_never_loaded() -> None:
    async def body() -> tuple[Controller, int]:
        ctl = new_cluster(failover_apps(), auto_load=False)
        revived_at, failover = await _false_alarm(ctl)
        await ctl.agents.complete_load("s4", "p2", SMALL)
        ctl.agents.auto_load = True
        ctl.agents.complete_all()
        await failover
        await ctl.executor.idle()
        return ctl, revived_at

    ctl, revived_at = run(body, SCENARIO_LIMIT_S)
    loads = [c for c in commands(ctl, "load", start=revived_at) if c[2] in ("p1", "p2")]
    assert loads == []


# --- restart -------------------------------------------------------------------------------


def test_a_restarted_controller_resumes_the_failover_from_its_intent() -> None:
    async def uninterrupted() -> Controller:
        ctl = new_cluster(failover_apps(), auto_load=True)
        ctl.agents.disconnect("s1")
        await ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time())
        await ctl.executor.idle()
        return ctl

    async def interrupted() -> tuple[Controller, Controller]:
        first = new_cluster(failover_apps())
        first.agents.disconnect("s1")
        failover = asyncio.ensure_future(
            first.lifecycle.fail_server("s1", "heartbeats missed", first.clock.time()))
        await load_sent(first, "s3", "p1", SMALL)
        await load_sent(first, "s4", "p2", SMALL)
        assert [i["kind"] for i in first.store.intents_now()] == ["failover"]
        # Crash: the process and its connections are gone; the agents finish their loads.
        failover.cancel()
        first.executor.cancel_all()
        with pytest.raises(asyncio.CancelledError):
            await failover
        await first.executor.idle()
        agents = first.agents
        agents.drop_pending()
        agents.connected_servers.clear()
        agents.auto_load = True
        second = build_controller(first.store, agents, first.clock)
        # While the failover is resumed, the failed server is never recorded up (a placement
        # in between would pick it).
        states = []
        first.store.on_commit = lambda: states.append(first.store.server("s1").state)
        resumed = await second.lifecycle.startup_reconcile(grace_s=3.0)
        assert len(resumed) == 1
        assert sorted(second.watch.watched) == ["s2", "s3", "s4"]  # s1 stays failed
        for server_id in ("s2", "s3", "s4"):
            await second.returns.on_hello(agents.hello(server_id, SITES[server_id], 1000.0))
        await asyncio.gather(*resumed)
        await second.executor.idle()
        assert states and set(states) == {ServerState.FAILED}
        return first, second

    reference = run(uninterrupted, SCENARIO_LIMIT_S)
    first, second = run(interrupted, SCENARIO_LIMIT_S)
    assert placement(second) == placement(reference)
    assert second.store.server("s1").state is ServerState.FAILED
    assert second.store.intents_now() == []
    # The clients heard the switch from the first controller, the rest from the second.
    assert [k for k, _ in first.sink.kinds()] == ["warm_switch"]
    assert sorted(second.sink.kinds()) == sorted(
        k for k in reference.sink.kinds() if k[0] != "warm_switch")
    assert [e.seq for e in second.store.events] == list(range(1, len(second.store.events) + 1))
    # Resumed loads of apps with nothing serving went out urgent.
    resumed_interims = [c for c in commands(second, "load") if c[3] == SMALL]
    assert resumed_interims and all(c[4] for c in resumed_interims)
    assert_consistent(second)


# --- drain ---------------------------------------------------------------------------------


def test_drain_moves_every_app_without_a_moment_with_nothing_serving() -> None:
    gaps: list[str] = []

    def check(ctl: Controller) -> None:
        servers = ctl.store.all_servers()
        for app_id, record in ctl.store.all_apps().items():
            serving = record.serving_replica()
            if serving is None or serving.state is not ModelState.READY or \
                    servers[serving.server_id].state not in (ServerState.UP,
                                                             ServerState.DRAINING):
                gaps.append(f"{app_id} after write {ctl.store.writes}")

    async def body() -> Controller:
        ctl = new_cluster(failover_apps(), auto_load=True)
        ctl.store.on_commit = lambda: check(ctl)
        ctl.sink.on_deliver = lambda _: check(ctl)
        record = await ctl.lifecycle.drain("s1")
        assert record.state is ServerState.DRAINING
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    assert gaps == []
    assert ctl.store.writes > 5  # the check ran on every step of the drain
    assert ctl.store.server("s1").state is ServerState.DRAINED
    assert ctl.watch.forgotten == ["s1"]
    assert ctl.agents.held("s1") == set()
    assert all(r.server_id != "s1" for a in ctl.store.all_apps().values() for r in a.replicas)
    loads = [c for c in commands(ctl, "load")]
    assert sorted(loads) == [("load", "s3", "p1", LARGE, False),
                             ("load", "s4", "p2", MEDIUM, False)]
    # Each app's new place was serving before its old replica was unloaded.
    timeline = [(e.what, e.app_id, e.server_id) for e in ctl.agents.timeline.entries]
    for app_id, new in (("p1", "s3"), ("p2", "s4"), ("crit", "s2")):
        moved = next(i for i, e in enumerate(timeline)
                     if e[1] == app_id and e[0] not in ("load", "unload") and e[2] == new)
        unloaded = timeline.index(("unload", app_id, "s1"))
        assert moved < unloaded, app_id
    assert {a: r.serving for a, r in ctl.store.all_apps().items()} == {
        "crit": ("s2", SMALL), "p1": ("s3", LARGE), "p2": ("s4", MEDIUM)}
    assert_consistent(ctl)


# --- fail-back -----------------------------------------------------------------------------


def moved_away_apps() -> list[Any]:
    """After a failover of s1, settled: every app serves elsewhere; home is still s1."""
    return [
        app_record("crit", [replica("s2", SMALL), replica("s4", LARGE, Role.WARM)],
                   serving=("s2", SMALL), home=("s1", LARGE), critical=True,
                   status=AppStatus.DEGRADED),
        app_record("p1", [replica("s3", LARGE)], serving=("s3", LARGE), home=("s1", LARGE)),
        app_record("p2", [replica("s4", MEDIUM)], serving=("s4", MEDIUM), home=("s1", MEDIUM),
                   variant=MEDIUM),
    ]


def test_a_failed_server_returning_empty_gets_its_apps_back() -> None:
    async def body() -> Controller:
        ctl = new_cluster(moved_away_apps(), auto_load=True)
        failed = ctl.store.server("s1")
        failed.state, failed.connected = ServerState.FAILED, False
        ctl.store.put_server_now(failed)
        ctl.agents.disconnect("s1")
        await ctl.returns.on_hello(ctl.agents.hello("s1", "site-a", 1000.0))
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    assert sorted(ctl.sink.kinds()) == [("failback", "crit"), ("failback", "p1"),
                                        ("failback", "p2")]
    assert sorted(commands(ctl, "load")) == [("load", "s1", "crit", LARGE, False),
                                             ("load", "s1", "p1", LARGE, False),
                                             ("load", "s1", "p2", MEDIUM, False)]
    # What served meanwhile is unloaded once home serves; crit's warm backup stays.
    assert sorted(commands(ctl, "unload")) == [("unload", "s2", "crit", SMALL, False),
                                               ("unload", "s3", "p1", LARGE, False),
                                               ("unload", "s4", "p2", MEDIUM, False)]
    assert placement(ctl)["crit"] == (
        AppStatus.SERVING, ("s1", LARGE), ("s1", LARGE),
        [("s1", LARGE, Role.PRIMARY, ModelState.READY),
         ("s4", LARGE, Role.WARM, ModelState.READY)])
    assert ctl.store.server("s1").state is ServerState.UP
    assert ctl.watch.watching("s1")
    assert "return" in ctl.replan_requests
    assert_consistent(ctl)


def test_fail_back_evicts_only_the_backups_it_needs_and_loads_after_their_unload() -> None:
    apps = [
        app_record("p1", [replica("s3", LARGE)], serving=("s3", LARGE), home=("s1", LARGE)),
        app_record("q1", [replica("s2", LARGE), replica("s1", MEDIUM, Role.WARM)],
                   serving=("s2", LARGE), critical=True),
        app_record("q2", [replica("s3", LARGE), replica("s1", MEDIUM, Role.WARM)],
                   serving=("s3", LARGE), critical=True),
        app_record("q3", [replica("s1", LARGE)], serving=("s1", LARGE)),
    ]

    async def body() -> Controller:
        ctl = new_cluster(apps, auto_unload=False)  # s1: 800 of 1000 MB used
        fail_back = asyncio.ensure_future(ctl.returns.fail_back("p1"))
        await ctl.agents.wait_pending("unload", "s1", "q1", MEDIUM)
        await fail_back
        assert ctl.store.app("q1").replica("s1", MEDIUM).state is ModelState.UNLOADING
        assert ctl.store.app("q2").replica("s1", MEDIUM).state is ModelState.READY
        assert commands(ctl, "load") == []  # the load waits for the room
        await ctl.agents.complete_unload("s1", "q1", MEDIUM)
        await ctl.agents.complete_load("s1", "p1", LARGE)
        await event_delivered(ctl, "failback", "p1")
        await ctl.agents.complete_unload("s3", "p1", LARGE)
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    assert commands(ctl) == [("unload", "s1", "q1", MEDIUM, False),
                             ("load", "s1", "p1", LARGE, False),
                             ("unload", "s3", "p1", LARGE, False)]
    assert events(ctl) == [("failback", "p1", "s1", LARGE)]
    assert ctl.store.app("q1").replica("s1", MEDIUM) is None
    assert ctl.store.app("p1").serving == ("s1", LARGE)
    assert_consistent(ctl)


def test_no_fail_back_when_evicting_every_backup_would_not_make_room() -> None:
    apps = [
        app_record("p1", [replica("s3", LARGE)], serving=("s3", LARGE), home=("s1", LARGE)),
        app_record("q1", [replica("s2", LARGE), replica("s1", SMALL, Role.WARM)],
                   serving=("s2", LARGE), critical=True),
        app_record("q3", [replica("s1", LARGE)], serving=("s1", LARGE)),
        app_record("q4", [replica("s1", LARGE)], serving=("s1", LARGE)),
    ]

    async def body() -> Controller:
        ctl = new_cluster(apps)  # s1: 900 of 1000 MB, only 100 of it a backup
        await ctl.returns.fail_back("p1")
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    assert commands(ctl) == [] and events(ctl) == []
    assert ctl.store.app("q1").replica("s1", SMALL).state is ModelState.READY


# --- failing actions -----------------------------------------------------------------------


def test_one_failing_load_does_not_stop_the_others() -> None:
    apps = failover_apps()[1:]

    async def body() -> Controller:
        ctl = new_cluster(apps)
        ctl.agents.disconnect("s1")
        failover = asyncio.ensure_future(
            ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time()))
        await ctl.agents.fail_load("s2", "p1", SMALL, "out of memory")
        await ctl.agents.timeline.until(
            lambda: ctl.store.app("p1").replica("s2", SMALL) is None)
        assert "out of memory" in ctl.store.app("p1").reason
        await ctl.agents.complete_load("s3", "p2", SMALL)
        await event_delivered(ctl, "interim_serving", "p2")
        ctl.agents.auto_load = True
        ctl.agents.complete_all()
        await failover
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    # p1 lost its interim, not its recovery: its target still loads and serves.
    assert events(ctl) == [("interim_serving", "p2", "s3", SMALL),
                           ("serving", "p1", "s2", LARGE),
                           ("upgraded", "p2", "s3", MEDIUM)]
    assert {a: (r.serving, r.status) for a, r in ctl.store.all_apps().items()} == {
        "p1": (("s2", LARGE), AppStatus.SERVING), "p2": (("s3", MEDIUM), AppStatus.SERVING)}
    assert ctl.executor.metrics.loads.labels("failed")._value.get() == 1
    assert_consistent(ctl)


def test_a_load_whose_agent_is_unreachable_stays_loading_until_the_agent_returns() -> None:
    async def body() -> Controller:
        ctl = new_cluster([], auto_load=True)
        ctl.agents.disconnect("s3")  # up in the records, its connection just dropped
        record = await ctl.orchestrator.register(
            AppSpec(app_id="solo", family="f", pinned_server="s3"), wait=True)
        assert record.status is AppStatus.PENDING
        assert [(r.server_id, r.variant, r.state) for r in record.replicas] == [
            ("s3", LARGE, ModelState.LOADING)]
        assert commands(ctl, "load") == [] and events(ctl) == []
        assert ctl.executor.metrics.loads.labels("deferred")._value.get() == 1
        await ctl.executor.idle()
        await ctl.returns.on_hello(ctl.agents.hello("s3", "site-b", 1000.0))
        await ctl.executor.idle()
        return ctl

    ctl = run(body, SCENARIO_LIMIT_S)
    # Re-issued on the agent's hello, urgent: nothing else serves the app.
    assert commands(ctl, "load") == [("load", "s3", "solo", LARGE, True)]
    assert events(ctl) == [("serving", "solo", "s3", LARGE)]
    assert ctl.store.app("solo").status is AppStatus.SERVING
    assert_consistent(ctl)


def test_every_app_lock_covers_apps_recorded_after_the_first_read_and_not_deleted_ones() -> None:
    async def body() -> None:
        clock = ManualClock()
        store = FakeStore(clock)
        store.put_app_now(app_record("a", [], serving=None))
        locks = Locks(store)
        async with locks.every_app():
            assert locks.app("a").locked()
        locks.registered("b")  # recorded by a registration: no read of the store needed
        locks.forgotten("a")
        async with locks.every_app():
            assert locks.app("b").locked() and not locks.app("a").locked()

    run(body, SCENARIO_LIMIT_S)
