"""Properties of the §5.1 baselines on random small clusters (Hypothesis)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.actions import FailoverPlan, WarmPlan
from policies.baselines import FullSizeCold, FullSizeWarm, FullSizeWarmK
from policies.config import WarmPlanConfig
from policies.model import Application, ClusterSnapshot, Family, Placement, Role, Server
from policies.policy import FailoverPolicy
from policies.resources import COMPUTE, MEMORY_MB, Resources, total
from tests.unit.builders import make_family, make_snapshot

EPS = 1e-6
SITES = ("s1", "s2", "s3")
SERVER_TYPES = ("reference", "slow")


@dataclass(frozen=True)
class Case:
    snapshot: ClusterSnapshot
    config: WarmPlanConfig
    seed: int


@st.composite
def families(draw: st.DrawFn, index: int) -> Family:
    count = draw(st.integers(1, 3))
    memories = sorted(draw(st.lists(st.integers(50, 450), min_size=count, max_size=count,
                                    unique=True)))
    accuracies = sorted(draw(st.lists(st.floats(0.3, 1.0), min_size=count, max_size=count)))
    latency = {"reference": draw(st.floats(1.0, 30.0)), "slow": draw(st.floats(1.0, 60.0))}
    name = f"f{index}"
    return make_family(name, [(f"{name}-v{j}", float(m), a)
                              for j, (m, a) in enumerate(zip(memories, accuracies, strict=True))],
                       compute_per_rps=draw(st.sampled_from([0.0, 2.0, 5.0])),
                       latency_ms=[latency] * count)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    fams = [draw(families(i)) for i in range(draw(st.integers(1, 3)))]
    servers = [Server(f"S{k}", draw(st.sampled_from(SITES)),
                      Resources({MEMORY_MB: float(draw(st.integers(500, 1500))),
                                 COMPUTE: float(draw(st.integers(100, 300)))}),
                      server_type=draw(st.sampled_from(SERVER_TYPES)))
               for k in range(draw(st.integers(2, 6)))]
    server_ids = [s.server_id for s in servers]
    apps = []
    for i in range(draw(st.integers(1, 8))):
        apps.append(Application(
            f"a{i}", draw(st.sampled_from(fams)).name,
            critical=draw(st.booleans()),
            max_rate_rps=float(draw(st.integers(1, 10))),
            latency_slo_ms=draw(st.none() | st.floats(5.0, 60.0)),
            excluded_servers=frozenset(draw(st.lists(st.sampled_from(server_ids), max_size=2))),
            allowed_backup_sites=draw(st.none() | st.frozensets(st.sampled_from(SITES),
                                                                 min_size=1)),
            warm_replicas=draw(st.none() | st.integers(0, 2))))
    # Primaries memory worst-fit in a drawn order; apps that fit nowhere stay without one.
    bare = make_snapshot(fams, servers, apps)
    free = dict(bare.free)
    placements = []
    for app in draw(st.permutations(apps)):
        variant = bare.primary_variant(app)
        demand = variant.demand(app.max_rate_rps)
        fitting = [s for s in server_ids if demand.fits_within(free[s])]
        if fitting:
            server_id = max(fitting, key=lambda s: (free[s][MEMORY_MB], s))
            free[server_id] = free[server_id] - demand
            placements.append(Placement(app.app_id, server_id, variant.name, Role.PRIMARY))
    config = WarmPlanConfig(alpha=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
                            replicas=draw(st.integers(0, 3)),
                            site_independent=draw(st.booleans()))
    return Case(bare.with_placements(placements), config, draw(st.integers(0, 2**16)))


def baselines(case: Case) -> list[FailoverPolicy]:
    return [FullSizeWarm(case.config), FullSizeCold(seed=case.seed),
            FullSizeWarmK(case.config, seed=case.seed)]


def apply_warm(snapshot: ClusterSnapshot, plan: WarmPlan) -> ClusterSnapshot:
    """Replace the warm backups by the plan's; the snapshot re-validates every capacity."""
    kept = [p for p in snapshot.placements if p.role is not Role.WARM]
    new = [Placement(a.app_id, a.server_id, a.variant, Role.WARM) for a in plan.assignments]
    return snapshot.with_placements(kept + new)


