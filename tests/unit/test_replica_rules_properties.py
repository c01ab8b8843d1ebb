"""Warm and progressive plans against brute force on small random clusters (issue 21).

Instances: 2-4 servers in 1-2 sites (sometimes one failed), 1-5 apps of 1-2 families with 2-3
variants each (accuracy not monotone in size), primary variants, latency SLOs, exclusion
lists, pins (to the primary's site or server), ``allow_larger_backups``, and replicas the
snapshot already lists: COLD ones (not counted, possibly of the variant a plan picks: issue
21's bug (a)) and WARM ones (counted, possibly breaking a rule now).

Warm plan (ILP "full" and "decomposed", and the heuristic): every plan passes the independent
checker (``warm_check``: capacity, α budget, independence, SLO, exclusions, pins, never above
the primary), applies to its snapshot (``with_warm_plan``) without an error, and reports
every app short of backups with a reason. For the ILP with one backup per app, the number of
backups and then Σ accuracy × rate equal the best of an exhaustive enumeration of every
assignment the checker accepts.

Progressive plan (after failing some servers): every affected app once; targets and interims
on live servers the pin and the exclusion list allow, meeting the SLO, never above the
primary unless allowed, the interim the smallest usable variant meeting the SLO; no server
over-committed at any moment of the upgrades; an app is unrecoverable only when brute force
finds no (server, variant) it may use that fits beside what the plan finally places (the
greedy is not globally optimal, so that is the property: nothing was left that fits); and
the fast implementation equals the reference.

Memory is a multiple of 50 MB and compute a multiple of 1/4 %, so sums are exact.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.actions import SolveStats, WarmAssignment, WarmPlan
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.failover import affected_app_ids, with_warm_plan
from policies.model import Application, ClusterSnapshot, Family, Placement, Role
from policies.progressive import plan_progressive
from policies.progressive_reference import reference_plan_progressive
from policies.replica_rules import may_hold_replica, may_use_variant
from policies.resources import Resources
from policies.warm_candidates import warm_capacity
from policies.warm_check import warm_plan_violations
from policies.warm_ilp import plan_warm_backups
from tests.unit.builders import make_app, make_family, make_server, make_snapshot

EPS = 1e-6
SOMETIMES = st.sampled_from([False, False, False, True])
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@dataclass(frozen=True)
class Instance:
    snapshot: ClusterSnapshot
    config: WarmPlanConfig


@st.composite
def families(draw: st.DrawFn, name: str) -> Family:
    count = draw(st.integers(2, 3))
    memory = sorted(draw(st.lists(st.integers(1, 8), min_size=count, max_size=count,
                                  unique=True)))
    accuracy = draw(st.lists(st.integers(50, 100), min_size=count, max_size=count))
    best = max(accuracy)
    per_rps = [draw(st.integers(0, 4)) / 4 for _ in range(count)]
    latency = [float(draw(st.integers(1, 12))) for _ in range(count)]
    return make_family(name, [(f"{name}{j}", 50.0 * m, a / best)
                              for j, (m, a) in enumerate(zip(memory, accuracy, strict=True))],
                       compute_per_rps=per_rps, latency_ms=latency)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    fams = [draw(families(name)) for name in ("f", "g")[:draw(st.integers(1, 2))]]
    two_sites = draw(st.booleans())
    count = draw(st.integers(2, 4))
    ids = [f"s{k}" for k in range(count)]
    sites = {s: draw(st.sampled_from(["x", "y"])) if two_sites else "x" for s in ids}
    speed = {s: draw(st.sampled_from([0.5, 1.0, 2.0])) for s in ids}
    used: dict[str, Resources] = {s: Resources() for s in ids}
    apps: list[Application] = []
    placements: list[Placement] = []
    for i in range(draw(st.integers(1, 5))):
        family = draw(st.sampled_from(fams))
        names = [v.name for v in family.variants]
        home = draw(st.sampled_from(ids))
        pin = draw(st.sampled_from(["none", "none", "none", "site", "server"]))
        app = make_app(
            f"a{i}", family, critical=i == 0 or draw(st.booleans()),
            max_rate_rps=float(draw(st.integers(1, 4))),
            latency_slo_ms=draw(st.none() | st.sampled_from([4.0, 8.0, 16.0])),
            primary_variant=draw(st.none() | st.sampled_from(names)),
            allow_larger_backups=draw(SOMETIMES),
            pinned_site=sites[home] if pin == "site" else None,
            pinned_server=home if pin == "server" else None,
            excluded_servers={draw(st.sampled_from(ids))} if draw(SOMETIMES) else set())
        apps.append(app)
        primary = (family.variant(app.primary_variant) if app.primary_variant
                   else family.most_accurate)
        placements.append(Placement(app.app_id, home, primary.name, Role.PRIMARY))
        used[home] = used[home] + primary.demand(app.max_rate_rps)
        taken = {(home, primary.name)}
        for role in draw(st.lists(st.sampled_from([Role.COLD, Role.WARM]), max_size=2)):
            where, name = draw(st.sampled_from(ids)), draw(st.sampled_from(names))
            if (where, name) in taken or (role is Role.WARM and where == home):
                continue
            taken.add((where, name))
            placements.append(Placement(app.app_id, where, name, role))
            if role is Role.WARM:
                used[where] = used[where] + family.variant(name).demand(app.max_rate_rps)
    servers = [make_server(s, used[s].get("memory_mb", 0.0) + 50.0 * draw(st.integers(0, 24)),
                           site=sites[s], speed=speed[s],
                           compute=used[s].get("compute", 0.0) + float(draw(st.integers(0, 40))))
               for s in ids]
    failed = [draw(st.sampled_from(ids))] if draw(SOMETIMES) else []
    return make_snapshot(fams, servers, apps, placements=placements, failed=failed)


@st.composite
def instances(draw: st.DrawFn, replicas: tuple[int, ...] = (1, 1, 2)) -> Instance:
    snapshot = draw(clusters())
    config = WarmPlanConfig(alpha=draw(st.sampled_from([0.0, 0.1, 0.5])),
                            site_independent=draw(st.sampled_from([None, True, False])),
                            replicas=draw(st.sampled_from(replicas)), mip_rel_gap=0.0)
    return Instance(snapshot, config)


# --- warm plan --------------------------------------------------------------------------------


def assignment_plan(assignments: tuple[WarmAssignment, ...]) -> WarmPlan:
    return WarmPlan(assignments, (), SolveStats("brute", "none", "ok", 0.0))


def brute_force(snapshot: ClusterSnapshot, config: WarmPlanConfig) -> tuple[int, float]:
    """Most backups, then most Σ accuracy × rate, over every assignment (R = 1).

    Each app's options are the single backups the checker accepts alone; the apps then only
    share the servers' room and the α budget, which a depth-first search tracks, pruning a
    branch that cannot beat the best found.
    """
    free = warm_capacity(snapshot)
    budget = Resources({r: v * (1.0 - config.alpha) for r, v in
                        sum(free.values(), Resources()).items()})
    options: list[list[tuple[float, str, Resources]]] = []
    for app in snapshot.apps:
        mine = []
        for variant in snapshot.family_of(app).variants:
            for server in free:
                single = (WarmAssignment(app.app_id, server, variant.name, variant.accuracy),)
                if not warm_plan_violations(snapshot, assignment_plan(single), config):
                    mine.append((variant.accuracy * app.max_rate_rps, server,
                                 variant.demand(app.max_rate_rps)))
        if mine:
            options.append(sorted(mine, key=lambda o: -o[0]))
    best = (0, 0.0)
    room = dict(free)

    def search(i: int, count: int, value: float, left: Resources) -> None:
        nonlocal best
        if (count + len(options) - i, value + sum(o[0][0] for o in options[i:]) + EPS) <= best:
            return
        if i == len(options):
            best = max(best, (count, value))
            return
        for gain, server, demand in options[i]:
            slack = {r: EPS for r in demand}
            if demand.fits_within(room[server] + slack) and demand.fits_within(left + slack):
                room[server] = room[server] - demand
                search(i + 1, count + 1, value + gain, left - demand)
                room[server] = room[server] + demand
        search(i + 1, count, value, left)

    search(0, 0, 0.0, budget)
    return best


def check_warm_plan(instance: Instance, method: str) -> WarmPlan:
    snapshot, config = instance.snapshot, instance.config.model_copy(update={"method": method})
    plan = plan_warm_backups(snapshot, config)
    assert warm_plan_violations(snapshot, plan, config) == []
    with_warm_plan(snapshot, plan)  # no DuplicateIdError over a COLD replica (bug (a))
    for app in snapshot.apps:
        if not app.critical:
            continue
        got = len(plan.for_app(app.app_id))
        listed = [u for u in plan.uncovered if u.app_id == app.app_id]
        assert (got < app.backups_wanted(config.replicas)) == bool(listed)
        assert all(u.reason and u.placed == got for u in listed)
    return plan


@SETTINGS
@given(instances())
def test_ilp_full_plans_obey_every_rule(instance: Instance) -> None:
    check_warm_plan(instance, "full")


@SETTINGS
@given(instances())
def test_ilp_decomposed_plans_obey_every_rule(instance: Instance) -> None:
    check_warm_plan(instance, "decomposed")


@SETTINGS
@given(instances())
def test_heuristic_plans_obey_every_rule(instance: Instance) -> None:
    check_warm_plan(instance, "heuristic")


@SETTINGS
@given(instances(replicas=(1,)))
def test_ilp_plans_equal_brute_force(instance: Instance) -> None:
    config = instance.config.model_copy(update={"keep_current_bonus": 0.0})
    count, value = brute_force(instance.snapshot, config)
    for method in ("full", "decomposed"):
        plan = check_warm_plan(Instance(instance.snapshot, config), method)
        assert len(plan.assignments) == count, method
        assert abs(plan.stats.objective - value) <= 1e-6 * max(1.0, value), method


# --- progressive plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    after: ClusterSnapshot
    affected: tuple[str, ...]
    config: ProgressiveConfig


@st.composite
def failures(draw: st.DrawFn) -> Failure:
    snapshot = draw(clusters())
    ids = sorted(snapshot.server_by_id)
    failed = draw(st.sets(st.sampled_from(ids), min_size=1, max_size=len(ids) - 1))
    after = snapshot.with_failed(failed)
    config = ProgressiveConfig(upgrade=draw(st.booleans()),
                               order=draw(st.sampled_from(["priority", "input"])))
    return Failure(after, affected_app_ids(after), config)


def demand(snapshot: ClusterSnapshot, app: Application, variant: str) -> Resources:
    return snapshot.family_of(app).variant(variant).demand(app.max_rate_rps)


def peak_fits(snapshot: ClusterSnapshot, server: str,
              loads: list[tuple[Resources, Resources]]) -> bool:
    """Σ max(interim, target) + the largest min(interim, target) of one upgrading app."""
    free = snapshot.free[server]
    names = {r for pair in loads for d in pair for r in d}
    for r in names:
        steady = sum(max(i[r], t[r]) for i, t in loads)
        extra = max((min(i[r], t[r]) for i, t in loads if i is not t), default=0.0)
        if steady + extra > free[r] + 1e-9:
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(failures())
def test_progressive_plans_obey_every_rule_and_leave_nothing_that_fits(case: Failure) -> None:
    after = case.after
    plan = plan_progressive(after, case.affected, case.config)
    reference = reference_plan_progressive(after, case.affected, case.config)
    assert plan.recoveries == reference.recoveries
    assert [u.app_id for u in plan.unrecoverable] == [u.app_id for u in reference.unrecoverable]
    seen = [r.app_id for r in plan.recoveries] + [u.app_id for u in plan.unrecoverable]
    assert sorted(seen) == sorted(case.affected)

    loads: dict[str, list[tuple[Resources, Resources]]] = defaultdict(list)
    for r in plan.recoveries:
        app, server = after.app_by_id[r.app_id], after.server_by_id[r.server_id]
        variants = after.family_of(app).variants
        target, interim = after.family_of(app).variant(r.target_variant), \
            after.family_of(app).variant(r.interim_variant)
        assert r.server_id in after.free and may_hold_replica(after, app, server)
        assert may_use_variant(after, app, target) and may_use_variant(after, app, interim)
        assert app.meets_slo(target, server)
        assert interim == next(v for v in variants if may_use_variant(after, app, v)
                               and app.meets_slo(v, server))
        i, t = demand(after, app, r.interim_variant), demand(after, app, r.target_variant)
        loads[r.server_id].append((i, i if r.interim_variant == r.target_variant else t))
    for server, pairs in loads.items():
        assert peak_fits(after, server, pairs)

    for lost in plan.unrecoverable:
        app = after.app_by_id[lost.app_id]
        assert lost.reason
        usable = [v for v in after.family_of(app).variants if may_use_variant(after, app, v)]
        for server_id in after.free:
            server = after.server_by_id[server_id]
            if not may_hold_replica(after, app, server):
                continue
            for target in usable:
                if not app.meets_slo(target, server):
                    continue
                interim = next(v for v in usable if app.meets_slo(v, server))
                pair = (interim.demand(app.max_rate_rps), target.demand(app.max_rate_rps))
                if interim is target:
                    pair = (pair[0], pair[0])
                assert not peak_fits(after, server_id, [*loads[server_id], pair]), (
                    lost, server_id, target.name)
