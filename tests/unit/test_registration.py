"""Registering apps one by one and in batches, and the convergence pass, on the fakes."""

from __future__ import annotations

from typing import Any

import pytest

from controller.errors import InvalidBatchError
from controller.records import AppSpec, AppStatus
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


def cluster(memory_mb: float = 1000.0, auto_load: bool = False) -> Controller:
    return new_cluster(memory_mb=memory_mb, auto_load=auto_load)


def specs(count: int, **extra: Any) -> list[AppSpec]:
    return [AppSpec(app_id=f"app-{i:02d}", family="f", **extra) for i in range(count)]


def primaries(ctl: Controller) -> dict[str, tuple[str, str] | None]:
    return {a: r.home for a, r in ctl.store.all_apps().items()}


def test_a_batch_is_placed_as_the_same_apps_registered_one_by_one() -> None:
    # 4 servers of 1000 MB and 400 MB primaries: 8 fit, the 9th finds no room.
    async def one_by_one() -> Controller:
        ctl = cluster()
        for spec in specs(9):
            await ctl.orchestrator.register(spec)
        return ctl

    async def batch() -> Controller:
        ctl = cluster()
        writes = ctl.store.writes
        created = await ctl.orchestrator.register_many(specs(9))
        assert created == [True] * 9
        # One transaction for the records, one commit for every placement.
        assert ctl.store.writes - writes == 2
        return ctl

    sequential, batched = run(one_by_one), run(batch)
    assert primaries(batched) == primaries(sequential)
    placed = {a: home for a, home in primaries(batched).items() if home is not None}
    assert len(placed) == 8 and all(variant == LARGE for _, variant in placed.values())
    left_out = batched.store.app("app-08")
    assert left_out.status is AppStatus.UNAVAILABLE and "no live server" in left_out.reason
    # The new apps' loads are routine; the one that found no room waits for the next pass.
    assert sorted(e.app_id for e in batched.agents.commands("load")) == sorted(placed)
    assert not any(e.urgent for e in batched.agents.commands("load"))


def test_an_invalid_batch_names_every_bad_entry_and_records_nothing() -> None:
    async def body() -> tuple[Controller, InvalidBatchError]:
        ctl = cluster()
        bad = [AppSpec(app_id="ok", family="f"),
               AppSpec(app_id="who", family="nosuch"),
               AppSpec(app_id="ok", family="f"),
               AppSpec(app_id="pin", family="f", pinned_server="s99"),
               AppSpec(app_id="big", family="f", variant="f_nope")]
        with pytest.raises(InvalidBatchError) as refused:
            await ctl.orchestrator.register_many(bad)
        return ctl, refused.value

    ctl, error = run(body)
    assert ctl.store.all_apps() == {} and ctl.agents.commands("load") == []
    assert error.status == 422 and "4 of 5 apps are invalid" in str(error)
    assert [(e["field"], e["message"].split(";")[0]) for e in error.errors] == [
        ("body.apps.1", "unknown family 'nosuch'"),
        ("body.apps.2", "app 'ok' is also entry 0"),
        ("body.apps.3", "pinned server 's99' is unknown"),
        ("body.apps.4", "family 'f' has no variant 'f_nope'")]


def test_ids_already_registered_are_conflicts_and_the_others_are_created() -> None:
    async def body() -> tuple[Controller, list[bool]]:
        ctl = cluster()
        await ctl.orchestrator.register(AppSpec(app_id="app-01", family="f", critical=True))
        before = ctl.store.app("app-01")
        created = await ctl.orchestrator.register_many(specs(3))
        assert ctl.store.app("app-01") == before  # the registered one is left as it was
        return ctl, created

    ctl, created = run(body)
    assert created == [True, False, True]
    assert set(ctl.store.all_apps()) == {"app-00", "app-01", "app-02"}
    assert ctl.store.app("app-01").spec.critical


def test_the_convergence_pass_places_what_found_no_room_and_idles_while_nothing_changes(
) -> None:
    async def body() -> Controller:
        ctl = cluster(memory_mb=400.0, auto_load=True)  # one 400 MB primary per server
        await ctl.orchestrator.register_many(specs(6))
        await ctl.executor.idle()
        assert sum(home is None for home in primaries(ctl).values()) == 2
        revision = await ctl.orchestrator.converge_pass(None)
        writes = ctl.store.writes
        # Nothing changed: the pass reads nothing and decides nothing.
        assert await ctl.orchestrator.converge_pass(revision) == revision
        assert ctl.store.writes == writes
        # A deletion frees a server: the next pass places one app that was left out.
        await ctl.orchestrator.delete("app-00")
        await ctl.executor.idle()
        await ctl.orchestrator.converge_pass(revision)
        await ctl.executor.idle()
        return ctl

    ctl = run(body)
    homes = primaries(ctl)
    assert "app-00" not in homes and sum(home is None for home in homes.values()) == 1
    placed_late = next(a for a in ("app-04", "app-05") if homes[a] is not None)
    record = ctl.store.app(placed_late)
    assert record.status is AppStatus.SERVING and record.reason == ""
    assert [r.state for r in record.replicas] == [ModelState.READY]
    # It served nowhere and found no room before: its load ends an outage.
    assert [e.urgent for e in ctl.agents.commands("load") if e.app_id == placed_late] == [True]


