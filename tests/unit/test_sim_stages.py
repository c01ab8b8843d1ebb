"""The simulator's stage interpreter (sim.engine.execute) on small hand-built stage lists.

Every case uses the timing of ``sim_fixtures.TIMING``: commands 1 ms, notifications 10 ms, and
loads of 100 ms ("s"), 200 ms ("m") or 400 ms ("l"); the failure is declared at t = 0 unless a
case says otherwise. Times are when each action completed, in the flattened order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.actions import (
    FailoverPlan,
    LoadVariant,
    ProgressiveRecovery,
    PromoteReplica,
    Stage,
    UnloadVariant,
    WarmSwitch,
)
from policies.model import Placement, Role
from sim.engine import Execution, execute
from tests.unit.sim_fixtures import TIMING

LOAD_MS = {"s": 100.0, "m": 200.0, "l": 400.0}


def load(app: str, variant: str, server: str = "X") -> LoadVariant:
    return LoadVariant(server, app, variant, Role.INTERIM)


def upgrade(app: str, variant: str, server: str = "X") -> LoadVariant:
    return LoadVariant(server, app, variant, Role.UPGRADE)


def promote(app: str, variant: str, server: str = "X") -> PromoteReplica:
    return PromoteReplica(app, server, variant)


def unload(app: str, variant: str, server: str = "X") -> UnloadVariant:
    return UnloadVariant(server, app, variant)


def run(stages: tuple[Stage, ...], threads: int = 1, declared_ms: float = 0.0) -> Execution:
    timing = replace(TIMING, load_threads=threads)
    return execute(stages, timing, lambda a: LOAD_MS[a.variant], declared_ms)


CASES = [
    pytest.param(
        (Stage("switch", (promote("a", "m"),)),), 1,
        # A promotion with no load before it is a warm switch: command + notification.
        (11.0,), {"switch": 11.0}, id="warm-promote-costs-command-and-notification"),
    pytest.param(
        (Stage("cold", (load("a", "s"), promote("a", "s"))),), 1,
        # The load has its command at 1, loads 1..101; the promotion only notifies: 111.
        (101.0, 111.0), {"cold": 111.0}, id="promote-after-a-load-only-notifies"),
    pytest.param(
        (Stage("load", (load("a", "s"),)),
         Stage("serve", (promote("a", "s"),), after=("load",))), 1,
        # The load was in an earlier stage of the same decision: still only the notification.
        (101.0, 111.0), {"load": 101.0, "serve": 111.0}, id="loaded-in-an-earlier-stage"),
    pytest.param(
        (Stage("first", (unload("h", "l"),)),
         Stage("second", (unload("g", "s", "Y"),), after=("first",))), 1,
        # An unload is done a command after its prerequisites: 1, then 1 + 1.
        (1.0, 2.0), {"first": 1.0, "second": 2.0}, id="unload-is-one-command"),
    pytest.param(
        (Stage("preempt", ()),
         Stage("interim", (load("a", "s"), promote("a", "s")), after=("preempt",))), 1,
        # An empty stage finishes at once; the load still waits for its command (1..101).
        (101.0, 111.0), {"preempt": 0.0, "interim": 111.0}, id="empty-stage-finishes-at-once"),
    pytest.param(
        (Stage("unload", (unload("h", "l"),)),
         Stage("nothing", (), after=("unload",)),
         Stage("then", (unload("g", "s"),), after=("nothing",))), 1,
        # An empty stage finishes as soon as it starts: when "unload" does (1).
        (1.0, 2.0), {"unload": 1.0, "nothing": 1.0, "then": 2.0},
        id="empty-stage-after-another"),
    pytest.param(
        (Stage("a", (load("a", "s"), promote("a", "s"))),
         Stage("b", (load("b", "s"), promote("b", "s")), after=("a",)),
         Stage("c", (promote("c", "m"),))), 2,
        # "b" starts when "a" finishes (111) although a thread is free: 111..211, 221.
        # "c" names no stage: it runs from the start, beside "a" (11).
        (101.0, 111.0, 211.0, 221.0, 11.0), {"a": 111.0, "b": 221.0, "c": 11.0},
        id="after-orders-stages"),
    pytest.param(
        (Stage("s", (load("a", "s"), load("b", "s"), promote("a", "s"), promote("b", "s"),
                     unload("a", "s"))),), 2,
        # Each app's actions in list order, the apps at the same time: a and b both load
        # 1..101 and are served at 111; a's unload follows its promotion (112).
        (101.0, 101.0, 111.0, 111.0, 112.0), {"s": 112.0}, id="apps-run-concurrently"),
    pytest.param(
        (Stage("s", (load("a", "s"), load("b", "m"), load("c", "s"))),), 1,
        # One thread, FIFO in list order: a 1..101, b 101..301, c 301..401.
        (101.0, 301.0, 401.0), {"s": 401.0}, id="one-thread-queues-loads"),
    pytest.param(
        (Stage("s", (load("a", "s"), load("b", "m"), load("c", "s"))),), 2,
        # Two threads: a and b from 1; c takes a's thread at 101: 101..201.
        (101.0, 201.0, 201.0), {"s": 201.0}, id="two-threads"),
    pytest.param(
        (Stage("s", (load("a", "s"), load("b", "s", "Y"))),), 1,
        # Threads are per server: X and Y load at the same time.
        (101.0, 101.0), {"s": 101.0}, id="threads-per-server"),
    pytest.param(
        (Stage("up", (upgrade("a", "l"), promote("a", "l"), unload("a", "s"),
                      upgrade("b", "l"), promote("b", "l"))),), 2,
        # One upgrade at a time per server, held until the app's promotion: a 1..401, 411;
        # b gets the slot at 411 (not at a's unload, 412) although a thread was free:
        # 411..811, 821.
        (401.0, 411.0, 412.0, 811.0, 821.0), {"up": 821.0}, id="upgrade-slot"),
    pytest.param(
        (Stage("up", (upgrade("a", "l"), promote("a", "l"),
                      upgrade("b", "l", "Y"), promote("b", "l", "Y"))),), 1,
        # Upgrade slots are per server.
        (401.0, 411.0, 401.0, 411.0), {"up": 411.0}, id="upgrade-slot-per-server"),
    pytest.param(
        (Stage("s", (load("a", "s"), upgrade("b", "l"), promote("b", "l"),
                     upgrade("c", "m"), promote("c", "m"))),), 1,
        # b holds the slot from 1 but queues for the thread behind a: 101..501, 511; c waits
        # for the slot until then: 511..711, 721.
        (101.0, 501.0, 511.0, 711.0, 721.0), {"s": 721.0}, id="upgrade-holds-slot-in-queue"),
]


@pytest.mark.parametrize(("stages", "threads", "action_ms", "stage_ms"), CASES)
def test_interpreter_times(stages: tuple[Stage, ...], threads: int,
                           action_ms: tuple[float, ...], stage_ms: dict[str, float]) -> None:
    got = run(stages, threads)
    assert got.action_ms == action_ms
    assert dict(got.stage_ms) == stage_ms


def test_times_count_from_the_declared_failure() -> None:
    # Declared at 30: the load command arrives at 31, the load runs 31..131, served at 141.
    got = run((Stage("s", (load("a", "s"), promote("a", "s"))),), declared_ms=30.0)
    assert got.action_ms == (131.0, 141.0)
    assert (got.declared_ms, got.served_ms, got.settled_ms) == (30.0, {"a": 141.0},
                                                                {"a": 141.0})


def test_served_at_the_first_promotion_settled_at_the_last() -> None:
    got = run((Stage("s", (load("a", "s"), promote("a", "s"),
                           upgrade("a", "l"), promote("a", "l"), unload("a", "s"))),))
    # 1..101, served 111; upgrade 111..511, settled 521; the interim unloaded at 522.
    assert got.action_ms == (101.0, 111.0, 511.0, 521.0, 522.0)
    assert (got.served_ms, got.settled_ms) == ({"a": 111.0}, {"a": 521.0})


def test_a_failover_plan_runs_its_upgrades_after_every_interim_and_release() -> None:
    """FailoverPlan.stages(): switch, preempt, interim, release, then upgrade.

    Two threads on X: both interims load 1..101 and serve at 111; the deferred preemption of
    g on Y is sent then (112); only then do the upgrades start, one at a time on X: b
    112..512, 522 (its interim unloaded at 523); c 522..922, 932, 933. The warm switch of w
    takes 11 and the preemption of h 1, both from the start.
    """
    deferred = Placement("g", "Y", "fam-s", Role.WARM)
    plan = FailoverPlan(
        frozenset({"A"}), (WarmSwitch("w", "W", "m"),),
        (ProgressiveRecovery("b", "X", "s", "l"), ProgressiveRecovery("c", "X", "s", "l")), (),
        preempted=(Placement("h", "Y", "l", Role.WARM), deferred),
        deferred_preemptions=(deferred,))
    got = run(plan.stages(), threads=2)
    assert dict(got.stage_ms) == {"switch": 11.0, "preempt": 1.0, "interim": 111.0,
                                  "release": 112.0, "upgrade": 933.0}
    assert got.served_ms == {"w": 11.0, "b": 111.0, "c": 111.0}
    assert got.settled_ms == {"w": 11.0, "b": 522.0, "c": 932.0}


@pytest.mark.parametrize("stages", [
    (Stage("a", ()), Stage("a", ())),
    (Stage("a", (), after=("b",)), Stage("b", ())),
    (Stage("a", (), after=("a",)),),
], ids=["duplicate-name", "after-a-later-stage", "after-itself"])
def test_stages_must_name_earlier_stages(stages: tuple[Stage, ...]) -> None:
    with pytest.raises(ValueError, match="stage"):
        run(stages)
