"""Warm-backup ILP properties: every plan is valid; on tiny instances it equals brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.actions import SolveStats, WarmAssignment, WarmPlan
from policies.config import WarmPlanConfig
from policies.warm_candidates import warm_capacity
from policies.warm_check import warm_plan_violations
from policies.warm_ilp import plan_warm_backups
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement


@st.composite
def instances(draw, max_apps=3, max_servers=3):
    n_variants = draw(st.integers(1, 3))
    memories = sorted(draw(st.lists(st.integers(1, 12), min_size=n_variants,
                                    max_size=n_variants, unique=True)))
    accuracies = draw(st.lists(st.integers(50, 100), min_size=n_variants, max_size=n_variants))
    top = max(accuracies)
    specs = [(f"v{j}", 50.0 * m, a / top)
             for j, (m, a) in enumerate(zip(memories, accuracies, strict=True))]
    family = make_family(
        "f", specs,
        compute_per_rps=[0.5 * m for m in memories],
        latency_ms=[float(m) for m in memories])
    n_servers = draw(st.integers(2, max_servers))
    sites = [draw(st.sampled_from(["x", "y"])) for _ in range(n_servers)]
    speeds = [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(n_servers)]
    free_memory = [draw(st.integers(0, 16)) * 50.0 for _ in range(n_servers)]
    free_compute = [draw(st.integers(0, 40)) * 1.0 for _ in range(n_servers)]
    apps, where = [], {}
    for i in range(draw(st.integers(1, max_apps))):
        slo = draw(st.one_of(st.none(), st.sampled_from([3.0, 6.0, 12.0])))
        excluded = draw(st.sets(st.sampled_from([f"s{k}" for k in range(n_servers)]),
                                max_size=1))
        apps.append(make_app(f"a{i}", family, critical=draw(st.booleans()) or i == 0,
                             max_rate_rps=float(draw(st.integers(1, 4))), latency_slo_ms=slo,
                             excluded_servers=excluded))
        where[f"a{i}"] = f"s{draw(st.integers(0, n_servers - 1))}"
    used = {f"s{k}": [0.0, 0.0] for k in range(n_servers)}
    for app in apps:
        demand = family.most_accurate.demand(app.max_rate_rps)
        used[where[app.app_id]][0] += demand["memory_mb"]
        used[where[app.app_id]][1] += demand["compute"]
    servers = [make_server(f"s{k}", free_memory[k] + used[f"s{k}"][0], site=sites[k],
                           compute=free_compute[k] + used[f"s{k}"][1], speed=speeds[k])
               for k in range(n_servers)]
    placements = [placement(a.app_id, where[a.app_id], family.most_accurate.name)
                  for a in apps]
    snapshot = make_snapshot([family], servers, apps, placements=placements)
    config = WarmPlanConfig(alpha=draw(st.sampled_from([0.0, 0.1, 0.5])),
                            site_independent=draw(st.booleans()), mip_rel_gap=0.0,
                            replicas=draw(st.sampled_from([1, 1, 2])))
    return snapshot, config


def brute_force(snapshot, config):
    """Best (backups placed, Σ accuracy·rate) over every assignment, by enumeration (R = 1)."""
    critical = [a for a in snapshot.apps if a.critical]
    free = warm_capacity(snapshot)
    options = []
    for app in critical:
        family = snapshot.family_of(app)
        choices = [None] + [(v, s) for v in family.variants for s in free]
        options.append(choices)
    best = (0, 0.0)
    for combo in itertools.product(*options):
        assignments = tuple(
            WarmAssignment(app.app_id, server, variant.name, variant.accuracy)
            for app, choice in zip(critical, combo, strict=True) if choice is not None
            for variant, server in [choice])
        plan = WarmPlan(assignments, (), SolveStats("brute", "none", "ok", 0.0))
        if warm_plan_violations(snapshot, plan, config):
            continue
        value = sum(a.accuracy * snapshot.app_by_id[a.app_id].max_rate_rps for a in assignments)
        score = (len(assignments), value)
        if (score[0], score[1] + 1e-9) > best:
            best = max(best, score)
    return best


@pytest.mark.parametrize("method", ["decomposed", "full"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances())
def test_plans_respect_every_constraint(method, instance):
    snapshot, config = instance
    config = config.model_copy(update={"method": method})
    plan = plan_warm_backups(snapshot, config)
    assert warm_plan_violations(snapshot, plan, config) == []
    critical = {a.app_id for a in snapshot.apps if a.critical}
    for app_id in critical:
        want = config.replicas
        got = len(plan.for_app(app_id))
        listed = [u for u in plan.uncovered if u.app_id == app_id]
        # Never silently dropped: short of backups <=> reported, with a reason.
        assert (got < want) == bool(listed)
        if listed:
            assert listed[0].placed == got and listed[0].reason
    assert plan.stats.bound is None or plan.stats.bound >= plan.stats.objective - 1e-6


@pytest.mark.parametrize("method", ["decomposed", "full"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances())
def test_objective_equals_brute_force_on_tiny_instances(method, instance):
    snapshot, config = instance
    config = config.model_copy(update={"method": method, "replicas": 1})
    plan = plan_warm_backups(snapshot, config)
    count, value = brute_force(snapshot, config)
    assert len(plan.assignments) == count
    assert plan.stats.objective == pytest.approx(value, rel=1e-6, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(instance=instances())
def test_replanning_with_current_backups_is_still_valid(instance):
    snapshot, config = instance
    first = plan_warm_backups(snapshot, config)
    again = snapshot.with_placements(snapshot.placements + first.placements())
    second = plan_warm_backups(again, config)
    assert warm_plan_violations(again, second, config) == []
    # The bonus for keeping backups never costs coverage.
    assert len(second.assignments) == len(first.assignments)
