"""Issue 21's replica rules (policies/replica_rules.py) in every policy that places a replica.

Never above the user's choice, pins for backups and failovers, site independence on by default
on a multi-site cluster; and the independent checker flags each violation.
"""

from __future__ import annotations

import pytest

from controller.records import AppRecord, AppSpec
from controller.snapshot import application
from model_repo.profiles import load_families
from policies.actions import SolveStats, WarmAssignment, WarmPlan
from policies.baselines import FullSizeCold, FullSizeWarmK
from policies.config import WarmPlanConfig
from policies.failover import split_affected
from policies.model import ClusterSnapshot, Role
from policies.progressive import plan_progressive
from policies.replica_rules import (
    allowed_variants,
    resolve_site_independent,
    scoped,
    within_choice,
)
from policies.warm_check import warm_plan_violations
from policies.warm_ilp import plan_warm_backups
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement

METHODS = ["decomposed", "full", "heuristic"]
FAM = make_family("fam", [("s", 100, 0.7), ("m", 200, 0.85), ("l", 400, 1.0)])


def three_sites(**app: object) -> ClusterSnapshot:
    """k on A (site x); B in x, C in y, D in z: 2000 MB each, room for any backup."""
    servers = [make_server("A", 2000, site="x"), make_server("B", 2000, site="x"),
               make_server("C", 2000, site="y"), make_server("D", 2000, site="z")]
    k = make_app("k", FAM, critical=True, **app)
    primary = "m" if k.primary_variant == "m" else "l"
    return make_snapshot([FAM], servers, [k], placements=[placement("k", "A", primary)])


def one_backup(snapshot: ClusterSnapshot, config: WarmPlanConfig) -> WarmAssignment | None:
    plan = plan_warm_backups(snapshot, config)
    assert warm_plan_violations(snapshot, plan, config) == []
    return plan.assignments[0] if plan.assignments else None


# --- never above the user's choice ------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_regnet_y_400mf_is_never_backed_up_by_a_larger_regnet(method: str) -> None:
    """The issue's case: regnet_y_400mf was backed up by regnet_y_16gf (40x larger)."""
    families = load_families()
    regnet = families["regnet_y"]
    servers = [make_server("A", 8000, compute=400), make_server("B", 8000, compute=400)]
    app = make_app("r", "regnet_y", critical=True, primary_variant="regnet_y_400mf")
    snap = make_snapshot([regnet], servers, [app],
                         placements=[placement("r", "A", "regnet_y_400mf")])
    config = WarmPlanConfig(method=method)
    backup = one_backup(snap, config)
    assert backup is not None and backup.variant == "regnet_y_400mf"
    allowed = make_app("r", "regnet_y", critical=True, primary_variant="regnet_y_400mf",
                       allow_larger_backups=True)
    larger = make_snapshot([regnet], servers, [allowed],
                           placements=[placement("r", "A", "regnet_y_400mf")])
    chosen = one_backup(larger, config)
    assert chosen is not None
    assert regnet.variant(chosen.variant).memory_mb > regnet.variant("regnet_y_400mf").memory_mb


def test_the_variant_rule_compares_memory_and_accuracy() -> None:
    odd = make_family("odd", [("a", 100, 0.9), ("b", 200, 0.8), ("c", 300, 1.0)])
    # b is the primary: a is smaller but more accurate, c larger: neither is allowed.
    app = make_app("x", odd, primary_variant="b")
    snap = make_snapshot([odd], [make_server("A", 1000)], [app])
    assert [v.name for v in allowed_variants(snap, app)] == ["b"]
    assert within_choice(odd.variant("c"), odd.variant("b"))
    assert not within_choice(odd.variant("b"), odd.variant("a"))
    free = make_app("y", odd, primary_variant="b", allow_larger_backups=True)
    assert [v.name for v in allowed_variants(snap, free)] == ["a", "b", "c"]


def test_the_checker_flags_a_backup_above_the_primary() -> None:
    snap = three_sites(primary_variant="m")
    plan = WarmPlan((WarmAssignment("k", "C", "l", 1.0),), (), SolveStats("x", "x", "x", 0.0))
    assert warm_plan_violations(snap, plan, WarmPlanConfig()) == [
        "k: backup l is larger or more accurate than its primary m"]


@pytest.mark.parametrize("method", METHODS)
def test_a_backup_above_the_primary_that_is_loaded_now_is_not_kept(method: str) -> None:
    snap = three_sites(primary_variant="m")
    loaded = snap.with_placements(snap.placements + (placement("k", "C", "l", Role.WARM),))
    backup = one_backup(loaded, WarmPlanConfig(method=method))
    assert backup is not None and backup.variant == "m"


