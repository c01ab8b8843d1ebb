"""Hand-computed outcomes of split_affected, the Understudy policy and the §5.1 baselines."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import policies.failover as failover_mod
from policies.actions import (
    FailoverPlan,
    ProgressivePlan,
    ProgressiveRecovery,
    SolveStats,
    UncoveredApp,
    Unrecoverable,
    WarmAssignment,
    WarmPlan,
    WarmSwitch,
)
from policies.baselines import FullSizeCold, FullSizeWarm, FullSizeWarmK
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.errors import InvalidInputError, UnknownReferenceError
from policies.failover import UnderstudyPolicy, split_affected
from policies.model import Application, ClusterSnapshot, Family, Placement, Role, Server
from policies.policy import FailoverPolicy
from policies.resources import MEMORY_MB
from tests.unit.builders import (
    make_app,
    make_family,
    make_server,
    make_snapshot,
    placement,
    primary_placements,
)

# Latency 10 ms on the reference GPU, 50 ms on a "slow" server.
LATENCY = {"reference": 10.0, "slow": 50.0}
FAM = make_family("fam", [("fam-s", 100, 0.7), ("fam-m", 200, 0.85), ("fam-l", 400, 1.0)],
                  latency_ms=[LATENCY] * 3)
BIG = make_family("big", [("big-s", 300, 0.8), ("big-l", 600, 1.0)], latency_ms=[LATENCY] * 2)


def same_site(**kwargs: object) -> WarmPlanConfig:
    """Site independence off: the scenarios span two sites, where it is on by default, and
    most cases here are about something else."""
    return WarmPlanConfig.model_validate({"site_independent": False, **kwargs})


def warm(app_id: str, server_id: str, variant: str) -> Placement:
    return placement(app_id, server_id, variant, Role.WARM)


def snap(families: Sequence[Family], servers: Sequence[Server], apps: Sequence[Application],
         placements: Sequence[Placement] = (), *,
         primaries: dict[str, str]) -> ClusterSnapshot:
    """A snapshot with each app's primary on the server ``primaries`` names, plus ``placements``."""
    return make_snapshot(families, servers, apps, placements=[
        *primary_placements(families, apps, primaries), *placements])


def apply_warm(snapshot: ClusterSnapshot, plan: WarmPlan) -> ClusterSnapshot:
    """The snapshot with its warm backups replaced by ``plan``'s (re-validated: no overcommit)."""
    kept = [p for p in snapshot.placements if p.role is not Role.WARM]
    new = [Placement(a.app_id, a.server_id, a.variant, Role.WARM) for a in plan.assignments]
    return snapshot.with_placements(kept + new)


def apply_failover(snapshot: ClusterSnapshot, plan: FailoverPlan) -> ClusterSnapshot:
    """The snapshot after the failure with every recovery's target loaded (re-validated)."""
    after = snapshot.with_failed(plan.failed_servers)
    loads = [Placement(r.app_id, r.server_id, r.target_variant, Role.INTERIM)
             for r in plan.recoveries]
    return after.with_placements(after.placements + tuple(loads))


def three_servers(*, slow_c: bool = False) -> tuple[Server, ...]:
    """A, B in site s1 and C in site s2, 1000 MB each; C may be a slow server type."""
    return (make_server("A", 1000, site="s1"), make_server("B", 1000, site="s1"),
            make_server("C", 1000, site="s2", server_type="slow" if slow_c else "reference"))


def k_scenario(*, k1: dict[str, object] | None = None, slow_c: bool = False) -> ClusterSnapshot:
    """k1 (fam, critical) on A, k2 (big, critical) on B, n1 (fam) on C: free 600/400/600."""
    apps = [make_app("k1", "fam", critical=True, **(k1 or {})),
            make_app("k2", "big", critical=True),
            make_app("n1", "fam")]
    return snap([FAM, BIG], three_servers(slow_c=slow_c), apps,
                         primaries={"k1": "A", "k2": "B", "n1": "C"})


# --- split_affected ------------------------------------------------------------------------


def split_scenario() -> ClusterSnapshot:
    servers = [make_server("A", 2000, site="s1"), make_server("B", 1000, site="s1"),
               make_server("C", 1000, site="s2")]
    apps = [make_app(a, "fam") for a in ("a1", "a2", "a3", "a4", "a5")]
    placements = [warm("a4", "A", "fam-s"),
                  warm("a1", "B", "fam-m"), warm("a5", "B", "fam-s"),
                  warm("a1", "C", "fam-s"), warm("a5", "C", "fam-s"), warm("a3", "C", "fam-m")]
    return snap([FAM], servers, apps, placements,
                         primaries={"a1": "A", "a2": "A", "a3": "B", "a4": "A", "a5": "A"})


