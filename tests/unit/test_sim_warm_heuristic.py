"""The warm-step heuristic (policies/warm_heuristic.py) the simulator runs on big clusters."""

from __future__ import annotations

import pytest

from model_repo.profiles import load_families
from policies.config import WarmPlanConfig
from policies.failover import with_warm_plan
from policies.model import Role
from policies.warm_check import warm_plan_violations
from policies.warm_ilp import plan_warm_backups, uses_heuristic
from sim.cluster import ClusterSpec, build_cluster, with_headroom
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement

FAM = make_family("fam", [("fam-s", 100, 0.7), ("fam-m", 200, 0.85), ("fam-l", 400, 1.0)])


def small_cluster():
    """k1 on A (site s1), k2 on B (site s1), C in site s2 and D in site s3: 1000 MB each."""
    servers = [make_server("A", 1000, site="s1"), make_server("B", 1000, site="s1"),
               make_server("C", 1000, site="s2"), make_server("D", 1000, site="s3")]
    apps = [make_app("k1", FAM, critical=True), make_app("k2", FAM, critical=True),
            make_app("n1", FAM)]
    return make_snapshot([FAM], servers, apps, placements=[
        placement("k1", "A", "fam-l"), placement("k2", "B", "fam-l"),
        placement("n1", "C", "fam-l")])


def test_heuristic_backs_up_k_with_full_size_models_when_room_allows() -> None:
    snap = small_cluster()
    config = WarmPlanConfig(method="heuristic", alpha=0.1, site_independent=False)
    plan = plan_warm_backups(snap, config)
    assert plan.stats.method == "heuristic" and plan.uncovered == ()
    where = {a.app_id: (a.server_id, a.variant) for a in plan.assignments}
    # Free after alpha: A 540, B 540, C 540, D 900. k1 takes D (most free); D keeps 900 - 400
    # - 100 (interim reserve) = 400, so k2 takes A, the first of the 540s it may use.
    assert where == {"k1": ("D", "fam-l"), "k2": ("A", "fam-l")}
    assert warm_plan_violations(snap, plan, config) == []
    # Unset, site independence is on (three sites): k2 may not use A, in its primary's site.
    plan = plan_warm_backups(snap, WarmPlanConfig(method="heuristic", alpha=0.1))
    assert plan.uncovered == () and plan.for_app("k2")[0].server_id == "C"
    assert warm_plan_violations(snap, plan, WarmPlanConfig(alpha=0.1)) == []


def test_heuristic_site_independence_and_two_replicas() -> None:
    snap = small_cluster()
    config = WarmPlanConfig(method="heuristic", replicas=2, site_independent=True, alpha=0.0)
    plan = plan_warm_backups(snap, config)
    for app in ("k1", "k2"):
        servers = sorted(a.server_id for a in plan.for_app(app))
        assert servers == ["C", "D"]  # not site s1 of the primary, one per site
    assert warm_plan_violations(snap, plan, config) == []


def test_heuristic_replaces_current_warm_backups_and_reports_uncovered() -> None:
    snap = small_cluster()
    snap = snap.with_placements(snap.placements + (placement("k1", "C", "fam-l", Role.WARM),))
    tight = snap.with_placements(snap.placements)  # same capacity; the old backup is re-planned
    plan = plan_warm_backups(tight, WarmPlanConfig(method="heuristic", alpha=0.0))
    assert {a.app_id for a in plan.assignments} == {"k1", "k2"}
    lone = make_snapshot([FAM], [make_server("A", 1000)], [make_app("k", FAM, critical=True)],
                         placements=[placement("k", "A", "fam-l")])
    plan = plan_warm_backups(lone, WarmPlanConfig(method="heuristic"))
    assert plan.assignments == () and [u.app_id for u in plan.uncovered] == ["k"]


@pytest.mark.parametrize("site_independent", [False, True])
def test_heuristic_is_valid_and_close_to_the_ilp_on_a_generated_cluster(
        site_independent: bool) -> None:
    snap = with_headroom(build_cluster(load_families(), ClusterSpec(servers=30, sites=5,
                                                                    apps=150, seed=3)), 0.1)
    config = WarmPlanConfig(alpha=0.1, site_independent=site_independent)
    heuristic = plan_warm_backups(snap, config.model_copy(update={"method": "heuristic"}))
    ilp = plan_warm_backups(snap, config)
    assert warm_plan_violations(snap, heuristic, config) == []
    assert len(heuristic.assignments) >= len(ilp.assignments) - 2
    assert heuristic.stats.objective >= 0.95 * ilp.stats.objective


def test_auto_method_switches_on_instance_size() -> None:
    snap = small_cluster()  # 2 apps in K x 4 live servers = 8
    assert not uses_heuristic(snap, WarmPlanConfig(method="auto", auto_ilp_max_size=8))
    assert uses_heuristic(snap, WarmPlanConfig(method="auto", auto_ilp_max_size=7))
    ran = plan_warm_backups(snap, WarmPlanConfig(method="auto", auto_ilp_max_size=8))
    assert ran.stats.method == "decomposed"
    ran = plan_warm_backups(snap, WarmPlanConfig(method="auto", auto_ilp_max_size=7))
    assert ran.stats.method == "heuristic"


def test_heuristic_keeps_current_backups_that_still_obey_the_rules() -> None:
    snap = small_cluster()
    config = WarmPlanConfig(method="heuristic", alpha=0.1)
    first = plan_warm_backups(snap, config)
    # Those backups loaded: planning again moves none of them.
    loaded = snap.with_placements(snap.placements + tuple(
        placement(a.app_id, a.server_id, a.variant, Role.WARM) for a in first.assignments))
    again = plan_warm_backups(loaded, config)
    assert set(again.assignments) == set(first.assignments)
    # A backup that now breaks a rule is not kept: k1's on C, where the user excludes it.
    servers = [make_server("A", 1000, site="s1"), make_server("B", 1000, site="s1"),
               make_server("C", 1000, site="s2"), make_server("D", 1000, site="s3")]
    odd = make_snapshot([FAM], servers, [
        make_app("k1", FAM, critical=True, excluded_servers={"C"}),
        make_app("k2", FAM, critical=True), make_app("n1", FAM)], placements=[
        placement("k1", "A", "fam-l"), placement("k2", "B", "fam-l"),
        placement("n1", "C", "fam-l"), placement("k1", "C", "fam-s", Role.WARM)])
    assert [a.server_id for a in plan_warm_backups(odd, config).for_app("k1")] == ["D"]
    # Without the bonus the heuristic re-plans from scratch, as the paper's does.
    fresh = plan_warm_backups(loaded, config.model_copy(update={"keep_current_bonus": 0.0}))
    assert {a.app_id for a in fresh.assignments} == {"k1", "k2"}
    assert warm_plan_violations(loaded, again, config) == []


def test_a_backup_where_a_cold_replica_of_its_variant_is_listed_replaces_it() -> None:
    """Issue: a COLD replica of the chosen variant on the chosen server raised DuplicateIdError."""
    snap = small_cluster()
    cold = snap.with_placements(snap.placements + (placement("k1", "D", "fam-l", Role.COLD),))
    config = WarmPlanConfig(method="heuristic", alpha=0.1)
    plan = plan_warm_backups(cold, config)
    assert ("D", "fam-l") in {(a.server_id, a.variant) for a in plan.for_app("k1")}
    after = with_warm_plan(cold, plan)
    roles = [p.role for p in after.placements if (p.app_id, p.server_id) == ("k1", "D")]
    assert roles == [Role.WARM]
