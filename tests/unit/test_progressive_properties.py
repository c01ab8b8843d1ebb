"""Property tests of the progressive-failover heuristic on random small clusters.

What is checked, for every generated cluster and configuration:

* each requested app appears exactly once, recovered or unrecoverable;
* recoveries use live servers only, respect the SLO and the exclusion list, never use a
  variant larger or more accurate than the primary unless the app allows it, and use as
  interim the smallest variant the app may use that meets the SLO there;
* no server is over-committed on any resource, neither in the steady state nor at any moment
  of the load/upgrade sequence (worst case over the order of the upgrades on a server), and
  the orchestrator's own action order (``FailoverPlan.actions``) stays within capacity;
* an app is unrecoverable only if, with what the plan finally uses, *no* variant it may use
  fits on *any* live server it may use within its SLO (apps given up are tried again after
  an upgrade pass that freed capacity, so this holds with upgrades too);
* the upgrade pass reaches a fixpoint: no recovered app could still move to a more accurate
  variant on its server;
* the fast implementation returns exactly what the direct reference implementation
  (``policies/progressive_reference.py``) returns.

Memory is whole MB and compute a multiple of 1/8 %, so the two implementations' sums agree
to the bit even though they add in different orders.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.actions import FailoverPlan, LoadVariant, ProgressivePlan, UnloadVariant
from policies.config import ProgressiveConfig
from policies.model import Application, ClusterSnapshot, Family, Server, Variant
from policies.progressive import plan_progressive
from policies.progressive_reference import reference_plan_progressive
from policies.replica_rules import may_use_variant
from policies.resources import COMPUTE, MEMORY_MB, Resources
from tests.unit.builders import make_family, make_server, make_snapshot

EPS = 1e-9
SITES = ("s1", "s2", "s3")
SERVER_TYPES = ("reference", "slow", "other")  # "other" is unlisted: reference / speed


@dataclass(frozen=True)
class Case:
    snapshot: ClusterSnapshot
    app_ids: tuple[str, ...]
    config: ProgressiveConfig


@st.composite
def families(draw: st.DrawFn, index: int, monotone: bool) -> Family:
    count = draw(st.integers(1, 4))
    memory = sorted(draw(st.lists(st.integers(20, 600), min_size=count, max_size=count,
                                  unique=True)))
    accuracy = draw(st.lists(st.floats(0.05, 1.0), min_size=count, max_size=count))
    per_rps = [k / 8 for k in draw(st.lists(st.integers(0, 16), min_size=count,
                                            max_size=count))]
    if monotone:
        per_rps.sort()
    latency = [{"reference": float(draw(st.integers(1, 40))),
                "slow": float(draw(st.integers(1, 80)))} for _ in range(count)]
    name = f"f{index}"
    return make_family(name, [(f"{name}-v{j}", float(m), a)
                              for j, (m, a) in enumerate(zip(memory, accuracy, strict=True))],
                       compute_per_rps=per_rps, latency_ms=latency)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    monotone = draw(st.booleans())  # every family's demand grows with variant size
    fams = [draw(families(i, monotone)) for i in range(draw(st.integers(1, 3)))]
    servers = [make_server(f"S{k}", float(draw(st.integers(0, 1500))),
                           site=draw(st.sampled_from(SITES)),
                           compute=float(draw(st.integers(0, 60))),
                           server_type=draw(st.sampled_from(SERVER_TYPES)),
                           speed=draw(st.sampled_from([1.0, 2.0])))
               for k in range(draw(st.integers(0, 6)))]
    # Failed servers; the big one holds every primary so that the snapshot is valid.
    failed = [make_server("dead-big", 1e6, compute=1e6, site=draw(st.sampled_from(SITES)))]
    fail_one: bool = draw(st.booleans())
    if servers and fail_one:
        failed.append(servers.pop())
    server_ids = [s.server_id for s in [*servers, *failed]]
    apps = []
    for i in range(draw(st.integers(1, 8))):
        family = draw(st.sampled_from(fams))
        apps.append(Application(
            f"a{i}", family.name, critical=draw(st.booleans()),
            max_rate_rps=float(draw(st.integers(1, 10))),
            latency_slo_ms=draw(st.none() | st.integers(2, 60).map(float)),
            primary_variant=draw(st.none() | st.sampled_from([v.name for v in family.variants])),
            allow_larger_backups=draw(st.booleans()),
            excluded_servers=frozenset(draw(st.lists(st.sampled_from(server_ids), max_size=2))),
            excluded_sites=frozenset(draw(st.lists(st.sampled_from(SITES), max_size=1))),
            allowed_backup_sites=draw(st.none() | st.frozensets(st.sampled_from(SITES),
                                                                min_size=1))))
    snapshot = make_snapshot(fams, [*servers, *failed], apps,
                             failed=[s.server_id for s in failed])
    ids = draw(st.lists(st.sampled_from([a.app_id for a in apps]), min_size=1, max_size=10))
    config = ProgressiveConfig(upgrade=draw(st.booleans()),
                               order=draw(st.sampled_from(["priority", "input"])))
    return Case(snapshot, tuple(ids), config)


# --- helpers ------------------------------------------------------------------------------------


def variants_of(snapshot: ClusterSnapshot, app: Application) -> tuple[Variant, ...]:
    return snapshot.families[app.family].variants


def meets_slo(app: Application, variant: Variant, server: Server) -> bool:
    return app.latency_slo_ms is None or variant.latency_on(server) <= app.latency_slo_ms


def demand(snapshot: ClusterSnapshot, app_id: str, variant: str) -> Resources:
    app = snapshot.app_by_id[app_id]
    return snapshot.families[app.family].variant(variant).demand(app.max_rate_rps)


def peak(loads: list[tuple[Resources, Resources]]) -> dict[str, float]:
    """Worst moment over every upgrade order: Σ max(i, t) + max over upgrading of min(i, t)."""
    out: dict[str, float] = defaultdict(float)
    names = {r for i, t in loads for r in (*i, *t)}
    for r in names:
        steady = sum(max(i[r], t[r]) for i, t in loads)
        extra = max((min(i[r], t[r]) for i, t in loads if i is not t), default=0.0)
        out[r] = steady + extra
    return out


def server_loads(case: Case, plan: ProgressivePlan,
                 replace: tuple[str, str] | None = None) -> dict[str, list[tuple[Resources,
                                                                                  Resources]]]:
    """(interim, target) demands per server; ``replace`` = (app, variant) swaps one target."""
    loads: dict[str, list[tuple[Resources, Resources]]] = defaultdict(list)
    for r in plan.recoveries:
        target = replace[1] if replace and replace[0] == r.app_id else r.target_variant
        interim = demand(case.snapshot, r.app_id, r.interim_variant)
        loads[r.server_id].append(
            (interim, interim if target == r.interim_variant
             else demand(case.snapshot, r.app_id, target)))
    return loads


def within(free: Resources, used: dict[str, float]) -> bool:
    return all(v <= free[r] + EPS for r, v in used.items())


def fits_with(case: Case, plan: ProgressivePlan, server_id: str,
              extra: tuple[Resources, Resources] | None = None,
              replace: tuple[str, str] | None = None) -> bool:
    loads = server_loads(case, plan, replace)[server_id]
    return within(case.snapshot.free[server_id], peak(loads + ([extra] if extra else [])))


# --- properties -------------------------------------------------------------------------------

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases())
def test_every_app_once_on_a_live_allowed_fast_enough_server(case: Case) -> None:
    snapshot = case.snapshot
    plan = plan_progressive(snapshot, case.app_ids, case.config)
    seen = [r.app_id for r in plan.recoveries] + [u.app_id for u in plan.unrecoverable]
    assert sorted(seen) == sorted(set(case.app_ids))
    for r in plan.recoveries:
        app, server = snapshot.app_by_id[r.app_id], snapshot.server_by_id[r.server_id]
        assert r.server_id in snapshot.free and r.server_id not in snapshot.failed_servers
        assert app.may_back_up_on(server)
        family = snapshot.families[app.family]
        interim, target = family.index(r.interim_variant), family.index(r.target_variant)
        assert interim <= target
        assert may_use_variant(snapshot, app, family.variants[target])
        assert meets_slo(app, family.variants[target], server)
        first_ok = min(j for j, v in enumerate(family.variants)
                       if may_use_variant(snapshot, app, v) and meets_slo(app, v, server))
        assert interim == first_ok


@SETTINGS
@given(cases())
def test_no_server_is_ever_over_committed(case: Case) -> None:
    plan = plan_progressive(case.snapshot, case.app_ids, case.config)
    for server_id, loads in server_loads(case, plan).items():
        free = case.snapshot.free[server_id]
        assert within(free, peak(loads))
        if all(i.fits_within(t) for i, t in loads):  # the brief's form: Σ targets + max interim
            targets = {r: sum(t[r] for _, t in loads)
                       + max((i[r] for i, t in loads if i is not t), default=0.0)
                       for r in (MEMORY_MB, COMPUTE)}
            assert within(free, targets)
    # The orchestrator's own order: all interims, then upgrade / unload per app.
    failover = FailoverPlan(failed_servers=case.snapshot.failed_servers, warm_switches=(),
                            recoveries=plan.recoveries, unrecoverable=plan.unrecoverable)
    loaded: dict[str, dict[tuple[str, str], Resources]] = defaultdict(dict)
    for action in failover.actions():
        if isinstance(action, LoadVariant):
            replicas = loaded[action.server_id]
            replicas[(action.app_id, action.variant)] = demand(case.snapshot, action.app_id,
                                                               action.variant)
            total = {r: sum(d[r] for d in replicas.values()) for r in (MEMORY_MB, COMPUTE)}
            assert within(case.snapshot.free[action.server_id], total)
        elif isinstance(action, UnloadVariant):
            del loaded[action.server_id][(action.app_id, action.variant)]


@SETTINGS
@given(cases())
def test_unrecoverable_only_when_nothing_it_may_use_fits_anywhere(case: Case) -> None:
    snapshot = case.snapshot
    plan = plan_progressive(snapshot, case.app_ids, case.config)
    for lost in plan.unrecoverable:
        app = snapshot.app_by_id[lost.app_id]
        family = snapshot.families[app.family]
        usable = [may_use_variant(snapshot, app, v) for v in family.variants]
        for server_id in snapshot.free:
            server = snapshot.server_by_id[server_id]
            if not app.may_back_up_on(server):
                continue
            for j in range(len(family.variants)):
                if not usable[j] or not meets_slo(app, family.variants[j], server):
                    continue
                interim = next(i for i in range(j + 1)
                               if usable[i] and meets_slo(app, family.variants[i], server))
                pair = (demand(snapshot, app.app_id, family.variants[interim].name),
                        demand(snapshot, app.app_id, family.variants[j].name))
                assert not fits_with(case, plan, server_id, extra=pair), (lost, server_id, j)


@SETTINGS
@given(cases())
def test_upgrade_pass_leaves_no_feasible_upgrade(case: Case) -> None:
    if not case.config.upgrade:
        return
    snapshot = case.snapshot
    plan = plan_progressive(snapshot, case.app_ids, case.config)
    for r in plan.recoveries:
        app, server = snapshot.app_by_id[r.app_id], snapshot.server_by_id[r.server_id]
        family = snapshot.families[app.family]
        current = family.variant(r.target_variant)
        for variant in family.variants[family.index(current.name) + 1:]:
            if (variant.accuracy > current.accuracy and may_use_variant(snapshot, app, variant)
                    and meets_slo(app, variant, server)):
                assert not fits_with(case, plan, r.server_id,
                                     replace=(r.app_id, variant.name)), (r, variant.name)


@SETTINGS
@given(cases())
def test_fast_implementation_equals_the_reference(case: Case) -> None:
    fast = plan_progressive(case.snapshot, case.app_ids, case.config)
    ref = reference_plan_progressive(case.snapshot, case.app_ids, case.config)
    assert fast.recoveries == ref.recoveries
    assert [u.app_id for u in fast.unrecoverable] == [u.app_id for u in ref.unrecoverable]
    assert fast.demand_ratio == ref.demand_ratio