def test_split_affected_picks_best_live_warm_and_lists_cold_apps() -> None:
    snapshot = split_scenario()
    assert snapshot.free["B"][MEMORY_MB] == 300 and snapshot.free["C"][MEMORY_MB] == 600
    after, switches, cold = split_affected(snapshot, ["A"])
    assert after.failed_servers == {"A"} and "A" not in after.free
    # a1: fam-m on B beats the less accurate fam-s on C; a5: equal accuracy, C has more free
    # memory; a4's only warm backup died with A; a2 has none; a3's primary is alive.
    assert switches == (WarmSwitch("a1", "B", "fam-m"), WarmSwitch("a5", "C", "fam-s"))
    assert cold == ("a2", "a4")


def test_split_affected_breaks_full_ties_by_server_id() -> None:
    servers = [make_server("A", 1000), make_server("C", 1000), make_server("B", 1000)]
    snapshot = snap([FAM], servers, [make_app("x", "fam")],
                             [warm("x", "C", "fam-s"), warm("x", "B", "fam-s")],
                             primaries={"x": "A"})
    assert split_affected(snapshot, {"A"}).warm_switches == (WarmSwitch("x", "B", "fam-s"),)


def test_split_affected_with_nothing_failed_changes_nothing() -> None:
    split = split_affected(split_scenario(), [])
    assert split.warm_switches == () and split.cold_app_ids == ()
    assert split.after.failed_servers == frozenset()


def test_split_affected_validates_failed_servers() -> None:
    with pytest.raises(UnknownReferenceError, match="Z"):
        split_affected(split_scenario(), ["A", "Z"])
    with pytest.raises(InvalidInputError, match="not the string"):
        split_affected(split_scenario(), "A")


def test_split_affected_includes_primaries_on_servers_failed_earlier() -> None:
    """A primary still on a server the snapshot already knew as failed is down too."""
    snapshot = split_scenario().with_failed(["B"])
    split = split_affected(snapshot, ["C"])
    assert split.after.failed_servers == {"B", "C"}
    assert split.warm_switches == () and split.cold_app_ids == ("a3",)


# --- the protocol --------------------------------------------------------------------------

ALL_POLICIES: Sequence[FailoverPolicy] = (UnderstudyPolicy(), FullSizeWarm(), FullSizeCold(),
                                          FullSizeWarmK())


def test_every_policy_meets_the_protocol_under_a_distinct_name() -> None:
    assert all(isinstance(p, FailoverPolicy) for p in ALL_POLICIES)
    names = [p.name for p in ALL_POLICIES]
    assert names == ["understudy", "full-size-warm", "full-size-cold", "full-size-warm-k"]


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.name)
def test_every_policy_rejects_unknown_failed_servers(policy: FailoverPolicy) -> None:
    with pytest.raises(UnknownReferenceError):
        policy.plan_failover(k_scenario(), ["A", "nope"])


# --- Full-Size-Warm ------------------------------------------------------------------------


def test_full_size_warm_places_k_first_then_others_worst_fit() -> None:
    snapshot = k_scenario()
    plan = FullSizeWarm(same_site()).plan_warm(snapshot)
    # k2 (600) first: A and C tie at 600 free -> A. k1 (400): B 400 / C 600 -> C.
    # n1 (400): not C (primary), A is full -> B.
    assert plan.assignments == (WarmAssignment("k2", "A", "big-l", 1.0),
                                WarmAssignment("k1", "C", "fam-l", 1.0),
                                WarmAssignment("n1", "B", "fam-l", 1.0))
    assert plan.uncovered == ()
    assert plan.stats == SolveStats(method="greedy", solver="none", status="ok", objective=3.0)
    apply_warm(snapshot, plan)  # re-validates: no server over-committed


def test_full_size_warm_replans_existing_warm_backups() -> None:
    snapshot = k_scenario()
    with_old = snapshot.with_placements(snapshot.placements + (warm("k1", "B", "fam-m"),))
    assert FullSizeWarm().plan_warm(with_old) == FullSizeWarm().plan_warm(snapshot)


