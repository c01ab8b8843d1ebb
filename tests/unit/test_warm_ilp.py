"""Warm-backup ILP: hand-computed cases, solver selection, statistics."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies.config import WarmPlanConfig
from policies.errors import SolverUnavailableError
from policies.model import Role
from policies.warm_check import warm_plan_violations
from policies.warm_ilp import plan_warm_backups
from tests.unit.builders import (
    make_app,
    make_family,
    make_server,
    make_snapshot,
    placement,
    primary_placements,
)

FAM = make_family("fam", [("small", 100, 0.80), ("medium", 300, 0.90), ("large", 600, 1.0)],
                  latency_ms=[2.0, 5.0, 10.0])
METHODS = ["decomposed", "full"]


def _snapshot(servers, apps, where, families=(FAM,), extra_placements=(), failed=()):
    placements = primary_placements(families, apps, where) + list(extra_placements)
    return make_snapshot(families, servers, apps, placements=placements, failed=failed)


def _big_servers(n=3, memory=2000, sites=None):
    return [make_server(f"s{k}", memory, site=(sites[k] if sites else "site-a"))
            for k in range(n)]


@pytest.mark.parametrize("method", METHODS)
def test_backup_goes_to_another_server_with_the_best_variant_that_fits(method):
    servers = [make_server("s0", 1000), make_server("s1", 1000)]
    apps = [make_app("a", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0"})
    # s1 has 1000 MB free; the budget is 0.9 * (400 + 1000) = 1260 MB: 'large' fits.
    plan = plan_warm_backups(snap, WarmPlanConfig(method=method))
    assert [(a.app_id, a.server_id, a.variant) for a in plan.assignments] == [("a", "s1", "large")]
    assert plan.uncovered == ()
    assert plan.stats.objective == pytest.approx(1.0)


@pytest.mark.parametrize("method", METHODS)
def test_alpha_reserve_forces_a_smaller_variant(method):
    servers = [make_server("s0", 600), make_server("s1", 700)]
    apps = [make_app("a", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0"})
    # Free: s0 0, s1 700; alpha 0.5 leaves 350 MB for warm backups: 'medium' (300).
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.5, method=method))
    assert [a.variant for a in plan.assignments] == ["medium"]
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.0, method=method))
    assert [a.variant for a in plan.assignments] == ["large"]


@pytest.mark.parametrize("method", METHODS)
def test_coverage_comes_before_accuracy(method):
    # Two critical apps, 700 MB of room in total on s1: two 'medium' (0.9 + 0.9) would lose
    # to one 'large' + nothing (1.0 * 10 rps) in raw accuracy, but coverage wins.
    servers = [make_server("s0", 2000), make_server("s1", 700)]
    apps = [make_app("hot", FAM, critical=True, max_rate_rps=10.0),
            make_app("cold", FAM, critical=True, max_rate_rps=1.0)]
    snap = _snapshot(servers, apps, {"hot": "s0", "cold": "s0"})
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.0, method=method))
    chosen = {a.app_id: a.variant for a in plan.assignments}
    assert set(chosen) == {"hot", "cold"}
    assert plan.uncovered == ()
    # Best split of 700 MB with both covered: hot gets 'large' (600) and cold 'small' (100).
    assert chosen == {"hot": "large", "cold": "small"}


@pytest.mark.parametrize("method", METHODS)
def test_unplaceable_app_is_reported_not_infeasible(method):
    servers = [make_server("s0", 1300), make_server("s1", 650)]
    apps = [make_app("a", FAM, critical=True), make_app("b", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0", "b": "s1"})
    # a's backup can go to s1 (free 50: nothing fits); b's to s0 (free 700).
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.0, method=method))
    assert [(a.app_id, a.server_id, a.variant) for a in plan.assignments] == [("b", "s0", "large")]
    assert len(plan.uncovered) == 1
    uncovered = plan.uncovered[0]
    assert (uncovered.app_id, uncovered.wanted, uncovered.placed) == ("a", 1, 0)
    assert "smallest variant" in uncovered.reason


def test_non_critical_apps_get_no_warm_backup():
    servers = _big_servers()
    apps = [make_app("a", FAM, critical=False)]
    plan = plan_warm_backups(_snapshot(servers, apps, {"a": "s0"}))
    assert plan.assignments == () and plan.uncovered == ()
    assert plan.stats.status == "empty"


@pytest.mark.parametrize("method", METHODS)
def test_site_independence_and_several_replicas(method):
    servers = _big_servers(4, sites=["x", "x", "y", "z"])
    apps = [make_app("a", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0"})
    config = WarmPlanConfig(replicas=3, site_independent=True, method=method)
    plan = plan_warm_backups(snap, config)
    # Site x is the primary's: only s2 (y) and s3 (z) may hold backups, one per site.
    assert sorted(a.server_id for a in plan.assignments) == ["s2", "s3"]
    assert [(u.app_id, u.wanted, u.placed) for u in plan.uncovered] == [("a", 3, 2)]
    assert warm_plan_violations(snap, plan, config) == []
    # Unset, it is on: three sites have live servers.
    auto = plan_warm_backups(snap, WarmPlanConfig(replicas=3, method=method))
    assert auto.assignments == plan.assignments and auto.uncovered == plan.uncovered
    plan = plan_warm_backups(snap, WarmPlanConfig(replicas=3, method=method,
                                                  site_independent=False))
    assert sorted(a.server_id for a in plan.assignments) == ["s1", "s2", "s3"]


@pytest.mark.parametrize("method", METHODS)
def test_per_app_replica_override(method):
    servers = _big_servers(4)
    apps = [make_app("a", FAM, critical=True, warm_replicas=2),
            make_app("b", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0", "b": "s0"})
    plan = plan_warm_backups(snap, WarmPlanConfig(method=method))
    assert len(plan.for_app("a")) == 2 and len(plan.for_app("b")) == 1
    assert len({a.server_id for a in plan.for_app("a")}) == 2


@pytest.mark.parametrize("method", METHODS)
def test_exclusion_lists(method):
    servers = _big_servers(4, sites=["x", "y", "y", "z"])
    apps = [make_app("a", FAM, critical=True, excluded_servers={"s1"}, excluded_sites={"z"}),
            make_app("b", FAM, critical=True, allowed_backup_sites={"z"})]
    snap = _snapshot(servers, apps, {"a": "s0", "b": "s0"})
    plan = plan_warm_backups(snap, WarmPlanConfig(method=method))
    where = {a.app_id: a.server_id for a in plan.assignments}
    assert where == {"a": "s2", "b": "s3"}


@pytest.mark.parametrize("method", METHODS)
def test_latency_slo_depends_on_the_server(method):
    servers = [make_server("s0", 2000), make_server("slow", 2000, speed=0.5),
               make_server("fast", 700, speed=2.0)]
    apps = [make_app("a", FAM, critical=True, latency_slo_ms=6.0)]
    snap = _snapshot(servers, apps, {"a": "s0"})
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.0, method=method))
    # 'large' takes 10 ms on the reference, 20 on 'slow', 5 on 'fast' (which has room).
    assert [(a.server_id, a.variant) for a in plan.assignments] == [("fast", "large")]
    snap = _snapshot(servers[:2], apps, {"a": "s0"})
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.0, method=method))
    # Only 'slow' remains: 'small' is 4 ms there, 'medium' 10 ms.
    assert [(a.server_id, a.variant) for a in plan.assignments] == [("slow", "small")]


def test_failed_servers_hold_no_backups_and_dead_primaries_are_reported():
    servers = _big_servers(3)
    apps = [make_app("a", FAM, critical=True), make_app("b", FAM, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0", "b": "s1"}, failed={"s1"})
    plan = plan_warm_backups(snap)
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [("a", "s2")]
    assert [(u.app_id, u.reason) for u in plan.uncovered] == [
        ("b", "the app has no live primary to back up")]


def test_current_warm_backups_are_replanned_and_kept_when_equivalent():
    servers = _big_servers(3)
    apps = [make_app("a", FAM, critical=True)]
    current = placement("a", "s2", "large", Role.WARM)
    snap = _snapshot(servers, apps, {"a": "s0"}, extra_placements=[current])
    plan = plan_warm_backups(snap)
    # s1 has more free memory than s2 (s2 holds the current backup), but keeping it wins.
    assert [(a.server_id, a.variant) for a in plan.assignments] == [("s2", "large")]
    assert plan.actions(current_warm=(("a", "s2", "large"),)) == ()


def test_dominated_variants_are_never_chosen():
    fam = make_family("odd", [("small", 100, 0.9), ("bloated", 400, 0.85), ("big", 500, 1.0)])
    servers = [make_server("s0", 2000), make_server("s1", 500)]
    apps = [make_app("a", fam, critical=True)]
    snap = _snapshot(servers, apps, {"a": "s0"}, families=(fam,))
    plan = plan_warm_backups(snap, WarmPlanConfig(alpha=0.2))
    # Budget 0.8 * (1500 + 500) = 1600 but s1 holds 500: 'big' fits; 'bloated' never.
    assert [a.variant for a in plan.assignments] == ["big"]
    servers = [make_server("s0", 2000), make_server("s1", 450)]
    snap = _snapshot(servers, apps, {"a": "s0"}, families=(fam,))
    assert [a.variant for a in plan_warm_backups(snap).assignments] == ["small"]


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_solvers_agree_and_report_statistics(solver):
    servers = _big_servers(4, memory=1500)
    apps = [make_app(f"a{i}", FAM, critical=True, max_rate_rps=1 + i) for i in range(5)]
    snap = _snapshot(servers, apps, {f"a{i}": f"s{i % 4}" for i in range(5)})
    config = WarmPlanConfig(solver=solver, time_limit_s=20, mip_rel_gap=0.0)
    plan = plan_warm_backups(snap, config)
    reference = plan_warm_backups(snap, WarmPlanConfig(method="full", mip_rel_gap=0.0))
    assert plan.stats.objective == pytest.approx(reference.stats.objective, rel=1e-6)
    stats = plan.stats
    assert stats.solver == solver and stats.status == "optimal"
    assert stats.bound is not None and stats.bound >= stats.objective - 1e-6
    assert 0.0 <= stats.gap <= 1e-6
    assert stats.total_s >= stats.solve_s >= 0.0 and stats.build_s >= 0.0
    assert stats.variables > 0 and stats.constraints > 0


def test_gurobi_without_a_licence_is_a_clear_error():
    pytest.importorskip("highspy")
    try:
        import gurobipy  # noqa: F401
        pytest.skip("gurobipy is installed here")
    except ImportError:
        pass
    snap = _snapshot(_big_servers(), [make_app("a", FAM, critical=True)], {"a": "s0"})
    with pytest.raises(SolverUnavailableError, match="gurobi"):
        plan_warm_backups(snap, WarmPlanConfig(solver="gurobi"))


def test_config_rejects_bad_values():
    with pytest.raises(ValidationError):
        WarmPlanConfig(solver="glpk")
    with pytest.raises(ValidationError):
        WarmPlanConfig(alpha=1.5)
    with pytest.raises(ValidationError):
        WarmPlanConfig(time_limit_s=0)
    with pytest.raises(ValidationError):
        WarmPlanConfig(unknown_key=1)