def check_warm_plan(policy: FailoverPolicy, case: Case, plan: WarmPlan) -> None:
    snapshot = case.snapshot
    applied = apply_warm(snapshot, plan)
    for server in snapshot.live_servers():
        assert applied.used[server.server_id].fits_within(server.capacity)
    wanted: dict[str, int] = {}
    for app in snapshot.apps:
        tried = app.critical or isinstance(policy, FullSizeWarm)
        if tried and not isinstance(policy, FullSizeCold):
            count = case.config.replicas if app.warm_replicas is None else app.warm_replicas
            wanted[app.app_id] = count
    placed = Counter(a.app_id for a in plan.assignments)
    for a in plan.assignments:
        app = snapshot.app_by_id[a.app_id]
        server = snapshot.server_by_id[a.server_id]
        variant = snapshot.primary_variant(app)
        primary = snapshot.primary_by_app[a.app_id]
        assert a.app_id in wanted and a.variant == variant.name
        assert a.server_id != primary.server_id
        if case.config.site_independent:
            assert server.site_id != snapshot.site_of(primary.server_id)
        if app.latency_slo_ms is not None:
            assert variant.latency_on(server) <= app.latency_slo_ms + EPS
        assert app.may_back_up_on(server)
    for app_id in wanted:
        backups = [a for a in plan.assignments if a.app_id == app_id]
        assert len({a.server_id for a in backups}) == len(backups) <= wanted[app_id]
        if case.config.site_independent:
            sites = [snapshot.site_of(a.server_id) for a in backups]
            assert len(set(sites)) == len(sites)
    short = {app_id for app_id, want in wanted.items() if placed[app_id] < want}
    assert {u.app_id for u in plan.uncovered} == short
    for u in plan.uncovered:
        assert u.wanted == wanted[u.app_id] and u.placed == placed[u.app_id] and u.reason
    if isinstance(policy, FullSizeWarmK):
        free = total(snapshot.free.values())  # the drawn snapshots hold no warm backups
        used = total(snapshot.primary_variant(snapshot.app_by_id[a.app_id]).demand(
            snapshot.app_by_id[a.app_id].max_rate_rps) for a in plan.assignments)
        assert used.fits_within(free.scaled(1.0 - case.config.alpha) + {MEMORY_MB: EPS})


def check_failover_plan(snapshot: ClusterSnapshot, failed: frozenset[str],
                        plan: FailoverPlan) -> None:
    affected = {a for a, p in snapshot.primary_by_app.items() if p.server_id in failed}
    ids = ([s.app_id for s in plan.warm_switches] + [r.app_id for r in plan.recoveries]
           + [u.app_id for u in plan.unrecoverable])
    assert len(ids) == len(set(ids)) and set(ids) == affected
    assert plan.failed_servers == failed
    warm = {(p.app_id, p.server_id, p.variant) for p in snapshot.placements
            if p.role is Role.WARM}
    for s in plan.warm_switches:
        assert s.server_id not in failed and (s.app_id, s.server_id, s.variant) in warm
    for r in plan.recoveries:
        app = snapshot.app_by_id[r.app_id]
        full = snapshot.primary_variant(app).name
        assert r.server_id not in failed
        assert r.interim_variant == r.target_variant == full
        assert app.may_back_up_on(snapshot.server_by_id[r.server_id])
    after = snapshot.with_failed(failed)
    loads = [Placement(r.app_id, r.server_id, r.target_variant, Role.INTERIM)
             for r in plan.recoveries]
    after.with_placements(after.placements + tuple(loads))  # raises on any over-commit


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_warm_plans_respect_capacity_independence_slo_and_exclusions(case: Case) -> None:
    for policy in baselines(case):
        check_warm_plan(policy, case, policy.plan_warm(case.snapshot))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), data=st.data())
def test_failover_plans_recover_each_affected_app_once_on_live_servers(
        case: Case, data: st.DataObject) -> None:
    server_ids = [s.server_id for s in case.snapshot.servers]
    failed = frozenset(data.draw(st.lists(st.sampled_from(server_ids), min_size=1,
                                          max_size=len(server_ids))))
    for policy in baselines(case):
        snapshot = apply_warm(case.snapshot, policy.plan_warm(case.snapshot))
        plan = policy.plan_failover(snapshot, failed)
        check_failover_plan(snapshot, failed, plan)
        assert plan == policy.plan_failover(snapshot, failed)  # pure: same input, same plan