def test_full_size_warm_site_independence_reports_uncovered_apps() -> None:
    plan = FullSizeWarm(WarmPlanConfig(site_independent=True)).plan_warm(k_scenario())
    # k2 and k1 live in s1, so only C (600 free) may hold their backups: k2 takes it.
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [("k2", "C"), ("n1", "A")]
    assert [(u.app_id, u.wanted, u.placed) for u in plan.uncovered] == [("k1", 1, 0)]
    assert "free capacity" in plan.uncovered[0].reason


def test_full_size_warm_failover_switches_or_gives_up() -> None:
    policy = FullSizeWarm(same_site())
    snapshot = apply_warm(k_scenario(), policy.plan_warm(k_scenario()))
    plan = policy.plan_failover(snapshot, ["A", "C"])
    # k1's backup was on C, which failed too; n1's backup on B is alive.
    assert plan.failed_servers == {"A", "C"}
    assert plan.warm_switches == (WarmSwitch("n1", "B", "fam-l"),)
    assert plan.recoveries == ()
    assert plan.unrecoverable == (Unrecoverable("k1", "no warm backup"),)


# --- Full-Size-Warm (K) --------------------------------------------------------------------


def test_full_size_warm_k_backs_up_only_k_within_the_budget() -> None:
    plan = FullSizeWarmK(same_site(alpha=0.1)).plan_warm(k_scenario())
    # Budget 0.9 * 1600 = 1440 MB: room for k2 (600) on A and k1 (400) on C; n1 is not in K.
    assert [(a.app_id, a.server_id, a.variant) for a in plan.assignments] == [
        ("k2", "A", "big-l"), ("k1", "C", "fam-l")]
    assert plan.uncovered == ()


def test_full_size_warm_k_alpha_reserve_leaves_k1_uncovered() -> None:
    plan = FullSizeWarmK(same_site(alpha=0.5)).plan_warm(k_scenario())
    # Budget 0.5 * 1600 = 800 MB: k2 takes 600, the 200 left cannot hold k1's 400.
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [("k2", "A")]
    assert len(plan.uncovered) == 1
    assert plan.uncovered[0].app_id == "k1" and "budget" in plan.uncovered[0].reason


def test_full_size_warm_k_places_r_replicas_on_distinct_servers() -> None:
    plan = FullSizeWarmK(same_site(alpha=0.0, replicas=2)).plan_warm(k_scenario())
    # k2: A then C (600 each); k1: B, then only C is left and it is full.
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [
        ("k2", "A"), ("k2", "C"), ("k1", "B")]
    assert plan.uncovered == (UncoveredApp("k1", 2, 1, plan.uncovered[0].reason),)


def test_full_size_warm_k_app_override_of_r() -> None:
    snapshot = k_scenario(k1={"warm_replicas": 0})
    plan = FullSizeWarmK(same_site(alpha=0.0, replicas=2)).plan_warm(snapshot)
    assert {a.app_id for a in plan.assignments} == {"k2"} and plan.uncovered == ()


def test_full_size_warm_k_site_independent_replicas_run_out_of_sites() -> None:
    config = WarmPlanConfig(alpha=0.0, replicas=2, site_independent=True)
    plan = FullSizeWarmK(config).plan_warm(k_scenario())
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [("k2", "C")]
    reasons = {u.app_id: (u.placed, u.reason) for u in plan.uncovered}
    assert reasons["k2"][0] == 1 and "independence" in reasons["k2"][1]
    assert reasons["k1"][0] == 0 and "free capacity" in reasons["k1"][1]


@pytest.mark.parametrize("k1", [{"latency_slo_ms": 20.0}, {"excluded_servers": {"C"}},
                                {"excluded_sites": {"s2"}}, {"allowed_backup_sites": {"s1"}}],
                         ids=["slo", "excluded-server", "excluded-site", "allowed-sites"])
def test_full_size_warm_k_respects_slo_and_exclusion_lists(k1: dict[str, object]) -> None:
    # Unconstrained, k1 goes to C (600 free): see test_full_size_warm_k_backs_up_only_k...
    snapshot = k_scenario(k1=k1, slow_c=True)
    plan = FullSizeWarmK(same_site(alpha=0.0)).plan_warm(snapshot)
    assert [(a.app_id, a.server_id) for a in plan.assignments] == [("k2", "A"), ("k1", "B")]


