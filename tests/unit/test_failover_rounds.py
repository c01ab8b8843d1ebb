"""The failover's two halves: the switch (no planning lock, no snapshot) and shared cold rounds."""

from __future__ import annotations

import asyncio
from typing import Any

import controller.failover as failover_module
from controller.decide.failover import choose_warm_switches, decide_cold_batch
from controller.record_cache import RecordCache
from controller.records import AppStatus, ServerState
from policies.actions import FailoverPlan, ProgressiveRecovery, Unrecoverable, WarmSwitch
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    MEDIUM,
    SITES,
    SMALL,
    Controller,
    app_record,
    families,
    replica,
)
from tests.unit.controller_harness import new_cluster as harness_cluster
from tests.unit.scenario import run
from understudy.wire.protocol import ModelState


def new_cluster(apps: list[Any], *, auto_load: bool = True) -> Controller:
    return harness_cluster(apps, auto_load=auto_load)


# --- the switch decision ---------------------------------------------------------------------


def test_choose_warm_switches_prefers_accuracy_then_free_memory_then_server_id() -> None:
    apps = {
        "a": app_record("a", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM),
                              replica("s3", MEDIUM, Role.WARM)], serving=("s1", LARGE)),
        "b": app_record("b", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM),
                              replica("s4", SMALL, Role.WARM)], serving=("s1", LARGE)),
        "c": app_record("c", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM),
                              replica("s3", SMALL, Role.WARM)], serving=("s1", LARGE)),
        # not served from s1: untouched, although it has a replica there
        "d": app_record("d", [replica("s2", LARGE), replica("s1", SMALL, Role.WARM)],
                        serving=("s2", LARGE)),
        # its only backup is on a server that is down
        "e": app_record("e", [replica("s1", LARGE), replica("s4", SMALL, Role.WARM)],
                        serving=("s1", LARGE)),
    }
    free = {"s2": 500.0, "s3": 500.0, "s4": 900.0}

    def free_memory(server_id: str) -> float:
        return free[server_id]

    live = {"s2", "s3"} | {"s4"}
    switches = choose_warm_switches({k: v for k, v in apps.items() if k != "e"}, "s1", live,
                                    families(), free_memory, SITES)
    assert switches == (WarmSwitch("a", "s3", MEDIUM),   # more accurate
                        WarmSwitch("b", "s4", SMALL),    # same accuracy, more free memory
                        WarmSwitch("c", "s2", SMALL))    # full tie: smaller server id
    assert choose_warm_switches({"e": apps["e"]}, "s1", {"s2", "s3"}, families(),
                                free_memory, SITES) == ()


def test_choose_warm_switches_takes_a_loading_backup_but_not_one_being_unloaded() -> None:
    apps = {"a": app_record("a", [replica("s1", LARGE),
                                  replica("s2", SMALL, Role.WARM, ModelState.UNLOADING),
                                  replica("s3", SMALL, Role.WARM, ModelState.LOADING)],
                            serving=("s1", LARGE))}
    assert choose_warm_switches(apps, "s1", {"s2", "s3"}, families(), lambda _: 0.0,
                                SITES) == (
        WarmSwitch("a", "s3", SMALL),)


def test_decide_cold_batch_names_each_apps_own_failed_server() -> None:
    apps = {
        "p1": app_record("p1", [replica("s1", LARGE)], serving=("s1", LARGE)),
        "p2": app_record("p2", [replica("s2", LARGE)], serving=("s2", LARGE)),
        "w": app_record("w", [replica("s3", LARGE), replica("s2", SMALL, Role.WARM)],
                        serving=("s3", LARGE)),
    }
    plan = FailoverPlan(failed_servers=frozenset({"s1", "s2"}), warm_switches=(),
                        recoveries=(ProgressiveRecovery("p1", "s3", SMALL, LARGE),),
                        unrecoverable=(Unrecoverable("p2", "no room"),))
    decision = decide_cold_batch(apps, plan, {"s1": 10.0, "s2": 11.0},
                                 {"p1": "s1", "p2": "s2"}, families(), 12.0)
    assert {a: (r.failed_server, r.detected_at) for a, r in decision.recoveries.items()} == {
        "p1": ("s1", 10.0), "p2": ("s2", 11.0)}
    assert [x.app_id for x in decision.apps] == ["p1", "p2", "w"]
    # both failed servers' replicas are forgotten
    assert all(r.server_id not in ("s1", "s2") for a in apps.values() for r in a.replicas)
    assert apps["p2"].status is AppStatus.UNAVAILABLE