# --- pins -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("site_independent", [None, True, False])
def test_a_pinned_app_is_backed_up_in_its_site_only(method: str,
                                                    site_independent: bool | None) -> None:
    # Pinned to x: B is the only other server there. Site independence is waived for it.
    config = WarmPlanConfig(method=method, site_independent=site_independent)
    for pin in ({"pinned_site": "x"}, {"pinned_server": "A"}):
        backup = one_backup(three_sites(**pin), config)
        assert backup is not None and backup.server_id == "B"


@pytest.mark.parametrize("method", METHODS)
def test_a_pinned_app_with_no_room_in_its_site_is_uncovered_with_the_reason(method: str) -> None:
    snap = three_sites(pinned_server="A").with_failed(["B"])
    plan = plan_warm_backups(snap, WarmPlanConfig(method=method))
    assert plan.assignments == ()
    [uncovered] = plan.uncovered
    assert uncovered.app_id == "k" and "pinned to site 'x'" in uncovered.reason


def test_the_checker_flags_a_backup_outside_the_pinned_site() -> None:
    snap = three_sites(pinned_site="x")
    plan = WarmPlan((WarmAssignment("k", "C", "l", 1.0),), (), SolveStats("x", "x", "x", 0.0))
    assert warm_plan_violations(snap, plan, WarmPlanConfig()) == [
        "k: backup on C outside its pinned site x"]


def test_failover_of_a_pinned_app_stays_in_its_site() -> None:
    snap = three_sites(pinned_server="A").with_failed(["A"])
    plan = plan_progressive(snap, ["k"])
    assert [(r.app_id, r.server_id) for r in plan.recoveries] == [("k", "B")]
    gone = snap.with_failed(["B"])
    [lost] = plan_progressive(gone, ["k"]).unrecoverable
    assert lost.reason.startswith("it is pinned to site 'x', where no live server may hold it")
    # Baselines too.
    assert FullSizeCold().plan_failover(snap, []).recoveries[0].server_id == "B"
    assert "pinned site" in FullSizeCold().plan_failover(gone, []).unrecoverable[0].reason


def test_a_warm_backup_the_rules_no_longer_allow_is_not_switched_to() -> None:
    """Loaded before the app was pinned (or before the rule): a cold recovery instead."""
    snap = three_sites(pinned_site="x")
    loaded = snap.with_placements(snap.placements + (placement("k", "C", "l", Role.WARM),))
    split = split_affected(loaded, ["A"])
    assert split.warm_switches == () and split.cold_app_ids == ("k",)
    inside = snap.with_placements(snap.placements + (placement("k", "B", "l", Role.WARM),))
    assert [w.server_id for w in split_affected(inside, ["A"]).warm_switches] == ["B"]


def test_scoped_folds_the_pin_into_the_allowed_sites() -> None:
    snap = three_sites(pinned_server="A", allowed_backup_sites={"x", "y"})
    app = scoped(snap, snap.app_by_id["k"])
    assert app.allowed_backup_sites == {"x"}
    free = three_sites()
    assert scoped(free, free.app_by_id["k"]) is free.app_by_id["k"]


# --- site independence by default -------------------------------------------------------------


def test_site_independence_is_on_by_default_when_two_sites_have_live_servers() -> None:
    snap = three_sites()
    assert resolve_site_independent(snap, None)
    assert not resolve_site_independent(snap, False)
    lone = snap.with_failed(["C", "D"])  # only site x is left
    assert not resolve_site_independent(lone, None)
    assert resolve_site_independent(lone, True)


@pytest.mark.parametrize("method", METHODS)
def test_by_default_a_backup_leaves_its_primary_s_site(method: str) -> None:
    backup = one_backup(three_sites(), WarmPlanConfig(method=method))
    assert backup is not None and backup.server_id in {"C", "D"}
    same = one_backup(three_sites(), WarmPlanConfig(method=method,
                                                    site_independent=False))
    assert same is not None


def test_the_checker_resolves_the_default_too() -> None:
    snap = three_sites()
    plan = WarmPlan((WarmAssignment("k", "B", "l", 1.0),), (), SolveStats("x", "x", "x", 0.0))
    assert warm_plan_violations(snap, plan, WarmPlanConfig()) == [
        "k: backup in its primary's site"]
    assert warm_plan_violations(snap, plan, WarmPlanConfig(site_independent=False)) == []


def test_baselines_follow_the_default_and_the_pins() -> None:
    plan = FullSizeWarmK().plan_warm(three_sites())
    assert [a.server_id for a in plan.assignments] in (["C"], ["D"])
    pinned = FullSizeWarmK().plan_warm(three_sites(pinned_site="x"))
    assert [a.server_id for a in pinned.assignments] == ["B"]


def test_the_registration_flag_reaches_the_policy_view() -> None:
    spec = AppSpec(app_id="r", family="regnet_y", variant="regnet_y_400mf")
    assert application(AppRecord(spec=spec)).allow_larger_backups is False
    spec = spec.model_copy(update={"allow_larger_backups": True})
    assert application(AppRecord(spec=spec)).allow_larger_backups is True