def test_warm_baselines_report_apps_without_a_live_primary() -> None:
    snapshot = k_scenario().with_failed(["A"])
    for policy in (FullSizeWarm(), FullSizeWarmK(WarmPlanConfig(alpha=0.0))):
        plan = policy.plan_warm(snapshot)
        assert "k1" not in {a.app_id for a in plan.assignments}
        assert UncoveredApp("k1", 1, 0, "the app has no live primary to back up") in (
            plan.uncovered)
        assert all(a.server_id != "A" for a in plan.assignments)


def test_full_size_warm_k_failover_switches_then_loads_critical_first() -> None:
    policy = FullSizeWarmK(same_site(alpha=0.1))
    snapshot = apply_warm(k_scenario(), policy.plan_warm(k_scenario()))  # k2->A, k1->C
    only_c = policy.plan_failover(snapshot, ["C"])
    assert only_c.warm_switches == () and only_c.unrecoverable == ()
    assert only_c.recoveries == (ProgressiveRecovery("n1", "B", "fam-l", "fam-l"),)

    only_b = policy.plan_failover(snapshot, ["B"])
    assert only_b.warm_switches == (WarmSwitch("k2", "A", "big-l"),) and only_b.recoveries == ()

    # A and C fail: k1 lost its primary and its backup; B (400 free) fits one: k1 first.
    both = policy.plan_failover(snapshot, ["A", "C"])
    assert both.warm_switches == ()
    assert both.recoveries == (ProgressiveRecovery("k1", "B", "fam-l", "fam-l"),)
    assert [u.app_id for u in both.unrecoverable] == ["n1"]
    assert "room" in both.unrecoverable[0].reason
    apply_failover(snapshot, both)


# --- Full-Size-Cold ------------------------------------------------------------------------


def cold_scenario() -> ClusterSnapshot:
    """A (2000) holds k1 (critical), n1, n2, n3; B has 400 MB free, C 600 MB."""
    servers = [make_server("A", 2000), make_server("B", 1000), make_server("C", 1000)]
    apps = [make_app("k1", "fam", critical=True), make_app("n1", "fam"), make_app("n2", "fam"),
            make_app("n3", "fam"), make_app("x", "big"), make_app("y", "fam")]
    return snap([FAM, BIG], servers, apps, primaries={
        "k1": "A", "n1": "A", "n2": "A", "n3": "A", "x": "B", "y": "C"})


def test_full_size_cold_plans_no_warm_backups() -> None:
    plan = FullSizeCold().plan_warm(cold_scenario())
    assert plan.assignments == () and plan.uncovered == ()
    assert plan.stats.method == "none" and plan.stats.objective == 0.0


@pytest.mark.parametrize(("seed", "lucky"), [(0, "n1"), (1, "n2"), (4, "n3")])
def test_full_size_cold_loads_critical_first_then_a_seeded_random_other(
        seed: int, lucky: str) -> None:
    plan = FullSizeCold(seed=seed).plan_failover(cold_scenario(), ["A"])
    # k1 -> C (600 free, worst-fit); one other fits B's 400 MB; C's 200 MB left fit nobody.
    # random.Random(0/1/4).shuffle(["n1", "n2", "n3"]) puts n1 / n2 / n3 first.
    assert plan.warm_switches == ()
    assert plan.recoveries == (ProgressiveRecovery("k1", "C", "fam-l", "fam-l"),
                               ProgressiveRecovery(lucky, "B", "fam-l", "fam-l"))
    assert sorted(u.app_id for u in plan.unrecoverable) == sorted(
        {"n1", "n2", "n3"} - {lucky})
    assert plan.affected_apps == {"k1", "n1", "n2", "n3"}
    apply_failover(cold_scenario(), plan)


def test_full_size_cold_order_is_deterministic_per_seed() -> None:
    snapshot = cold_scenario()
    for seed in range(10):
        assert (FullSizeCold(seed=seed).plan_failover(snapshot, ["A"])
                == FullSizeCold(seed=seed).plan_failover(snapshot, ["A"]))
    lucky = {FullSizeCold(seed=s).plan_failover(snapshot, ["A"]).recoveries[1].app_id
             for s in range(20)}
    assert lucky == {"n1", "n2", "n3"}