def outage_cluster() -> Controller:
    """Four servers of 500 MB, each serving one 400 MB app; h1's 100 MB backup fills s2.

    ``o`` served before (its home is s1's large variant) and is left with nothing, as a
    failover that found no room leaves an app.
    """
    healthy = [app_record(f"h{i}", [replica(f"s{i}", LARGE)], serving=(f"s{i}", LARGE),
                          critical=i == 1) for i in range(1, 5)]
    healthy[0].replicas.append(replica("s2", SMALL, Role.WARM))
    down = app_record("o", [], serving=None, home=("s1", LARGE), critical=True,
                      status=AppStatus.UNAVAILABLE)
    down.reason = "no live server has room"
    return new_cluster([*healthy, down], memory_mb=500.0, auto_load=True)


def test_the_convergence_pass_recovers_an_app_in_an_outage_small_first() -> None:
    async def body() -> Controller:
        ctl = outage_cluster()
        await ctl.orchestrator.converge_pass(None)
        await ctl.executor.idle()
        return ctl

    ctl = run(body)
    record = ctl.store.app("o")
    # 100 MB free on s1, s3 and s4: its small variant serves (the large one fits nowhere)
    assert record.serving is not None and record.serving[1] == SMALL, record
    assert record.status is AppStatus.DEGRADED and record.home == ("s1", LARGE)
    loads = [c for c in ctl.agents.commands("load") if c.app_id == "o"]
    assert [(c.variant, c.urgent) for c in loads] == [(SMALL, True)]
    assert [r.role for r in ctl.store.app("h1").replicas] == [Role.PRIMARY, Role.WARM]


def test_the_convergence_pass_preempts_a_backup_for_an_app_in_an_outage() -> None:
    async def body() -> Controller:
        ctl = outage_cluster()
        for server_id in ("s1", "s3", "s4"):  # a 100 MB app fills each other server
            filler = app_record(f"x{server_id}", [replica(server_id, SMALL)],
                                serving=(server_id, SMALL), variant=SMALL)
            ctl.store.put_app_now(filler)
            ctl.agents.connect(server_id, [(filler.app_id, SMALL)])
        await ctl.orchestrator.converge_pass(None)
        await ctl.executor.idle()
        return ctl

    ctl = run(body)
    record = ctl.store.app("o")
    assert record.serving == ("s2", SMALL), record  # where h1's backup was
    assert [r.role for r in ctl.store.app("h1").replicas] == [Role.PRIMARY]
    assert [c.app_id for c in ctl.agents.commands("unload")] == ["h1"]


def test_an_app_in_an_outage_without_room_is_told_once_and_then_left_alone() -> None:
    async def body() -> tuple[Controller, int, int]:
        ctl = outage_cluster()
        ctl.orchestrator.config = ctl.orchestrator.config.model_copy(
            update={"preempt_warm": False})
        for server_id in ("s1", "s3", "s4"):
            filler = app_record(f"x{server_id}", [replica(server_id, SMALL)],
                                serving=(server_id, SMALL), variant=SMALL)
            ctl.store.put_app_now(filler)
        revision = await ctl.orchestrator.converge_pass(None)
        await ctl.executor.idle()
        writes = ctl.store.writes
        ctl.store.put_app_now(ctl.store.app("h3"))  # some unrelated write: another pass
        await ctl.orchestrator.converge_pass(revision)
        await ctl.executor.idle()
        return ctl, writes, ctl.store.writes

    ctl, writes_after_first, writes_after_second = run(body)
    record = ctl.store.app("o")
    assert record.serving is None and record.status is AppStatus.UNAVAILABLE
    assert record.reason and record.reason != "no live server has room"  # the planner's why
    assert ctl.sink.kinds("o") == [("unplaced", "o")]  # told once
    assert writes_after_second == writes_after_first  # the same verdict writes nothing
    assert not [c for c in ctl.agents.commands("load", "unload")]