def test_decide_cold_batch_makes_the_plans_warm_switches_the_switch_missed() -> None:
    apps = {
        # switched by the switch: serving from its backup already
        "done": app_record("done", [replica("s2", SMALL)], serving=("s2", SMALL)),
        # its backup was written after the switch read it: still served from the failed server
        "late": app_record("late", [replica("s1", LARGE), replica("s3", SMALL, Role.WARM)],
                           serving=("s1", LARGE)),
    }
    plan = FailoverPlan(failed_servers=frozenset({"s1"}),
                        warm_switches=(WarmSwitch("done", "s2", SMALL),
                                       WarmSwitch("late", "s3", SMALL)),
                        recoveries=(), unrecoverable=())
    decision = decide_cold_batch(apps, plan, {"s1": 10.0}, {"late": "s1"}, families(), 12.0)
    assert apps["late"].serving == ("s3", SMALL)
    assert apps["late"].replicas[0].role is Role.PRIMARY  # the s1 replica is forgotten
    assert apps["done"].serving == ("s2", SMALL)
    assert [(e.kind, e.app_id, e.failed_server, e.failure_at) for e in decision.events] == [
        ("warm_switch", "late", "s1", 10.0)]
    assert set(decision.recoveries) == {"late"}
    assert [a.app_id for a in decision.apps] == ["late"]
    assert not any(stage.name == "switch" for stage in decision.stages)


def test_decide_cold_batch_skips_an_app_deleted_while_the_plan_was_made() -> None:
    plan = FailoverPlan(failed_servers=frozenset({"s1"}), warm_switches=(),
                        recoveries=(ProgressiveRecovery("gone", "s3", SMALL, LARGE),),
                        unrecoverable=())
    decision = decide_cold_batch({}, plan, {"s1": 1.0}, {}, families(), 2.0)
    assert decision.apps == ()


# --- the record cache's index ----------------------------------------------------------------


def test_the_record_cache_indexes_apps_by_server_through_writes_and_deletions() -> None:
    cache = RecordCache()
    a = app_record("a", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM)],
                   serving=("s1", LARGE))
    b = app_record("b", [replica("s2", LARGE)], serving=("s2", LARGE))
    cache.load({"a": a.model_dump_json(), "b": b.model_dump_json()}, {}, 1)
    assert (cache.apps_on("s1"), cache.apps_on("s2"), cache.apps_on("s9")) == (
        ["a"], ["a", "b"], [])
    a.replicas = [replica("s3", SMALL)]
    a.serving = ("s3", SMALL)
    assert cache.written(2, apps=[("a", a.model_dump_json())])
    assert (cache.apps_on("s1"), cache.apps_on("s2"), cache.apps_on("s3")) == (
        [], ["b"], ["a"])
    assert cache.written(3, deleted_apps=["b"])
    assert cache.apps_on("s2") == []
    cache.view()  # a view keeps the index up to date as well
    assert cache.apps_on("s3") == ["a"]


# --- the failover's halves -----------------------------------------------------------------


def two_server_apps() -> list[Any]:
    """s1 and s2 (one site) each serve a critical app backed up on s3, and an app without."""
    return [
        app_record("c1", [replica("s1", LARGE), replica("s3", SMALL, Role.WARM)],
                   serving=("s1", LARGE), critical=True),
        app_record("c2", [replica("s2", LARGE), replica("s3", SMALL, Role.WARM)],
                   serving=("s2", LARGE), critical=True),
        app_record("p1", [replica("s1", MEDIUM)], serving=("s1", MEDIUM), variant=MEDIUM),
        app_record("p2", [replica("s2", MEDIUM)], serving=("s2", MEDIUM), variant=MEDIUM),
    ]


def test_the_warm_switch_does_not_wait_for_the_planning_lock() -> None:
    async def body() -> None:
        ctl = new_cluster(two_server_apps())
        ctl.agents.disconnect("s1")
        async with ctl.executor.locks.plan:  # a warm re-plan solving, say
            failover = asyncio.ensure_future(
                ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time()))
            await ctl.agents.timeline.until(lambda: ("warm_switch", "c1") in ctl.sink.kinds())
            assert ctl.store.server("s1").state is ServerState.FAILED
            # the cold part waits for the lock
            assert not [c for c in ctl.agents.commands("load") if c.app_id == "p1"]
        await failover
        assert ctl.store.app("p1").serving is not None
        assert ctl.store.app("p1").serving[0] in ("s2", "s3", "s4")

    run(body)