def test_full_size_cold_loads_larger_critical_apps_first() -> None:
    servers = [make_server("A", 2000), make_server("B", 1000), make_server("C", 1000)]
    apps = [make_app("k1", "fam", critical=True), make_app("kb", "big", critical=True),
            make_app("y", "fam")]
    snapshot = snap([FAM, BIG], servers, apps,
                             primaries={"k1": "A", "kb": "A", "y": "C"})
    plan = FullSizeCold().plan_failover(snapshot, ["A"])
    # kb (600) first -> B (1000 free); then k1 (400): B 400 / C 600 -> C.
    assert plan.recoveries == (ProgressiveRecovery("kb", "B", "big-l", "big-l"),
                               ProgressiveRecovery("k1", "C", "fam-l", "fam-l"))


def test_baselines_only_use_the_full_size_variant() -> None:
    """``full size`` is the app's primary variant, even when that is not the family's largest."""
    apps = [make_app("m", "fam", critical=True, primary_variant="fam-m")]
    servers = [make_server("A", 1000), make_server("B", 1000), make_server("C", 150)]
    snapshot = snap([FAM], servers, apps, primaries={"m": "A"})
    for policy in (FullSizeWarm(), FullSizeWarmK(WarmPlanConfig(alpha=0.0))):
        assert [(a.server_id, a.variant) for a in policy.plan_warm(snapshot).assignments] == [
            ("B", "fam-m")]
    plan = FullSizeCold().plan_failover(snapshot, ["A", "B"])
    # C (150 MB) would hold fam-s (100 MB), but baselines never shrink the model.
    assert plan.recoveries == ()
    assert plan.unrecoverable == (Unrecoverable("m", "no live server has room for full-size "
                                                     "'fam-m'"),)


def test_cold_recovery_respects_slo_and_exclusions() -> None:
    apps = [make_app("k1", "fam", critical=True, latency_slo_ms=20.0, excluded_servers={"B"})]
    servers = [make_server("A", 1000), make_server("B", 1000),
               make_server("C", 1000, server_type="slow")]
    snapshot = snap([FAM], servers, apps, primaries={"k1": "A"})
    plan = FullSizeCold().plan_failover(snapshot, ["A"])
    assert plan.recoveries == ()
    assert plan.unrecoverable[0].reason == (
        "no live server meets the latency SLO and the exclusion list")


# --- Understudy ----------------------------------------------------------------------------


def test_understudy_sends_cold_apps_of_the_after_snapshot_to_algorithm_1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[ClusterSnapshot, tuple[str, ...], ProgressiveConfig]] = []
    canned = ProgressivePlan(recoveries=(ProgressiveRecovery("a2", "C", "fam-s", "fam-l"),),
                             unrecoverable=(Unrecoverable("a4", "no room"),), demand_ratio=0.5)

    def fake(snapshot: ClusterSnapshot, app_ids: Sequence[str],
             config: ProgressiveConfig | None = None) -> ProgressivePlan:
        assert config is not None
        calls.append((snapshot, tuple(app_ids), config))
        return canned

    monkeypatch.setattr(failover_mod, "plan_progressive", fake)
    config = ProgressiveConfig(upgrade=False)
    snapshot = split_scenario()
    plan = UnderstudyPolicy(progressive=config).plan_failover(snapshot, ["A"])
    [(seen, app_ids, seen_config)] = calls
    assert seen.failed_servers == {"A"} and app_ids == ("a2", "a4") and seen_config == config
    # Warm backups of everybody stay loaded: the snapshot still holds them.
    assert {p for p in seen.placements if p.role is Role.WARM} == {
        p for p in snapshot.placements if p.role is Role.WARM}
    assert plan == FailoverPlan(frozenset({"A"}),
                                (WarmSwitch("a1", "B", "fam-m"), WarmSwitch("a5", "C", "fam-s")),
                                canned.recoveries, canned.unrecoverable,
                                notes=("demand ratio 0.500",))


def test_understudy_skips_algorithm_1_when_every_app_switches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> ProgressivePlan:
        raise AssertionError("plan_progressive must not run without cold apps")

    monkeypatch.setattr(failover_mod, "plan_progressive", boom)
    plan = UnderstudyPolicy().plan_failover(split_scenario(), ["C"])
    assert plan.warm_switches == () and plan.recoveries == () and plan.unrecoverable == ()


