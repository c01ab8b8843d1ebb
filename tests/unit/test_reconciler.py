"""The reconciler (issue 21, Build item 2): agents against records, degraded apps upgraded.

Two tiers: the pure decisions (``controller.decide.reconcile``) on hand-made records and
inventories, and the :class:`~controller.reconciler.Reconciler` on the controller's core
wired on fakes (``tests/unit/controller_harness.py``), ticked by hand.
"""

from __future__ import annotations

from typing import Any

from controller.decide.reconcile import (
    Discrepancy,
    Finding,
    decide_repairs,
    find_discrepancies,
)
from controller.reconciler import Reconciler
from controller.records import AppStatus, ServerState
from policies.actions import LoadVariant, RemoveStray, Stage, UnloadVariant
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    MEDIUM,
    SMALL,
    Controller,
    app_record,
    build_controller,
    replica,
    seed,
)
from tests.unit.fakes import FakeAgents, FakeStore, ManualClock, Timeline
from tests.unit.scenario import run
from understudy.wire.protocol import InventoryItem, ModelState, model_name

SCENARIO_LIMIT_S = 8.0
"""How long one scenario here may run before it fails rather than hangs."""


def item(app_id: str, variant: str, state: ModelState = ModelState.READY) -> InventoryItem:
    return InventoryItem(model_name=model_name(app_id, variant), app_id=app_id,
                         variant=variant, state=state)


# --- the pure decisions ----------------------------------------------------------------------


def test_each_kind_of_disagreement_is_found_and_agreement_is_not() -> None:
    record = app_record("p", [replica("s1", LARGE),
                              replica("s1", MEDIUM, Role.WARM, ModelState.LOADING),
                              replica("s1", SMALL, Role.INTERIM, ModelState.UNLOADING)],
                        serving=("s1", LARGE))
    other = app_record("q", [replica("s1", SMALL)], serving=("s1", SMALL))
    inventory = [item("q", SMALL), item("ghost", SMALL), item("late", MEDIUM, ModelState.LOADING)]
    found = find_discrepancies([record, other], "s1", inventory)
    assert found == {Finding(Discrepancy.MISSING, "s1", "p", LARGE),
                     Finding(Discrepancy.STALE_LOAD, "s1", "p", MEDIUM),
                     Finding(Discrepancy.FINISHED_UNLOAD, "s1", "p", SMALL),
                     Finding(Discrepancy.STRAY, "s1", "ghost", SMALL)}
    # A model the agent is still loading is in motion, not a stray.
    assert not any(f.app_id == "late" for f in found)
    # The agent holding an UNLOADING replica is stuck, unless something unloads it now.
    inventory = [item("p", LARGE), item("p", MEDIUM, ModelState.LOADING), item("p", SMALL)]
    assert find_discrepancies([record], "s1", inventory) == {
        Finding(Discrepancy.STUCK_UNLOAD, "s1", "p", SMALL)}
    assert find_discrepancies([record], "s1", inventory, {("s1", "p", SMALL)}) == set()


def test_nothing_in_flight_is_a_discrepancy() -> None:
    record = app_record("p", [replica("s1", LARGE, state=ModelState.LOADING)], serving=None)
    in_flight = {("s1", "p", LARGE), ("s1", "ghost", SMALL)}
    assert find_discrepancies([record], "s1", [item("ghost", SMALL)], in_flight) == set()


def test_repairs_skip_findings_that_no_longer_hold() -> None:
    record = app_record("p", [replica("s1", LARGE), replica("s1", SMALL, Role.WARM)],
                        serving=("s1", LARGE))
    confirmed = {Finding(Discrepancy.MISSING, "s1", "p", LARGE),
                 Finding(Discrepancy.MISSING, "s1", "p", SMALL),
                 Finding(Discrepancy.STRAY, "s1", "ghost", MEDIUM)}
    # Since the findings: the agent got SMALL back, and a record now wants ghost's model.
    ghost = app_record("ghost", [replica("s1", MEDIUM)], serving=("s1", MEDIUM))
    decision, repaired = decide_repairs({"p": record, "ghost": ghost}, "s1", confirmed,
                                        [item("p", SMALL), item("ghost", MEDIUM)])
    assert repaired == [Finding(Discrepancy.MISSING, "s1", "p", LARGE)]
    stages = {s.name: s for s in decision.stages}
    # It served the app: its reload ends an outage.
    assert stages["reload-urgent"].actions == (LoadVariant("s1", "p", LARGE, Role.PRIMARY),)
    assert not stages["strays"].actions and not stages["reload"].actions
    assert record.replica("s1", LARGE).state is ModelState.LOADING
    assert decision.notes and "loading it again" in decision.notes[0]


