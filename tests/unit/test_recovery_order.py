"""The order a failover's interims load in, and which preemptions wait (policies/recovery_order)."""

from __future__ import annotations

from dataclasses import replace

from policies.actions import (
    FailoverPlan,
    LoadVariant,
    ProgressiveRecovery,
    PromoteReplica,
    UnloadVariant,
)
from policies.model import ClusterSnapshot, Family, Placement, Role
from policies.recovery_order import deferrable_preemptions, interims_shortest_first
from sim.engine import simulate_failover
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement
from tests.unit.sim_fixtures import TIMING, HalfPhase

FAM = make_family("fam", [("fam-s", 100, 0.7), ("fam-l", 400, 1.0)])
TINY = make_family("tiny", [("tiny-s", 50, 0.9), ("tiny-l", 80, 1.0)])
BIG = make_family("big", [("big-s", 300, 0.8), ("big-l", 600, 1.0)])


def _timed(family: Family, seconds: dict[str, float]) -> Family:
    return Family(family.name, tuple(replace(v, load_time_s=seconds.get(v.name))
                                     for v in family.variants))


def snapshot(families: tuple[Family, ...] = (FAM, TINY, BIG)) -> ClusterSnapshot:
    """A holds the four primaries and fails; X (900 MB) takes the recoveries.

    X also holds h's warm backup (fam-l, 400 MB), so 500 MB are free there.
    """
    servers = [make_server("A", 2000), make_server("X", 900), make_server("H", 1000)]
    apps = [make_app("a", "fam"), make_app("b", "tiny"), make_app("c", "big", critical=True),
            make_app("d", "fam"), make_app("h", "fam", critical=True)]
    placements = [placement("a", "A", "fam-l"), placement("b", "A", "tiny-l"),
                  placement("c", "A", "big-l"), placement("d", "A", "fam-l"),
                  placement("h", "H", "fam-l"), placement("h", "X", "fam-l", Role.WARM)]
    return make_snapshot(families, servers, apps, placements=placements).with_failed(["A"])


def recovery(app: str, interim: str, target: str) -> ProgressiveRecovery:
    return ProgressiveRecovery(app, "X", interim, target)


def test_critical_interims_first_then_the_smallest() -> None:
    plan = (recovery("d", "fam-s", "fam-l"), recovery("b", "tiny-s", "tiny-l"),
            recovery("c", "big-s", "big-s"), recovery("a", "fam-s", "fam-l"))
    ordered = interims_shortest_first(snapshot(), plan)
    # c is critical; then tiny-s (50 MB) before the two fam-s (100 MB), those by app id.
    assert [r.app_id for r in ordered] == ["c", "b", "a", "d"]


def test_a_profiled_load_time_outranks_the_size() -> None:
    # fam-s is larger than tiny-s but profiled faster: it loads first.
    families = (_timed(FAM, {"fam-s": 0.010}), _timed(TINY, {"tiny-s": 0.050}), BIG)
    plan = (recovery("b", "tiny-s", "tiny-l"), recovery("a", "fam-s", "fam-l"))
    assert [r.app_id for r in interims_shortest_first(snapshot(families), plan)] == ["a", "b"]


def test_a_preemption_waits_only_where_the_interims_fit_beside_it() -> None:
    backup = Placement("h", "X", "fam-l", Role.WARM)
    fits = (recovery("a", "fam-s", "fam-l"), recovery("d", "fam-s", "fam-l"))  # 200 <= 500
    assert deferrable_preemptions(snapshot(), fits, [backup]) == (backup,)
    crowded = fits + (recovery("c", "big-s", "big-l"), recovery("b", "tiny-s", "tiny-l"))
    assert deferrable_preemptions(snapshot(), crowded, [backup]) == ()  # 550 > 500


def test_actions_put_deferred_unloads_between_the_interims_and_the_upgrades() -> None:
    first, later = Placement("h", "X", "fam-l", Role.WARM), Placement("g", "Y", "fam-s",
                                                                      Role.WARM)
    plan = FailoverPlan(frozenset({"A"}), (), (recovery("a", "fam-s", "fam-l"),), (),
                        preempted=(first, later), deferred_preemptions=(later,))
    assert plan.actions() == (
        UnloadVariant("X", "h", "fam-l"),
        LoadVariant("X", "a", "fam-s", Role.INTERIM), PromoteReplica("a", "X", "fam-s"),
        UnloadVariant("Y", "g", "fam-s"),
        LoadVariant("X", "a", "fam-l", Role.UPGRADE), PromoteReplica("a", "X", "fam-l"),
        UnloadVariant("X", "a", "fam-s"))


def test_the_simulator_unloads_a_deferred_preemption_before_the_upgrade_only() -> None:
    # command 1 ms, 1 ms per MB, notification 10 ms, one load thread. The interim is served
    # at 30 + 1 + 100 + 10 = 141 ms either way (the unload's command overlaps the load's).
    # The upgrade: at once (141 + 400 + 10 = 551) when the backup went first; after the
    # unload sent once the interim serves (142 + 400 + 10 = 552) when it was deferred.
    backup = Placement("h", "X", "fam-l", Role.WARM)
    state = snapshot().with_failed([])
    settled = {}
    for deferred in ((), (backup,)):
        plan = FailoverPlan(frozenset({"A"}), (), (recovery("a", "fam-s", "fam-l"),), (),
                            preempted=(backup,), deferred_preemptions=deferred)
        (outcome,) = [o for o in simulate_failover(state, plan, TIMING, HalfPhase())
                      if o.app_id == "a"]
        assert outcome.e2e_ms == 141.0
        settled[bool(deferred)] = outcome.settled_ms + outcome.e2e_ms - outcome.mttr_ms
    assert settled == {False: 551.0, True: 552.0}