def test_a_backup_written_after_the_switch_read_its_app_is_switched_to_in_the_cold_round(
        caplog: Any) -> None:
    # A warm re-plan commits app by app under each app's lock: it can write p1's first backup
    # just after the switch read p1 (no backup: not switched). The cold round's plan sees the
    # backup and counts p1 as switched; the round must make that switch, not drop p1.
    async def body() -> Controller:
        ctl = new_cluster(two_server_apps())
        ctl.agents.disconnect("s1")
        async with ctl.executor.locks.plan:
            failover = asyncio.ensure_future(
                ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time()))
            await ctl.agents.timeline.until(lambda: ("warm_switch", "c1") in ctl.sink.kinds())
            record = ctl.store.app("p1")
            assert record.serving == ("s1", MEDIUM)  # not switched: it had no backup
            record.put_replica(replica("s4", SMALL, Role.WARM))
            ctl.store.put_app_now(record)
            ctl.agents.connect("s4", [("p1", SMALL)])
        await failover
        return ctl

    caplog.set_level("INFO", logger="controller.failover")
    ctl = run(body)
    record = ctl.store.app("p1")
    assert record.serving == ("s4", SMALL), record
    assert record.status is AppStatus.DEGRADED
    assert ("warm_switch", "p1") in ctl.sink.kinds("p1")
    switch = next(e for e in ctl.sink.delivered if e.app_id == "p1" and e.kind == "warm_switch")
    assert switch.failed_server == "s1" and switch.endpoint is not None
    assert not [c for c in ctl.agents.commands("load") if c.app_id == "p1"]  # no cold load
    assert any("1 late warm switches (p1)" in r.getMessage() for r in caplog.records)


def test_servers_failing_together_share_one_cold_round(caplog: Any) -> None:
    async def body() -> Controller:
        ctl = new_cluster(two_server_apps())
        for server_id in ("s1", "s2"):
            ctl.agents.disconnect(server_id)
        async with ctl.executor.locks.plan:
            failovers = [asyncio.ensure_future(
                ctl.lifecycle.fail_server(s, "site down", ctl.clock.time())) for s in ("s1", "s2")]
            await ctl.agents.timeline.until(
                lambda: {("warm_switch", "c1"), ("warm_switch", "c2")} <= set(ctl.sink.kinds()))
        await asyncio.gather(*failovers)
        return ctl

    caplog.set_level("INFO", logger="controller.failover")
    ctl = run(body)
    rounds = [r.getMessage() for r in caplog.records if "planned in" in r.getMessage()]
    assert len(rounds) == 1 and "s1+s2 planned" in rounds[0], rounds
    for app_id in ("p1", "p2"):
        record = ctl.store.app(app_id)
        assert record.serving is not None and record.serving[0] in ("s3", "s4"), record
    assert all(i["kind"] != "failover" for i in ctl.store.intents_now())


def test_a_round_is_planned_again_when_a_target_server_fails_meanwhile() -> None:
    async def body() -> tuple[Controller, str]:
        ctl = new_cluster(two_server_apps())
        ctl.agents.disconnect("s1")
        policy = ctl.orchestrator.policy
        calls: list[frozenset[str]] = []
        lost: list[str] = []

        def failing_a_target() -> Any:
            real = policy()

            class Wrapped:
                def plan_failover(self, snapshot: Any, failed: Any) -> Any:
                    plan = real.plan_failover(snapshot, failed)
                    calls.append(frozenset(failed))
                    if len(calls) == 1:  # a target of this plan fails meanwhile
                        target = plan.recoveries[0].server_id
                        lost.append(target)
                        record = ctl.store.server(target)
                        record.state = ServerState.FAILED
                        ctl.store.put_server_now(record)
                    return plan

                def __getattr__(self, name: str) -> Any:
                    return getattr(real, name)
            return Wrapped()

        ctl.lifecycle.failovers.policy = failing_a_target
        await ctl.lifecycle.fail_server("s1", "heartbeats missed", ctl.clock.time())
        assert len(calls) >= 2
        return ctl, lost[0]

    ctl, lost = run(body)
    record = ctl.store.app("p1")
    assert record.serving is not None and record.serving[0] not in ("s1", lost), record


def test_failover_rounds_share_one_warm_replan() -> None:
    async def body() -> int:
        ctl = new_cluster(two_server_apps())
        replans = 0
        real = ctl.warm.replan

        async def counted() -> dict[str, Any]:
            nonlocal replans
            replans += 1
            return await real()

        ctl.warm.replan = counted  # type: ignore[method-assign]
        await asyncio.gather(ctl.warm.replan_soon(), ctl.warm.replan_soon())
        return replans

    assert run(body) == 1


