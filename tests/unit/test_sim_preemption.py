"""Hand-computed outcomes of warm-backup preemption (policies/preemption.py).

The simulator's site-failure experiment (Fig. 11) needs it; the policy lives in policies/.
Memory only (compute 0), so every number below is a sum of the variant sizes.
"""

from __future__ import annotations

from policies.actions import ProgressiveRecovery, PromoteReplica, UnloadVariant
from policies.config import ProgressiveConfig
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot, Placement, Role
from policies.preemption import preemptible_backups, recovery_load
from policies.resources import MEMORY_MB
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement

FAM = make_family("fam", [("fam-s", 100, 0.7), ("fam-m", 200, 0.85), ("fam-l", 400, 1.0)])
BIG = make_family("big", [("big-s", 300, 0.8), ("big-l", 600, 1.0)])
TINY = make_family("tiny", [("tiny-s", 50, 0.9), ("tiny-l", 80, 1.0)])
PREEMPT = UnderstudyPolicy(progressive=ProgressiveConfig(preempt_warm=True))


def scenario() -> ClusterSnapshot:
    """A fails; x (no warm backup) finds no free memory anywhere.

    A 1000: x (fam-l 400).  B 1000: y (big-l 600) + h1 (fam-l 400), full.
    C 500: warm h1 fam-l 400 (value 1.0) + warm h2 fam-s 100 (value 0.7), full.
    D 400: h2 (fam-l 400), full.  E 50: warm h3 tiny-s 50 (value 0.09), full.
    F 80: h3 (tiny-l 80), full.
    """
    sizes = {"A": 1000, "B": 1000, "C": 500, "D": 400, "E": 50, "F": 80}
    servers = [make_server(k, m, site="s1" if k in "AB" else "s2", compute=0)
               for k, m in sizes.items()]
    apps = [make_app("x", FAM), make_app("y", BIG), make_app("h1", FAM, critical=True),
            make_app("h2", FAM, critical=True),
            make_app("h3", TINY, critical=True, max_rate_rps=0.1)]
    placements = [placement("x", "A", "fam-l"), placement("y", "B", "big-l"),
                  placement("h1", "B", "fam-l"), placement("h2", "D", "fam-l"),
                  placement("h3", "F", "tiny-l"),
                  placement("h1", "C", "fam-l", Role.WARM),
                  placement("h2", "C", "fam-s", Role.WARM),
                  placement("h3", "E", "tiny-s", Role.WARM)]
    return make_snapshot([FAM, BIG, TINY], servers, apps, placements=placements)


def test_without_preemption_the_app_is_lost() -> None:
    plan = UnderstudyPolicy().plan_failover(scenario(), ["A"])
    assert plan.recoveries == () and [u.app_id for u in plan.unrecoverable] == ["x"]
    assert plan.preempted == ()


def test_preemption_unloads_only_the_cheapest_backup_that_makes_room() -> None:
    # Order: h3@E (0.09), h2@C (0.7), h1@C (1.0). Unloading h3 alone frees 50 MB: fam-s (100)
    # fits nowhere. Unloading h3 and h2 frees 100 MB on C: x recovers there as fam-s. h3's
    # backup on E is not needed by the plan, so it stays loaded.
    plan = PREEMPT.plan_failover(scenario(), ["A"])
    assert plan.preempted == (Placement("h2", "C", "fam-s", Role.WARM),)
    assert plan.recoveries == (ProgressiveRecovery("x", "C", "fam-s", "fam-s"),)
    assert plan.unrecoverable == ()
    assert "preempted 1 warm backups of healthy apps" in plan.notes
    actions = plan.actions()
    assert actions[0] == UnloadVariant("C", "h2", "fam-s")
    assert actions[-1] == PromoteReplica("x", "C", "fam-s")


def test_backups_of_affected_apps_are_never_preempted() -> None:
    after = scenario().with_failed(["D"])
    ids = [(p.app_id, p.server_id) for p in preemptible_backups(after)]
    assert ids == [("h3", "E"), ("h1", "C")]  # h2's primary was on D: its backup is not insurance


def test_recovery_load_counts_the_largest_upgrade_reserve_once() -> None:
    snap = scenario()
    load = recovery_load(snap, [ProgressiveRecovery("x", "C", "fam-s", "fam-l"),
                                ProgressiveRecovery("h1", "C", "fam-s", "fam-m"),
                                ProgressiveRecovery("h2", "D", "fam-s", "fam-s")])
    assert load["C"][MEMORY_MB] == 400 + 200 + 100  # Σ targets + one interim reserve
    assert load["D"][MEMORY_MB] == 100
