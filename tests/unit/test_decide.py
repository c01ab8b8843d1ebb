"""The controller's decision functions (``controller/decide``), tested like policies.

Records in, a ``Decision`` out: no store, no agents, no clock. Scenario tables for the
serving state machine, the two decisions of a failover, reconcile, fail-back and take-back;
hypothesis properties at the end.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.decide.apps import decide_warm_backups
from controller.decide.decision import Recovery
from controller.decide.failover import (
    FAILOVER,
    decide_cold_batch,
    decide_server_failed,
    forget_replicas_on,
)
from controller.decide.returns import (
    decide_fail_back,
    decide_fail_forward,
    decide_reconcile,
    decide_take_back,
)
from controller.decide.serving import decide_advance, next_serving
from controller.orchestrator import policy_for
from controller.records import (
    AppRecord,
    AppStatus,
    Replica,
    RuntimeConfig,
    ServerRecord,
    ServerState,
)
from controller.snapshot import build_snapshot
from policies.actions import (
    FailoverPlan,
    LoadVariant,
    ProgressiveRecovery,
    PromoteReplica,
    RemoveStray,
    UnloadVariant,
    Unrecoverable,
    WarmSwitch,
)
from policies.model import Placement, Role
from tests.unit.controller_harness import (
    LARGE,
    MEDIUM,
    SMALL,
    app_record,
    families,
    replica,
    server_record,
)
from understudy.wire.protocol import InventoryItem, ModelState

NOW = 5_000.0
FAMILIES = families()
P, W, IN, U = Role.PRIMARY, Role.WARM, Role.INTERIM, Role.UPGRADE
READY, LOADING, UNLOADING = ModelState.READY, ModelState.LOADING, ModelState.UNLOADING


def servers(*failed: str, memory_mb: float = 1000.0) -> dict[str, ServerRecord]:
    return {s: server_record(s, memory_mb, ServerState.FAILED if s in failed else ServerState.UP)
            for s in ("s1", "s2", "s3", "s4")}


def r(server_id: str, variant: str, role: Role = P,
      state: ModelState = READY) -> Replica:
    return replica(server_id, variant, role, state)


def app(replicas: list[Replica], serving: tuple[str, str] | None,
        home: tuple[str, str] | None = ("s1", LARGE), app_id: str = "a",
        **spec: Any) -> AppRecord:
    return app_record(app_id, replicas, serving=serving, home=home, **spec)


def keys(replicas: list[Replica]) -> list[tuple[str, str]]:
    return [x.key for x in replicas]


def item(app_id: str, variant: str, state: ModelState = ModelState.READY) -> InventoryItem:
    return InventoryItem(model_name=f"{app_id}__{variant}", app_id=app_id, variant=variant,
                         state=state)


# --- the serving state machine -------------------------------------------------------------

# (id, replicas, serving, home, live servers, kind, new serving, retired, status)
SERVING_TABLE = [
    ("interim ready, nothing serving: the interim serves",
     [r("s2", SMALL, IN), r("s2", LARGE, U, LOADING)], None, ("s1", LARGE), {"s2"},
     "interim_serving", ("s2", SMALL), [], AppStatus.DEGRADED),
    ("upgrade ready over the serving interim: upgraded, interim retired",
     [r("s2", SMALL, IN), r("s2", LARGE, U)], ("s2", SMALL), ("s1", LARGE), {"s2"},
     "upgraded", ("s2", LARGE), [("s2", SMALL)], AppStatus.SERVING),
    ("upgrade ready to a smaller variant than home: serving but degraded",
     [r("s2", SMALL, IN), r("s2", MEDIUM, U)], ("s2", SMALL), ("s1", LARGE), {"s2"},
     "upgraded", ("s2", MEDIUM), [("s2", SMALL)], AppStatus.DEGRADED),
    ("upgrade ready, nothing served yet: serving (the loading interim is left alone)",
     [r("s2", SMALL, IN, LOADING), r("s2", LARGE, U)], None, ("s1", LARGE), {"s2"},
     "serving", ("s2", LARGE), [], AppStatus.SERVING),
    ("a ready interim not serving is retired when an upgrade serves",
     [r("s1", LARGE, P), r("s3", SMALL, IN), r("s4", LARGE, U)], ("s1", LARGE), ("s4", LARGE),
     {"s3", "s4"}, "serving", ("s4", LARGE), [("s3", SMALL)], AppStatus.SERVING),
    ("home primary back after a warm switch: failback, the promoted backup retired",
     [r("s2", SMALL, P), r("s1", LARGE, U)], ("s2", SMALL), ("s1", LARGE), {"s1", "s2"},
     "failback", ("s1", LARGE), [("s2", SMALL)], AppStatus.SERVING),
    ("home primary back after a take-back: failback, the warm backup stays a backup",
     [r("s2", SMALL, W), r("s1", LARGE, U)], ("s2", SMALL), ("s1", LARGE), {"s1", "s2"},
     "failback", ("s1", LARGE), [], AppStatus.SERVING),
    ("a new primary ready, nothing served: serving",
     [r("s1", LARGE, P)], None, ("s1", LARGE), {"s1"},
     "serving", ("s1", LARGE), [], AppStatus.SERVING),
    ("a primary serving and another primary ready: no switch",
     [r("s1", LARGE, P), r("s2", LARGE, P)], ("s1", LARGE), ("s1", LARGE), {"s1", "s2"},
     "", ("s1", LARGE), [], AppStatus.SERVING),
    ("a primary serving and an interim ready: the interim waits",
     [r("s1", LARGE, P), r("s2", SMALL, IN)], ("s1", LARGE), ("s1", LARGE), {"s1", "s2"},
     "", ("s1", LARGE), [], AppStatus.SERVING),
    ("the serving replica's server failed: a ready interim serves",
     [r("s1", LARGE, P), r("s2", SMALL, IN)], ("s1", LARGE), ("s1", LARGE), {"s2"},
     "interim_serving", ("s2", SMALL), [], AppStatus.DEGRADED),
    ("the serving replica is unloading: a ready interim serves",
     [r("s1", LARGE, P, UNLOADING), r("s2", SMALL, IN)], ("s1", LARGE), ("s1", LARGE),
     {"s1", "s2"}, "interim_serving", ("s2", SMALL), [], AppStatus.DEGRADED),
    ("a ready upgrade on a failed server is never chosen",
     [r("s1", LARGE, U)], None, ("s1", LARGE), {"s2"},
     "", None, [], AppStatus.UNAVAILABLE),
    ("only loading replicas: recovering",
     [r("s2", SMALL, IN, LOADING)], None, ("s1", LARGE), {"s2"},
     "", None, [], AppStatus.RECOVERING),
    ("nothing at all: unavailable",
     [], None, ("s1", LARGE), {"s1", "s2"}, "", None, [], AppStatus.UNAVAILABLE),
    ("a warm backup alone never serves",
     [r("s2", SMALL, W)], None, ("s1", LARGE), {"s2"},
     "", None, [], AppStatus.UNAVAILABLE),
    ("an upgrade smaller than the primary serving, not home: retired, never promoted",
     [r("s2", LARGE, P), r("s3", SMALL, U)], ("s2", LARGE), ("s1", LARGE), {"s2", "s3"},
     "", ("s2", LARGE), [("s3", SMALL)], AppStatus.SERVING),
    ("of two ready upgrades the more accurate serves",
     [r("s2", SMALL, IN), r("s3", MEDIUM, U), r("s4", LARGE, U)], ("s2", SMALL), ("s1", LARGE),
     {"s2", "s3", "s4"}, "upgraded", ("s4", LARGE), [("s2", SMALL)], AppStatus.SERVING),
]


@pytest.mark.parametrize(
    ("replicas", "serving", "home", "live", "kind", "now_serving", "retired", "status"),
    [row[1:] for row in SERVING_TABLE], ids=[row[0] for row in SERVING_TABLE])
def test_next_serving_and_decide_advance(replicas: list[Replica],
                                         serving: tuple[str, str] | None,
                                         home: tuple[str, str], live: set[str], kind: str,
                                         now_serving: tuple[str, str] | None,
                                         retired: list[tuple[str, str]],
                                         status: AppStatus) -> None:
    record = app([x.model_copy() for x in replicas], serving, home)
    got_kind, current, got_retired = next_serving(record, live)
    assert got_kind == kind
    assert (current.key if current else None) == now_serving
    assert keys(got_retired) == retired
    if kind:
        assert record.serving == now_serving and current is not None
        assert current.role is (IN if kind == "interim_serving" else P)

    # decide_advance: the same step, as one decision with its event and retire stage.
    record = app([x.model_copy() for x in replicas], serving, home)
    down = {s for s in ("s1", "s2", "s3", "s4") if s not in live}
    decision = decide_advance(record, servers(*down), NOW, None)
    assert decision is not None
    assert record.status is status
    assert [(e.kind, e.server_id, e.variant) for e in decision.events] == (
        [(kind, *now_serving)] if kind and now_serving else [])
    assert [(a.server_id, a.variant) for s in decision.stages for a in s.actions] == retired
    assert all(record.replica(*k).state is UNLOADING for k in retired)
    assert decision.serving_moved == bool(kind)
    assert decision.apps == (record,)


def test_a_finished_load_is_marked_ready_and_its_event_carries_the_load_time() -> None:
    record = app([r("s2", SMALL, IN, LOADING), r("s2", LARGE, U, LOADING)], None)
    recovery = Recovery(NOW - 2.0, "s1")
    decision = decide_advance(record, servers("s1"), NOW, recovery,
                              loaded=("s2", SMALL, 0.25))
    assert decision is not None
    loaded = record.replica("s2", SMALL)
    assert (loaded.state, loaded.since, loaded.load_s) == (READY, NOW, 0.25)
    (event,) = decision.events
    assert (event.kind, event.load_s, event.failed_server, event.failure_at, event.time) == (
        "interim_serving", 0.25, "s1", NOW - 2.0, NOW)
    assert event.endpoint == {"http": "http://s2:8000", "grpc": "s2:8001"}
    assert event.model_name == "a__" + SMALL
    assert record.status is AppStatus.DEGRADED


def test_an_interim_whose_load_ends_after_the_target_took_over_is_retired() -> None:
    record = app([r("s2", LARGE, P), r("s3", SMALL, IN, LOADING)], ("s2", LARGE))
    decision = decide_advance(record, servers("s1"), NOW, None, loaded=("s3", SMALL, 0.1))
    assert decision is not None and decision.events == ()
    assert record.serving == ("s2", LARGE)
    assert record.replica("s3", SMALL).state is UNLOADING
    assert [a for s in decision.stages for a in s.actions] == [UnloadVariant("s3", "a", SMALL)]


@pytest.mark.parametrize("state", [UNLOADING, READY, None])
def test_a_finished_load_no_longer_wanted_gives_no_decision(state: ModelState | None) -> None:
    replicas = [r("s1", LARGE)] + ([r("s2", SMALL, IN, state)] if state else [])
    record = app(replicas, ("s1", LARGE))
    before = record.model_copy(deep=True)
    assert decide_advance(record, servers(), NOW, None, loaded=("s2", SMALL, 0.1)) is None
    assert record == before


def test_a_finished_warm_backup_load_announces_backup_ready() -> None:
    record = app([r("s1", LARGE), r("s2", SMALL, W, LOADING)], ("s1", LARGE))
    decision = decide_advance(record, servers(), NOW, None, loaded=("s2", SMALL, 0.1))
    assert decision is not None
    assert [(e.kind, e.role, e.load_s) for e in decision.events] == [("backup_ready", "warm",
                                                                     None)]
    assert not decision.serving_moved and record.serving == ("s1", LARGE)


# --- a server fails: the warm switches ------------------------------------------------------


def test_decide_server_failed_marks_the_server_and_switches_to_live_backups() -> None:
    apps = {
        "a": app([r("s1", LARGE), r("s2", SMALL, W)], ("s1", LARGE), app_id="a"),
        "b": app([r("s1", LARGE), r("s3", LARGE, W)], ("s1", LARGE), app_id="b"),
        "c": app([r("s1", LARGE)], ("s1", LARGE), app_id="c"),
    }
    records = servers()
    switches = (WarmSwitch("a", "s2", SMALL), WarmSwitch("b", "s3", LARGE),
                WarmSwitch("c", "s4", SMALL))  # c has no such replica: skipped
    decision = decide_server_failed(apps, records, "s1", "heartbeats missed", NOW - 1.0,
                                    False, switches, NOW)
    s1 = records["s1"]
    assert (s1.state, s1.failed_at, s1.failure_reason, s1.connected) == (
        ServerState.FAILED, NOW - 1.0, "heartbeats missed", False)
    assert decision.servers == (s1,)
    assert [x.app_id for x in decision.apps] == ["a", "b"]
    assert (apps["a"].serving, apps["a"].status) == (("s2", SMALL), AppStatus.DEGRADED)
    assert (apps["b"].serving, apps["b"].status) == (("s3", LARGE), AppStatus.SERVING)
    assert apps["a"].replica("s2", SMALL).role is P
    assert apps["c"].serving == ("s1", LARGE)  # left to the cold decision
    assert [(e.kind, e.app_id, e.server_id, e.failed_server, e.failure_at, e.reason)
            for e in decision.events] == [
        ("warm_switch", "a", "s2", "s1", NOW - 1.0, "server s1 failed"),
        ("warm_switch", "b", "s3", "s1", NOW - 1.0, "server s1 failed")]
    assert decision.intent == {"kind": FAILOVER, "server_id": "s1",
                               "reason": "heartbeats missed"}
    assert decision.recoveries == {"a": Recovery(NOW - 1.0, "s1", notified=True),
                                   "b": Recovery(NOW - 1.0, "s1", notified=True)}
    assert decision.stages == ()  # a warm switch needs no agent command


# --- a server fails: the cold part ----------------------------------------------------------


def cold_apps() -> dict[str, AppRecord]:
    return {
        "p1": app([r("s1", LARGE)], ("s1", LARGE), app_id="p1"),
        "p2": app([r("s1", MEDIUM)], ("s1", MEDIUM), home=("s1", MEDIUM), app_id="p2"),
        "p3": app([r("s1", LARGE), r("s1", SMALL, W, LOADING)], ("s1", LARGE), app_id="p3"),
        "q": app([r("s2", LARGE), r("s4", SMALL, W)], ("s2", LARGE), home=("s2", LARGE),
                 app_id="q"),
        "calm": app([r("s3", LARGE)], ("s3", LARGE), home=("s3", LARGE), app_id="calm"),
    }


def cold_plan() -> FailoverPlan:
    return FailoverPlan(
        failed_servers=frozenset({"s1"}), warm_switches=(),
        recoveries=(ProgressiveRecovery("p1", "s2", SMALL, LARGE),
                    ProgressiveRecovery("p2", "s3", MEDIUM, MEDIUM)),
        unrecoverable=(Unrecoverable("p3", "no server has room"),),
        preempted=(Placement("q", "s4", SMALL, Role.WARM),))


def test_decide_cold_applies_the_plan_to_the_records() -> None:
    apps = cold_apps()
    plan = cold_plan()
    decision = decide_cold_batch(apps, plan, {"s1": NOW - 1.0}, {}, FAMILIES, NOW)
    # the plan's stages but the warm switches, which decide_server_failed applied as records
    assert decision.stages == tuple(s for s in plan.stages() if s.name != "switch")
    assert [x.app_id for x in decision.apps] == ["p1", "p2", "p3", "q"]
    p1, p2, p3 = apps["p1"], apps["p2"], apps["p3"]
    assert [(x.server_id, x.variant, x.role, x.state, x.accuracy) for x in p1.replicas] == [
        ("s2", SMALL, IN, LOADING, 0.6), ("s2", LARGE, U, LOADING, 1.0)]
    assert (p1.serving, p1.status, p1.home) == (None, AppStatus.RECOVERING, ("s1", LARGE))
    # interim == target: one load, which is the final replica.
    assert [(x.server_id, x.variant, x.role) for x in p2.replicas] == [("s3", MEDIUM, U)]
    # unrecoverable: told so, and the failed server's replicas forgotten (home kept).
    assert (p3.replicas, p3.serving, p3.status, p3.reason) == (
        [], None, AppStatus.UNAVAILABLE, "no server has room")
    assert [(e.kind, e.app_id, e.reason, e.failed_server, e.server_id) for e in decision.events
            ] == [("unrecoverable", "p3", "no server has room", "s1", None)]
    assert apps["q"].replica("s4", SMALL).state is UNLOADING
    assert apps["calm"].replicas == [r("s3", LARGE)]
    assert set(decision.recoveries) == {"p1", "p2", "p3"}
    assert all(not x.notified and x.failed_server == "s1" for x in decision.recoveries.values())


def test_decide_cold_with_the_real_policy_keeps_its_stages() -> None:
    apps = cold_apps()
    records = servers()
    snapshot = build_snapshot(FAMILIES, records, apps)
    plan = policy_for(RuntimeConfig()).plan_failover(snapshot, ["s1"])
    decision = decide_cold_batch(apps, plan, {"s1": NOW}, {}, FAMILIES, NOW)
    # the plan's stages but the warm switches, which decide_server_failed applied as records
    assert decision.stages == tuple(s for s in plan.stages() if s.name != "switch")
    assert {x.app_id for x in plan.recoveries} == {"p1", "p2", "p3"}
    assert all(x.server_id != "s1" for a in apps.values() for x in a.replicas)
    interims = [a for s in decision.stages if s.name == "interim" for a in s.actions
                if isinstance(a, LoadVariant)]
    assert [a.variant for a in interims] == [SMALL] * 3


def test_forget_replicas_on_drops_the_server_and_keeps_home() -> None:
    apps = {"a": app([r("s1", LARGE), r("s2", SMALL, W)], ("s1", LARGE)),
            "b": app([r("s3", LARGE)], ("s3", LARGE), home=("s3", LARGE), app_id="b")}
    assert forget_replicas_on("s1", apps) == {"a"}
    assert (keys(apps["a"].replicas), apps["a"].serving, apps["a"].home) == (
        [("s2", SMALL)], None, ("s1", LARGE))
    # nothing the plan did serves it: its record says so (the convergence pass places it)
    assert (apps["a"].status, apps["a"].reason) == (AppStatus.UNAVAILABLE, "server s1 failed")
    assert keys(apps["b"].replicas) == [("s3", LARGE)]


def test_decide_cold_never_leaves_two_replicas_with_one_key() -> None:
    dropped = r("s2", SMALL, W, UNLOADING)  # a backup being unloaded when s1 failed
    apps = {"p1": app([r("s1", LARGE), dropped], ("s1", LARGE), app_id="p1")}
    plan = FailoverPlan(failed_servers=frozenset({"s1"}), warm_switches=(),
                        recoveries=(ProgressiveRecovery("p1", "s2", SMALL, LARGE),),
                        unrecoverable=())
    decide_cold_batch(apps, plan, {"s1": NOW}, {}, FAMILIES, NOW)
    assert len(keys(apps["p1"].replicas)) == len(set(keys(apps["p1"].replicas)))
    # And the interim's load, once done, makes it serve.
    decision = decide_advance(apps["p1"], servers("s1"), NOW, None, loaded=("s2", SMALL, 0.1))
    assert decision is not None and apps["p1"].serving == ("s2", SMALL)


# --- reconcile -----------------------------------------------------------------------------

# (id, replica on s1, what else serves, held by the agent, stage, action)
RECONCILE_TABLE = [
    ("held and ready: nothing to do", r("s1", LARGE), None, True, None, None),
    ("serving but not held: urgent reload", r("s1", LARGE), None, False, "reload-urgent",
     LoadVariant("s1", "a", LARGE, Role.PRIMARY)),
    ("a backup not held, app served elsewhere: routine reload", r("s1", SMALL, W),
     ("s2", LARGE), False, "reload", LoadVariant("s1", "a", SMALL, Role.WARM)),
    ("still loading, app served elsewhere: routine reload (even if held)",
     r("s1", MEDIUM, U, LOADING), ("s2", LARGE), True, "reload",
     LoadVariant("s1", "a", MEDIUM, Role.UPGRADE)),
    ("still loading, nothing serves: urgent reload", r("s1", SMALL, IN, LOADING), None, False,
     "reload-urgent", LoadVariant("s1", "a", SMALL, Role.INTERIM)),
    ("unloading and not held: unload again", r("s1", SMALL, W, UNLOADING), ("s2", LARGE),
     False, "unload", UnloadVariant("s1", "a", SMALL)),
]


@pytest.mark.parametrize(("mine", "elsewhere", "held", "stage", "action"),
                         [row[1:] for row in RECONCILE_TABLE],
                         ids=[row[0] for row in RECONCILE_TABLE])
def test_decide_reconcile(mine: Replica, elsewhere: tuple[str, str] | None, held: bool,
                          stage: str | None, action: Any) -> None:
    replicas = [mine.model_copy()] + ([r(*elsewhere)] if elsewhere else [])
    serving = elsewhere if elsewhere else (mine.key if mine.role is P else None)
    record = app(replicas, serving)
    inventory = [item("a", mine.variant)] if held else []
    decision = decide_reconcile({"a": record}, "s1", inventory)
    by_stage = {s.name: list(s.actions) for s in decision.stages}
    assert list(by_stage) == ["unload", "strays", "reload-urgent", "reload"]
    expected = {name: ([action] if name == stage else []) for name in by_stage}
    assert by_stage == expected
    if stage and stage.startswith("reload"):
        assert record.replica("s1", mine.variant).state is LOADING
        assert decision.apps == (record,)
    else:
        assert decision.apps == ()
    assert next(s for s in decision.stages if s.name == "reload-urgent").urgent


def test_decide_reconcile_removes_what_no_record_wants_on_that_server() -> None:
    apps = {"a": app([r("s1", LARGE)], ("s1", LARGE)),
            "b": app([r("s2", SMALL)], ("s2", SMALL), home=("s2", SMALL), app_id="b")}
    inventory = [item("a", LARGE), item("a", SMALL), item("b", SMALL),
                 item("ghost", MEDIUM, ModelState.LOADING)]
    decision = decide_reconcile(apps, "s1", inventory)
    strays = next(s for s in decision.stages if s.name == "strays").actions
    assert strays == (RemoveStray("s1", "a", SMALL), RemoveStray("s1", "b", SMALL),
                      RemoveStray("s1", "ghost", MEDIUM))
    assert len(decision.notes) == 3 and decision.apps == ()


def test_decide_reconcile_sends_one_command_per_held_model() -> None:
    record = app([r("s1", SMALL, W, UNLOADING), r("s2", LARGE)], ("s2", LARGE))
    decision = decide_reconcile({"a": record}, "s1", [item("a", SMALL)])
    actions = [a for s in decision.stages for a in s.actions]
    assert actions == [UnloadVariant("s1", "a", SMALL)]


# --- fail-back -----------------------------------------------------------------------------


def failback_apps(*backups: tuple[str, str]) -> dict[str, AppRecord]:
    """p1 serves on s3, home s1 (400 MB); q serves on s1 (400 MB) and each backup is a
    separate critical app (its primary small on s2) with a WARM replica ``(server, variant)``."""
    apps = {"p1": app([r("s3", LARGE)], ("s3", LARGE), app_id="p1"),
            "q": app([r("s1", LARGE)], ("s1", LARGE), app_id="q")}
    for n, (server_id, variant) in enumerate(backups):
        app_id = f"w{n}"
        apps[app_id] = app([r("s2", SMALL), r(server_id, variant, W)], ("s2", SMALL),
                           home=("s2", SMALL), app_id=app_id, critical=True)
    return apps


# (id, backups, evicted apps); s1 has 600 MB left beside q, before the backups
FAILBACK_TABLE = [
    ("room at home: no eviction", [("s1", SMALL)], []),
    ("one backup in the way: only it is evicted", [("s1", MEDIUM), ("s1", MEDIUM)], ["w0"]),
    ("one is not enough: two evicted, the third stays",
     [("s1", SMALL), ("s1", SMALL), ("s1", MEDIUM)], ["w0", "w1"]),
    ("backups elsewhere do not count", [("s3", MEDIUM), ("s1", SMALL)], []),
]


@pytest.mark.parametrize(("backups", "evicted"), [row[1:] for row in FAILBACK_TABLE],
                         ids=[row[0] for row in FAILBACK_TABLE])
def test_decide_fail_back(backups: list[tuple[str, str]], evicted: list[str]) -> None:
    apps = failback_apps(*backups)
    snapshot = build_snapshot(FAMILIES, servers(memory_mb=1000.0), apps)
    decision = decide_fail_back(apps, snapshot, "p1", FAMILIES)
    assert decision is not None
    reclaim, load = decision.stages
    assert (reclaim.name, load.name, load.after) == ("reclaim", "failback", ("reclaim",))
    assert [a.app_id for a in reclaim.actions] == evicted
    assert all(isinstance(a, UnloadVariant) and a.server_id == "s1" for a in reclaim.actions)
    assert load.actions == (LoadVariant("s1", "p1", LARGE, Role.UPGRADE),)
    assert [x.app_id for x in decision.apps] == sorted(["p1", *evicted])
    for app_id in evicted:
        assert [x.state for x in apps[app_id].replicas if x.server_id == "s1"] == [UNLOADING]
    added = apps["p1"].replica("s1", LARGE)
    assert added is not None and (added.role, added.state) == (U, LOADING)


def test_no_fail_back_when_even_evicting_every_backup_leaves_no_room() -> None:
    apps = failback_apps(("s1", SMALL))
    apps["q2"] = app([r("s1", LARGE)], ("s1", LARGE), app_id="q2")  # 900 of 1000 MB used
    snapshot = build_snapshot(FAMILIES, servers(), apps)
    assert decide_fail_back(apps, snapshot, "p1", FAMILIES) is None
    assert apps["w0"].replica("s1", SMALL).state is READY


@pytest.mark.parametrize("case", ["no home", "home server failed", "already there",
                                  "unknown app"])
def test_no_fail_back(case: str) -> None:
    apps = failback_apps()
    down: tuple[str, ...] = ()
    app_id = "p1"
    if case == "no home":
        apps["p1"].home = None
    elif case == "home server failed":
        down = ("s1",)
    elif case == "already there":
        apps["p1"].replicas.append(r("s1", LARGE, U, LOADING))
    else:
        app_id = "nobody"
    snapshot = build_snapshot(FAMILIES, servers(*down), apps)
    assert decide_fail_back(apps, snapshot, app_id, FAMILIES) is None


# --- take-back -----------------------------------------------------------------------------


def test_decide_take_back_adopts_held_models_and_retires_the_recovery() -> None:
    apps = {
        "a": app([r("s2", SMALL, P)], ("s2", SMALL), app_id="a"),  # warm-switched
        "b": app([r("s3", SMALL, IN), r("s4", SMALL, IN), r("s3", LARGE, U, LOADING)],
                 ("s3", SMALL), app_id="b"),
        "c": app([r("s2", LARGE)], ("s2", LARGE), home=("s4", LARGE), app_id="c"),
    }
    revived = servers("s1")["s1"]
    revived.state = ServerState.UP
    inventory = [item("a", LARGE), item("b", LARGE), item("c", MEDIUM),
                 item("d", SMALL), item("b", SMALL, ModelState.LOADING)]
    decision = decide_take_back(apps, "s1", inventory, FAMILIES, revived)
    assert decision.servers == (revived,)
    adopt, retire = decision.stages
    assert adopt.actions == (PromoteReplica("a", "s1", LARGE), PromoteReplica("b", "s1", LARGE))
    assert retire.actions == (UnloadVariant("s4", "b", SMALL),)  # the ready, idle interim
    assert [x.app_id for x in decision.apps] == ["a", "b", "c"]
    assert apps["a"].replica("s2", SMALL).role is W  # a promoted backup is a backup again
    assert apps["b"].replica("s3", LARGE).state is UNLOADING  # unloaded when its load ends
    held = apps["c"].replica("s1", MEDIUM)
    assert held is not None and (held.role, held.state) == (W, READY)
    assert all(x.server_id != "s1" for x in apps["b"].replicas if x.variant == SMALL)


def test_decide_take_back_of_a_server_that_holds_nothing_changes_nothing() -> None:
    apps = {"a": app([r("s2", SMALL, P)], ("s2", SMALL))}
    decision = decide_take_back(apps, "s1", [], FAMILIES)
    assert decision.apps == () and decision.servers == () and decision.notes == ()
    assert [s.actions for s in decision.stages] == [(), ()]


# --- fail-forward ----------------------------------------------------------------------------


def forward(apps: dict[str, AppRecord], memory_mb: float = 1000.0, down: tuple[str, ...] = ("s1",)
            ) -> Any:
    snapshot = build_snapshot(FAMILIES, servers(*down, memory_mb=memory_mb), apps)
    return decide_fail_forward(apps, snapshot, "s2", FAMILIES)


def test_fail_forward_loads_the_home_variant_where_an_app_was_left_on_its_interim() -> None:
    apps = {"a": app([r("s2", SMALL, IN)], ("s2", SMALL))}  # home s1/large is down
    decision = forward(apps)
    assert decision is not None
    assert [a for s in decision.stages for a in s.actions] == [
        LoadVariant("s2", "a", LARGE, U)]
    added = apps["a"].replica("s2", LARGE)
    assert added is not None and (added.role, added.state) == (U, LOADING)
    assert decision.apps == (apps["a"],)


def test_fail_forward_takes_the_best_variant_that_fits_and_demotes_a_smaller_loading_one(
        ) -> None:
    apps = {"a": app([r("s2", SMALL, U, LOADING)], None)}
    decision = forward(apps, memory_mb=450.0)  # 350 MB free beside the small one
    assert decision is not None
    assert [a for s in decision.stages for a in s.actions] == [
        LoadVariant("s2", "a", MEDIUM, U)]
    assert apps["a"].replica("s2", SMALL).role is IN  # never over the medium one


@pytest.mark.parametrize("case", ["home up", "on its home variant", "better elsewhere",
                                  "pinned elsewhere", "no room"])
def test_no_fail_forward(case: str) -> None:
    replicas, spec, memory, down = [r("s2", SMALL, IN)], {}, 1000.0, ("s1",)
    if case == "home up":
        down = ()
    elif case == "on its home variant":
        replicas = [r("s2", LARGE, IN)]
    elif case == "better elsewhere":
        replicas.append(r("s3", LARGE, U, LOADING))
    elif case == "pinned elsewhere":
        spec = {"pinned_site": "site-b"}
    else:
        memory = 450.0
    apps = {"a": app(replicas, ("s2", replicas[0].variant), **spec)}
    if case == "no room":  # 150 MB free: not even the medium variant fits
        apps["b"] = app([r("s2", MEDIUM, W), r("s3", LARGE)], ("s3", LARGE), ("s3", LARGE),
                        app_id="b")
    assert forward(apps, memory, down) is None


# --- properties ----------------------------------------------------------------------------

SERVERS = ("s1", "s2", "s3", "s4")
VARIANTS = (SMALL, MEDIUM, LARGE)


@st.composite
def records(draw: st.DrawFn) -> AppRecord:
    """An app with replicas of unique (server, variant), any roles and states."""
    slots = draw(st.lists(st.tuples(st.sampled_from(SERVERS), st.sampled_from(VARIANTS)),
                          unique=True, max_size=6))
    replicas = [r(s, v, draw(st.sampled_from(list(Role))),
                  draw(st.sampled_from(list(ModelState)))) for s, v in slots]
    serving = draw(st.sampled_from([None, *slots]))
    home = draw(st.sampled_from([None, *[(s, v) for s in SERVERS for v in VARIANTS]]))
    return app(replicas, serving, home)


@settings(max_examples=300, deadline=None)
@given(record=records(), live=st.sets(st.sampled_from(SERVERS)))
def test_next_serving_only_picks_a_ready_replica_on_a_live_server(record: AppRecord,
                                                                  live: set[str]) -> None:
    kind, current, retired = next_serving(record, live)
    if current is not None:
        assert current.state is READY and current.server_id in live
        assert current not in retired
        assert record.serving == current.key
    if kind:
        assert current is not None and record.serving_replica() is current
    for old in retired:
        assert old.role is not W and old.state is READY
    assert kind in ("", "serving", "interim_serving", "upgraded", "failback")


@settings(max_examples=300, deadline=None)
@given(record=records(), live=st.sets(st.sampled_from(SERVERS)), data=st.data())
def test_decide_advance_keeps_one_replica_per_key_and_a_status_that_matches(
        record: AppRecord, live: set[str], data: st.DataObject) -> None:
    loading = [x.key for x in record.replicas if x.state is LOADING]
    loaded = data.draw(st.sampled_from([None, *loading]))
    down = [s for s in SERVERS if s not in live]
    decision = decide_advance(record, servers(*down), NOW, None,
                              loaded=(*loaded, 0.1) if loaded else None)
    assert decision is not None
    assert len(set(keys(record.replicas))) == len(record.replicas)
    serving = record.serving_replica()
    if record.status in (AppStatus.SERVING, AppStatus.DEGRADED):
        assert serving is not None and serving.state is READY and serving.server_id in live
    assert len(decision.events) <= 1


@settings(max_examples=200, deadline=None)
@given(record=records(), data=st.data())
def test_decide_warm_backups_never_duplicates_a_key(record: AppRecord,
                                                    data: st.DataObject) -> None:
    slot = st.tuples(st.just("a"), st.sampled_from(SERVERS), st.sampled_from(VARIANTS))
    to_load = data.draw(st.lists(slot, unique=True, max_size=4))
    # The planner's two lists are disjoint (desired - current, current - desired).
    to_unload = data.draw(st.lists(slot.filter(lambda k: k not in to_load), unique=True,
                                   max_size=4))
    serving_before = record.serving
    decision = decide_warm_backups(record, to_load, to_unload, FAMILIES)
    assert len(set(keys(record.replicas))) == len(record.replicas)
    assert record.serving == serving_before
    loads = [a for s in decision.stages for a in s.actions if isinstance(a, LoadVariant)]
    for action in loads:
        added = record.replica(action.server_id, action.variant)
        assert added is not None and (added.role, added.state) == (W, LOADING)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_decide_fail_back_evicts_only_ready_backups_on_the_home_server(
        data: st.DataObject) -> None:
    backups = data.draw(st.lists(st.tuples(st.sampled_from(("s1", "s3", "s4")),
                                           st.sampled_from((SMALL, MEDIUM))), max_size=4))
    apps = failback_apps(*backups)
    snapshot = build_snapshot(FAMILIES, servers(), apps)
    before = {a: [x.model_copy() for x in rec.replicas] for a, rec in apps.items()}
    decision = decide_fail_back(apps, snapshot, "p1", FAMILIES)
    for app_id, record in apps.items():
        assert len(set(keys(record.replicas))) == len(record.replicas)
        for old, new in zip(before[app_id], record.replicas, strict=False):
            if old.state != new.state:
                assert decision is not None
                assert (old.role, old.state, new.state, old.server_id) == (
                    W, READY, UNLOADING, "s1")
    if decision is not None:
        free = snapshot.free["s1"]
        evicted = [a for s in decision.stages for a in s.actions if isinstance(a, UnloadVariant)]
        freed = sum(FAMILIES["f"].variant(a.variant).memory_mb for a in evicted)
        assert free["memory_mb"] + freed >= 400.0 - 1e-9