def test_repairs_unload_strays_and_stuck_unloads_and_forget_finished_ones() -> None:
    record = app_record("p", [replica("s1", LARGE),
                              replica("s1", SMALL, Role.WARM, ModelState.UNLOADING),
                              replica("s1", MEDIUM, Role.WARM, ModelState.UNLOADING)],
                        serving=("s1", LARGE))
    inventory = [item("p", LARGE), item("p", SMALL), item("ghost", SMALL)]
    confirmed = find_discrepancies([record], "s1", inventory)
    decision, repaired = decide_repairs({"p": record}, "s1", confirmed, inventory)
    assert {f.kind for f in repaired} == {Discrepancy.STRAY, Discrepancy.STUCK_UNLOAD,
                                          Discrepancy.FINISHED_UNLOAD}
    stages = {s.name: s.actions for s in decision.stages}
    assert stages["strays"] == (RemoveStray("s1", "ghost", SMALL),)
    assert stages["unload"] == (UnloadVariant("s1", "p", SMALL),)
    assert record.replica("s1", MEDIUM) is None
    assert decision.apps == (record,)


# --- the reconciler on the controller's core ------------------------------------------------


def cluster(apps: list[Any], servers: tuple[str, ...] = ("s1", "s2", "s3", "s4")
            ) -> tuple[Controller, Reconciler]:
    clock = ManualClock()
    timeline = Timeline()
    store = FakeStore(clock, timeline)
    agents = FakeAgents(timeline, auto_load=True)
    seed(store, agents, apps, servers=servers)
    ctl = build_controller(store, agents, clock)
    reconciler = Reconciler(ctl.executor, store, agents, ctl.orchestrator.families,
                            ctl.executor.metrics, busy=ctl.returns.reviving, period_s=1.0)
    return ctl, reconciler


async def ticks(ctl: Controller, reconciler: Reconciler, count: int) -> list[Finding]:
    repaired: list[Finding] = []
    for _ in range(count):
        repaired += await reconciler.tick(1.0)
        await ctl.executor.idle()
    return repaired


def repairs_counted(reconciler: Reconciler, kind: str) -> float:
    return reconciler.metrics.repairs.labels(kind)._value.get()


def test_a_stray_is_unloaded_once_two_checks_saw_it() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([app_record("p", [replica("s1", LARGE)],
                                              serving=("s1", LARGE))])
        ctl.agents.connect("s2", [("ghost", SMALL)])
        assert await ticks(ctl, reconciler, 1) == []
        assert ctl.agents.commands("unload") == []
        assert await ticks(ctl, reconciler, 1) == [Finding(Discrepancy.STRAY, "s2", "ghost",
                                                           SMALL)]
        assert ctl.agents.held("s2") == set()
        assert repairs_counted(reconciler, "stray") == 1
        # Converged: nothing more to repair, and p was never touched.
        assert await ticks(ctl, reconciler, 2) == []
        assert ctl.agents.held("s1") == {("p", LARGE)}
    run(body, SCENARIO_LIMIT_S)


def test_a_model_the_server_lost_is_loaded_again_and_serves() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([app_record("p", [replica("s1", LARGE)],
                                              serving=("s1", LARGE))])
        del ctl.agents.models["s1"][("p", LARGE)]  # e.g. Triton restarted, nobody told us
        repaired = await ticks(ctl, reconciler, 2)
        assert repaired == [Finding(Discrepancy.MISSING, "s1", "p", LARGE)]
        loads = ctl.agents.commands("load")
        assert [(e.server_id, e.variant) for e in loads] == [("s1", LARGE)]
        assert ctl.agents.held("s1") == {("p", LARGE)}
        record = ctl.store.app("p")
        assert record.replica("s1", LARGE).state is ModelState.READY
        assert record.serving == ("s1", LARGE)
    run(body, SCENARIO_LIMIT_S)


def test_a_load_left_recorded_loading_with_nothing_sending_it_is_sent_again() -> None:
    async def body() -> None:
        # A warm backup recorded LOADING whose load was deferred (its agent was briefly
        # unreachable) and never sent again, its agent connected all along.
        ctl, reconciler = cluster([app_record(
            "p", [replica("s1", LARGE), replica("s3", SMALL, Role.WARM, ModelState.LOADING)],
            serving=("s1", LARGE))])
        repaired = await ticks(ctl, reconciler, 2)
        assert repaired == [Finding(Discrepancy.STALE_LOAD, "s3", "p", SMALL)]
        assert ctl.agents.held("s3") == {("p", SMALL)}
        assert ctl.store.app("p").replica("s3", SMALL).state is ModelState.READY
    run(body, SCENARIO_LIMIT_S)


def test_a_load_under_way_is_left_alone() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([app_record("p", [replica("s1", LARGE)],
                                              serving=("s1", LARGE))])
        ctl.agents.auto_load = False
        record = ctl.store.app("p")
        record.put_replica(replica("s3", SMALL, Role.WARM, ModelState.LOADING))
        ctl.store.put_app_now(record)
        warm = Stage("warm", (LoadVariant("s3", "p", SMALL, Role.WARM),))
        ctl.executor.spawn(ctl.executor.run((warm,)), "warm load")
        await ctl.agents.wait_pending("load", "s3", "p", SMALL)
        for _ in range(3):
            assert await reconciler.tick(1.0) == []
        assert len(ctl.agents.commands("load")) == 1
        await ctl.agents.complete_load("s3", "p", SMALL)
        await ctl.executor.idle()
        assert await ticks(ctl, reconciler, 2) == []
    run(body, SCENARIO_LIMIT_S)