def test_understudy_plan_warm_is_the_ilp(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[WarmPlanConfig] = []
    canned = WarmPlan((), (), SolveStats("ilp", "highs", "optimal", 0.0))

    def fake(snapshot: ClusterSnapshot, config: WarmPlanConfig | None = None) -> WarmPlan:
        assert config is not None
        seen.append(config)
        return canned

    monkeypatch.setattr(failover_mod, "plan_warm_backups", fake)
    config = WarmPlanConfig(alpha=0.3, replicas=2)
    assert UnderstudyPolicy(warm=config).plan_warm(k_scenario()) is canned
    assert seen == [config]


@pytest.mark.parametrize("failed", [["A"], ["B"], ["C"], ["A", "C"], ["A", "B", "C"]])
def test_understudy_end_to_end_recovers_each_affected_app_once(failed: list[str]) -> None:
    """Runs the real ILP and Algorithm 1."""
    policy = UnderstudyPolicy(warm=WarmPlanConfig(alpha=0.1, time_limit_s=10.0))
    snapshot = apply_warm(cold_scenario(), policy.plan_warm(cold_scenario()))
    plan = policy.plan_failover(snapshot, failed)
    affected = {a for a, p in snapshot.primary_by_app.items() if p.server_id in failed}
    ids = ([s.app_id for s in plan.warm_switches] + [r.app_id for r in plan.recoveries]
           + [u.app_id for u in plan.unrecoverable])
    assert sorted(ids) == sorted(affected)
    assert all(s.server_id not in failed for s in plan.warm_switches)
    assert all(r.server_id not in failed for r in plan.recoveries)
    apply_failover(snapshot, plan)


# --- plan_recovery: apps in an outage, outside a failover --------------------------------------


def outage_cluster() -> ClusterSnapshot:
    """A and B full: h1 and h2 serve large, h1's small warm backup fills B; o has no replica."""
    servers = (make_server("A", 400, site="s1"), make_server("B", 500, site="s1"))
    apps = (make_app("h1", FAM, critical=True), make_app("h2", FAM),
            make_app("o", FAM, critical=True))
    return snap([FAM], servers, apps, [warm("h1", "B", "fam-s")],
                primaries={"h1": "A", "h2": "B"})


def test_plan_recovery_preempts_a_healthy_apps_backup_for_an_app_in_an_outage() -> None:
    snapshot = outage_cluster()
    plan = UnderstudyPolicy(progressive=ProgressiveConfig(preempt_warm=True)).plan_recovery(
        snapshot, ["o"])
    assert plan.failed_servers == frozenset() and plan.warm_switches == ()
    assert plan.recoveries == (ProgressiveRecovery("o", "B", "fam-s", "fam-s"),)
    assert plan.preempted == (warm("h1", "B", "fam-s"),) and plan.unrecoverable == ()
    # without preemption (the controller's preempt_warm off) it stays down, with a reason
    kept = UnderstudyPolicy().plan_recovery(snapshot, ["o"])
    assert kept.recoveries == () and kept.preempted == ()
    assert [u.app_id for u in kept.unrecoverable] == ["o"] and kept.unrecoverable[0].reason


def test_plan_recovery_starts_small_where_the_apps_own_variant_does_not_fit() -> None:
    servers = (make_server("A", 500, site="s1"),)
    apps = (make_app("h", FAM), make_app("o", FAM))
    snapshot = snap([FAM], servers, apps, primaries={"h": "A"})  # 100 MB free
    plan = UnderstudyPolicy().plan_recovery(snapshot, ["o"])
    assert plan.recoveries == (ProgressiveRecovery("o", "A", "fam-s", "fam-s"),)
    # the full-size baselines place the app's own variant or nothing
    for baseline in (FullSizeWarm(), FullSizeCold(), FullSizeWarmK()):
        full = baseline.plan_recovery(snapshot, ["o"])
        assert full.recoveries == () and [u.app_id for u in full.unrecoverable] == ["o"]
    roomy = snap([FAM], (make_server("A", 1000, site="s1"),), apps, primaries={"h": "A"})
    for policy in ALL_POLICIES:  # the app's own variant once there is room (Understudy:
        interim = "fam-s" if policy.name == "understudy" else "fam-l"  # serving small first)
        assert policy.plan_recovery(roomy, ["o"]).recoveries == (
            ProgressiveRecovery("o", "A", interim, "fam-l"),), policy.name
    assert UnderstudyPolicy().plan_recovery(roomy, []) == FailoverPlan(
        failed_servers=frozenset(), warm_switches=(), recoveries=(), unrecoverable=())