def test_servers_declared_in_one_burst_switch_in_one_decision() -> None:
    async def body() -> Controller:
        ctl = new_cluster(two_server_apps())
        for server_id in ("s1", "s2"):
            ctl.agents.disconnect(server_id)
        now = ctl.clock.time()
        # The detector reports a site's declarations one after the other, synchronously.
        ctl.lifecycle.on_failure("s1", "site down", now, now - 0.1)
        ctl.lifecycle.on_failure("s2", "site down", now, now - 0.1)
        await ctl.agents.timeline.until(
            lambda: {("warm_switch", "c1"), ("warm_switch", "c2")} <= set(ctl.sink.kinds()))
        await ctl.executor.idle()
        return ctl

    ctl = run(body)
    failovers = [i for i in ctl.store.intents_written if i.get("kind") == "failover"]
    assert [i["server_ids"] for i in failovers] == [["s1", "s2"]]
    assert {ctl.store.server(s).state for s in ("s1", "s2")} == {ServerState.FAILED}
    # c1's backup is on s3, not on the other failing server: both switched there
    assert ctl.store.app("c1").serving == ("s3", SMALL)
    assert ctl.store.app("c2").serving == ("s3", SMALL)


def test_choose_warm_switches_skips_backups_the_replica_rules_no_longer_allow() -> None:
    sites = {"s1": "site-a", "s2": "site-a", "s3": "site-b"}
    above = app_record("above", [replica("s1", MEDIUM), replica("s2", LARGE, Role.WARM)],
                       serving=("s1", MEDIUM), variant=MEDIUM)
    allowed = app_record("allowed", [replica("s1", MEDIUM), replica("s2", LARGE, Role.WARM)],
                         serving=("s1", MEDIUM), variant=MEDIUM, allow_larger_backups=True)
    pinned = app_record("pinned", [replica("s1", LARGE), replica("s3", SMALL, Role.WARM)],
                        serving=("s1", LARGE), pinned_site="site-a")
    excluded = app_record("excluded", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM)],
                          serving=("s1", LARGE), excluded_servers=["s2"])
    apps = {a.app_id: a for a in (above, allowed, pinned, excluded)}
    switches = choose_warm_switches(apps, "s1", {"s2", "s3"}, families(), lambda _: 0.0, sites)
    assert switches == (WarmSwitch("allowed", "s2", LARGE),)


def test_a_server_taken_back_before_its_cold_round_is_not_planned_as_failed() -> None:
    async def body() -> Controller:
        ctl = new_cluster(two_server_apps())
        async with ctl.executor.locks.plan:  # the round waits; meanwhile s1 is taken back
            failover = asyncio.ensure_future(
                ctl.lifecycle.fail_server("s1", "heartbeats late", ctl.clock.time()))
            await ctl.agents.timeline.until(lambda: ("warm_switch", "c1") in ctl.sink.kinds())
            server = ctl.store.server("s1")
            server.state = ServerState.UP
            ctl.store.put_server_now(server)
        await failover
        return ctl

    ctl = run(body)
    assert ctl.store.app("p1").serving == ("s1", MEDIUM)  # not recovered away from s1
    assert not [c for c in ctl.agents.commands("load") if c.app_id == "p1"]


def test_a_burst_arriving_in_several_reads_still_switches_in_one_decision(
        monkeypatch: Any) -> None:
    # Gathering steps of 20 ms (2 ms in production) keep the test clear of timer jitter.
    monkeypatch.setattr(failover_module, "SWITCH_GATHER_S", 0.02)
    monkeypatch.setattr(failover_module, "SWITCH_GATHER_MAX_S", 0.2)

    async def body() -> Controller:
        ctl = new_cluster(two_server_apps())
        for server_id in ("s1", "s2", "s4"):
            ctl.agents.disconnect(server_id)
        now = ctl.clock.time()
        # The site's reports come in three reads, each within a gathering step of the last
        # but all of them over more than one step: the gathering has to go on.
        for server_id in ("s1", "s4", "s2"):
            ctl.lifecycle.on_failure(server_id, "site down", now, now - 0.1)
            await asyncio.sleep(0.012)
        await ctl.agents.timeline.until(
            lambda: {("warm_switch", "c1"), ("warm_switch", "c2")} <= set(ctl.sink.kinds()))
        await ctl.executor.idle()
        return ctl

    ctl = run(body)
    failovers = [i for i in ctl.store.intents_written if i.get("kind") == "failover"]
    assert [i["server_ids"] for i in failovers] == [["s1", "s4", "s2"]]


def test_an_urgent_mark_is_released_once_however_often_release_is_called() -> None:
    async def body() -> None:
        ctl = new_cluster(two_server_apps())
        ex = ctl.executor
        first, second = ex.hold_urgent(), ex.hold_urgent()
        first()
        first()  # a second release of the same mark changes nothing
        assert not ex.no_urgent_loads.is_set()
        second()
        assert ex.no_urgent_loads.is_set()

    run(body)