def test_a_server_being_revived_is_not_checked() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([app_record("p", [replica("s1", LARGE)],
                                              serving=("s1", LARGE))])
        ctl.agents.connect("s2", [("ghost", SMALL)])
        ctl.returns._reviving.add("s2")
        assert await ticks(ctl, reconciler, 3) == []
        ctl.returns._reviving.discard("s2")
        assert len(await ticks(ctl, reconciler, 2)) == 1
    run(body, SCENARIO_LIMIT_S)


def degraded(home: str = "s1", **spec: Any) -> Any:
    """p at home on ``home`` (LARGE), down; served by a SMALL on s2 since its failover."""
    return app_record("p", [replica("s2", SMALL)], serving=("s2", SMALL),
                      home=(home, LARGE), status=AppStatus.DEGRADED, **spec)


def fail(ctl: Controller, server_id: str) -> None:
    record = ctl.store.server(server_id)
    record.state = ServerState.FAILED
    ctl.store.put_server_now(record)
    ctl.agents.disconnect(server_id)


def test_a_degraded_app_whose_home_is_down_gets_the_best_target_that_fits() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([degraded()])
        fail(ctl, "s1")
        await ticks(ctl, reconciler, 1)
        record = ctl.store.app("p")
        # The home variant fits where the app serves: loaded there, it serves, SMALL retired.
        assert record.serving == ("s2", LARGE)
        assert [(r.server_id, r.variant, r.state) for r in record.replicas] == [
            ("s2", LARGE, ModelState.READY)]
        assert ctl.agents.held("s2") == {("p", LARGE)}
        assert repairs_counted(reconciler, "upgrade") == 1
        # Nothing more to do, and the next look costs no snapshot (records unchanged).
        assert not await reconciler.improve_degraded()
    run(body, SCENARIO_LIMIT_S)


def test_an_upgrade_honours_the_pin_and_the_room() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([degraded(pinned_site="site-a"),
                                   app_record("q", [replica("s2", LARGE), replica("s2", MEDIUM,
                                                                                 Role.WARM),
                                                    replica("s2", SMALL, Role.WARM)],
                                              serving=("s2", LARGE))])
        fail(ctl, "s1")
        # s2 (site-a, the only other server of the pin) has 1000 - 100 - 700 = 200 MB free:
        # MEDIUM fits, LARGE does not; s3 and s4 have room but are outside the pin.
        await ticks(ctl, reconciler, 1)
        record = ctl.store.app("p")
        assert record.serving == ("s2", MEDIUM)
        assert {r.server_id for r in record.replicas} == {"s2"}
    run(body, SCENARIO_LIMIT_S)


def test_no_upgrade_while_the_home_is_up_or_something_is_in_flight() -> None:
    async def body() -> None:
        ctl, reconciler = cluster([degraded()])
        assert not await reconciler.improve_degraded()  # home up: fail-back's business
        fail(ctl, "s1")
        release = ctl.executor.hold_urgent()
        assert not await reconciler.improve_degraded()  # a failover comes first
        release()
        assert await reconciler.improve_degraded()
        await ctl.executor.idle()
    run(body, SCENARIO_LIMIT_S)


def test_a_failed_server_still_serving_an_app_has_its_failover_resumed() -> None:
    async def body() -> None:
        # s1 recorded failed with p still served there, no failover running (a controller
        # that died between its declaration and the switch): the watchdog redoes it.
        ctl, _ = cluster([app_record("p", [replica("s1", LARGE)], serving=("s1", LARGE)),
                          app_record("q", [replica("s2", SMALL)], serving=("s2", SMALL))])
        fail(ctl, "s1")
        await ctl.lifecycle.watchdog_pass(failback=False)
        await ctl.executor.idle()
        record = ctl.store.app("p")
        assert record.serving is not None and record.serving[0] != "s1"
        assert record.serving_replica().state is ModelState.READY
        assert ctl.store.app("q").serving == ("s2", SMALL)
        # Nothing left on the failed server: the next pass resumes nothing.
        loads = len(ctl.agents.commands("load"))
        await ctl.lifecycle.watchdog_pass(failback=False)
        await ctl.executor.idle()
        assert len(ctl.agents.commands("load")) == loads
    run(body, SCENARIO_LIMIT_S)


def test_looking_for_upgrades_keeps_the_snapshot_cache_of_the_shared_records() -> None:
    async def body() -> None:
        from controller import snapshot as snapshots

        ctl, reconciler = cluster([degraded(), app_record("q", [replica("s3", SMALL)],
                                                          serving=("s3", SMALL))])
        fail(ctl, "s1")
        assert await reconciler.improve_degraded()
        await ctl.executor.idle()
        # The parts cached are those of the shared records a failover's snapshot is built
        # from (q's is unchanged since), not of private copies, which would make the next
        # failover rebuild every app's part.
        view = await ctl.store.view()
        assert snapshots._cache.parts["q"].record is view.apps["q"]
    run(body, SCENARIO_LIMIT_S)
