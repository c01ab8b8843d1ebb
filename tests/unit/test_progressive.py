"""Hand-computed cases for the progressive-failover heuristic (FailLite Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from policies.actions import ProgressivePlan, ProgressiveRecovery
from policies.config import ProgressiveConfig
from policies.errors import InvalidInputError, UnknownReferenceError
from policies.model import Application, ClusterSnapshot, Family, Placement, Role, Server
from policies.progressive import match_variant, plan_progressive
from policies.progressive_reference import reference_plan_progressive
from tests.unit.builders import make_app, make_family, make_server, make_snapshot

# s: 100 MB, m: 400 MB, l: 1000 MB (the primary: most accurate).
FAM = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)])
NO_UPGRADE = ProgressiveConfig(upgrade=False)
# A failed server big enough for every primary: the snapshot checks that each app fits somewhere.
DEAD = make_server("dead", 100_000, compute=100_000)


def snapshot(servers: Iterable[Server], apps: Iterable[Application],
             families: Sequence[Family] = (FAM,),
             placements: Iterable[Placement] = ()) -> ClusterSnapshot:
    return make_snapshot(families, [*servers, DEAD], apps, placements=placements,
                         failed=["dead"])


def apps(*ids: str, family: str = "fam", **kwargs: object) -> list[Application]:
    return [make_app(app_id, family, **kwargs) for app_id in ids]


def recoveries(plan: ProgressivePlan) -> dict[str, tuple[str, str, str]]:
    return {r.app_id: (r.server_id, r.interim_variant, r.target_variant) for r in plan.recoveries}


# --- δ and match --------------------------------------------------------------------------------


@pytest.mark.parametrize(("delta", "expected"), [
    (1.0, "l"), (3.0, "l"), (0.5, "m"), (0.4, "m"), (0.399, "s"), (0.1, "s"), (0.01, "s")])
def test_match_picks_the_largest_variant_within_delta_of_the_primary(delta: float,
                                                                     expected: str) -> None:
    assert match_variant(FAM, FAM.variant("l"), delta).name == expected


def test_match_never_goes_above_a_smaller_primary() -> None:
    assert match_variant(FAM, FAM.variant("m"), 5.0).name == "m"
    assert match_variant(FAM, FAM.variant("m"), 0.5).name == "s"  # 0.5 x 400 = 200 MB


def test_demand_ratio_and_matched_variant() -> None:
    # C = 2000 MB, D = 4 x 1000 MB: δ = 0.5, so m (400 MB <= 500 MB); 400 + 100 interim fits.
    snap = snapshot([make_server("A", 1000), make_server("B", 1000)], apps("a1", "a2", "a3", "a4"))
    plan = plan_progressive(snap, ["a1", "a2", "a3", "a4"])
    assert plan.demand_ratio == pytest.approx(0.5)
    # Worst-fit alternates; the reserve for the interim (100 MB) is counted once per server.
    assert recoveries(plan) == {"a1": ("A", "s", "m"), "a2": ("B", "s", "m"),
                                "a3": ("A", "s", "m"), "a4": ("B", "s", "m")}
    assert plan.unrecoverable == ()


def test_demand_ratio_uses_the_binding_resource() -> None:
    # Memory alone gives 0.5; compute gives 2 x 5 / (4 x 1 x 10) = 0.25, so δ = 0.25 -> s.
    fam = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)],
                      compute_per_rps=[0.125, 0.5, 1.0])
    snap = snapshot([make_server("A", 1000, compute=5), make_server("B", 1000, compute=5)],
                    apps("a1", "a2", "a3", "a4", max_rate_rps=10.0), families=[fam])
    plan = plan_progressive(snap, ["a1", "a2", "a3", "a4"], NO_UPGRADE)
    assert plan.demand_ratio == pytest.approx(0.25)
    # s needs 1.25 % compute at 10 req/s: four fit on two servers with 5 % each.
    assert {target for _, _, target in recoveries(plan).values()} == {"s"}


# --- worst-fit and fallback -----------------------------------------------------------------


def test_worst_fit_chooses_the_server_with_most_free_memory() -> None:
    servers = [make_server("A", 3000), make_server("B", 5000), make_server("C", 4000)]
    plan = plan_progressive(snapshot(servers, apps("x")), ["x"])
    assert recoveries(plan) == {"x": ("B", "s", "l")}


def test_worst_fit_counts_existing_placements_and_breaks_ties_by_server_id() -> None:
    # A has 6000 MB but a 3000 MB primary on it: 3000 free < B's 4000.
    filler = make_family("filler", [("f", 3000, 1.0)])
    placements = [Placement("bg", "A", "f", Role.PRIMARY)]
    snap = snapshot([make_server("A", 6000), make_server("B", 4000)],
                    [*apps("x"), make_app("bg", "filler")], [FAM, filler], placements)
    assert recoveries(plan_progressive(snap, ["x"]))["x"][0] == "B"
    tie = snapshot([make_server("C", 5000), make_server("B", 5000)], apps("x"))
    assert recoveries(plan_progressive(tie, ["x"]))["x"][0] == "B"


def test_failed_servers_are_never_used() -> None:
    snap = snapshot([make_server("A", 1500)], apps("x"))
    plan = plan_progressive(snap, ["x"])
    assert recoveries(plan) == {"x": ("A", "s", "l")}  # not "dead", which is far freer


def test_falls_back_to_a_smaller_variant_when_the_matched_one_fits_nowhere() -> None:
    # δ = 1200 / 1000 >= 1 -> l, but l fits on no 600 MB server; m + 100 MB interim does.
    snap = snapshot([make_server("A", 600), make_server("B", 600)], apps("x"))
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("A", "s", "m")}


def test_compute_must_fit_too() -> None:
    fam = make_family("fam", [("s", 100, 0.6), ("l", 1000, 1.0)], compute_per_rps=2.0)
    # 10 req/s x 2 % = 20 %: A has the memory but only 10 % compute.
    snap = snapshot([make_server("A", 5000, compute=10), make_server("B", 2000, compute=50)],
                    apps("x", max_rate_rps=10.0), families=[fam])
    # Interim s and target l each need 20 %; 20 + 20 <= 50 while l loads.
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("B", "s", "l")}


# --- unrecoverable ----------------------------------------------------------------------------


def test_unrecoverable_when_not_even_the_smallest_variant_fits() -> None:
    snap = snapshot([make_server("A", 50)], apps("x"))
    plan = plan_progressive(snap, ["x"])
    assert plan.recoveries == ()
    [lost] = plan.unrecoverable
    assert lost.app_id == "x"
    assert "room" in lost.reason and "'s'" in lost.reason


def test_unrecoverable_reasons_name_the_cause() -> None:
    no_live = plan_progressive(snapshot([], apps("x")), ["x"])
    assert "no live server" in no_live.unrecoverable[0].reason
    excluded = snapshot([make_server("A", 5000)], apps("x", excluded_servers={"A"}))
    assert "exclusion" in plan_progressive(excluded, ["x"]).unrecoverable[0].reason
    fam = make_family("fam", [("s", 100, 0.6), ("l", 1000, 1.0)], latency_ms=[50.0, 90.0])
    slow = snapshot([make_server("A", 5000)], apps("x", latency_slo_ms=10.0), [fam])
    assert "latency SLO of 10 ms" in plan_progressive(slow, ["x"]).unrecoverable[0].reason


# --- upgrade_model ----------------------------------------------------------------------------


def test_upgrade_pass_uses_the_capacity_left() -> None:
    # One 1500 MB server, two apps: δ = 0.75 -> m for both (900 MB with the reserve).
    snap = snapshot([make_server("A", 1500)], apps("a1", "a2"))
    assert recoveries(plan_progressive(snap, ["a1", "a2"], NO_UPGRADE)) == {
        "a1": ("A", "s", "m"), "a2": ("A", "s", "m")}
    # a1 -> l: 1000 + 400 + 100 reserve = 1500 exactly; a2 -> l no longer fits.
    assert recoveries(plan_progressive(snap, ["a1", "a2"])) == {
        "a1": ("A", "s", "l"), "a2": ("A", "s", "m")}


def test_upgrade_pass_prefers_accuracy_gain_per_megabyte() -> None:
    # Everything starts at s (δ = 1000 / 1300). "a" gains 0.5 for 600 MB; "b" and "c" each
    # gain 0.4 for 200 MB. In app order "a" alone would take the room (1000 MB with the
    # reserve); by gain per MB b and c both upgrade (+0.8 accuracy instead of +0.5).
    small = make_family("small", [("ss", 100, 0.5), ("sl", 300, 0.9)])
    wide = make_family("wide", [("ws", 100, 0.5), ("wl", 700, 1.0)])
    snap = snapshot([make_server("A", 1000)],
                    [make_app("a", "wide"), make_app("b", "small"), make_app("c", "small")],
                    [small, wide])
    assert recoveries(plan_progressive(snap, ["a", "b", "c"])) == {
        "a": ("A", "ws", "ws"), "b": ("A", "ss", "sl"), "c": ("A", "ss", "sl")}


def test_upgrade_only_to_strictly_more_accurate_variants() -> None:
    # m is larger than s but no more accurate; l does not fit. "z" fits nowhere and makes δ small.
    fam = make_family("fam", [("s", 100, 0.7), ("m", 200, 0.7), ("l", 1000, 1.0)])
    huge = make_family("huge", [("h", 1500, 1.0)])
    snap = snapshot([make_server("A", 400)], [make_app("a", "fam"), make_app("z", "huge")],
                    [fam, huge])
    plan = plan_progressive(snap, ["a", "z"])
    assert recoveries(plan) == {"a": ("A", "s", "s")}
    assert [u.app_id for u in plan.unrecoverable] == ["z"]


# Two cases where an upgrade makes an app need *less* compute (a larger variant with a smaller
# compute share), which the upgrade pass must notice. "z" fits nowhere; it only lowers δ to 0.75.
HUGE = make_family("huge", [("h", 3500, 1.0)])


def test_upgrade_pass_revisits_a_server_where_an_upgrade_freed_compute() -> None:
    p = make_family("p", [("p0", 100, 0.5), ("p1", 200, 0.9)], compute_per_rps=1.0)
    n = make_family("n", [("n0", 100, 0.5), ("n1", 200, 0.6), ("n2", 300, 0.7)],
                    compute_per_rps=[0.0, 4.0, 0.0])
    snap = snapshot([make_server("A", 3000, compute=5)],
                    [make_app("a", "p"), make_app("b", "n"), make_app("z", "huge")], [p, n, HUGE])
    # Placed: b at n1 (4 % compute), a at p0 (1 %): 5 % used. First round: a -> p1 needs 1 %
    # more for its interim and fails; b -> n2 then frees 4 %. Second round: a -> p1 fits.
    plan = plan_progressive(snap, ["a", "b", "z"])
    assert recoveries(plan) == {"a": ("A", "p0", "p1"), "b": ("A", "n0", "n2")}
    assert_matches_reference(snap, ["a", "b", "z"], plan)


def test_upgrade_that_shrinks_a_transient_recomputes_the_reserve() -> None:
    q = make_family("q", [("q0", 100, 0.5), ("q1", 200, 0.6), ("q2", 300, 0.9)],
                    compute_per_rps=[4.0, 4.0, 0.0])
    c = make_family("c", [("c0", 100, 0.5), ("c1", 200, 0.7)], compute_per_rps=[0.0, 3.0])
    snap = snapshot([make_server("A", 3000, compute=8)],
                    [make_app("q", "q"), make_app("c", "c"), make_app("z", "huge")], [q, c, HUGE])
    # Placed: q at q1 through q0 (4 % + 4 % reserve), c at c0. q -> q2 drops the reserve to 0,
    # so c -> c1 (3 %) fits: 4 + 3 <= 8. A stale reserve of 4 % would refuse it.
    plan = plan_progressive(snap, ["q", "c", "z"])
    assert recoveries(plan) == {"q": ("A", "q0", "q2"), "c": ("A", "c0", "c1")}
    assert_matches_reference(snap, ["q", "c", "z"], plan)


def assert_matches_reference(snap: ClusterSnapshot, ids: list[str], plan: ProgressivePlan,
                             config: ProgressiveConfig | None = None) -> None:
    ref = reference_plan_progressive(snap, ids, config or ProgressiveConfig())
    assert plan.recoveries == ref.recoveries
    assert [u.app_id for u in plan.unrecoverable] == [u.app_id for u in ref.unrecoverable]


# --- SLO and exclusion lists ------------------------------------------------------------------

LATENCY = [{"reference": 5.0, "slow": 20.0}, {"reference": 10.0, "slow": 40.0},
           {"reference": 20.0, "slow": 80.0}]
TIMED = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)],
                    latency_ms=LATENCY)


def test_slo_sends_the_app_to_a_fast_enough_server() -> None:
    servers = [make_server("A", 5000, server_type="slow"), make_server("B", 2000)]
    snap = snapshot(servers, apps("x", latency_slo_ms=30.0), [TIMED])
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("B", "s", "l")}


def test_slo_limits_the_variant_on_a_slow_server() -> None:
    snap = snapshot([make_server("A", 5000, server_type="slow")],
                    apps("x", latency_slo_ms=30.0), [TIMED])
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("A", "s", "s")}


def test_interim_is_the_smallest_variant_meeting_the_slo() -> None:
    # s is small but slow: the interim is m, and m's 400 MB is reserved while l loads.
    fam = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)],
                      latency_ms=[30.0, 10.0, 10.0])
    snap = snapshot([make_server("A", 1400)], apps("x", latency_slo_ms=20.0), [fam])
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("A", "m", "l")}
    tight = snapshot([make_server("A", 1399)], apps("x", latency_slo_ms=20.0), [fam])
    assert recoveries(plan_progressive(tight, ["x"])) == {"x": ("A", "m", "m")}


@pytest.mark.parametrize("exclusion", [
    {"excluded_servers": {"B"}}, {"excluded_sites": {"site-b"}},
    {"allowed_backup_sites": {"site-a"}}])
def test_exclusion_lists_apply_to_recovered_replicas(exclusion: dict[str, set[str]]) -> None:
    servers = [make_server("A", 2000, site="site-a"), make_server("B", 9000, site="site-b")]
    snap = snapshot(servers, [make_app("x", "fam", **exclusion)])
    assert recoveries(plan_progressive(snap, ["x"]))["x"][0] == "A"


# --- transient reserve ------------------------------------------------------------------------

TWO = make_family("two", [("s", 100, 0.6), ("l", 1000, 1.0)])


@pytest.mark.parametrize(("free_mb", "target"), [(1100, "l"), (1099, "s")])
def test_target_and_interim_must_fit_together(free_mb: int, target: str) -> None:
    snap = snapshot([make_server("A", free_mb)], apps("x", family="two"), [TWO])
    assert recoveries(plan_progressive(snap, ["x"])) == {"x": ("A", "s", target)}


@pytest.mark.parametrize(("free_mb", "second"), [(900, "m"), (899, "s")])
def test_reserve_is_the_largest_interim_not_the_sum(free_mb: int, second: str) -> None:
    # Two apps with primary m (400 MB): 400 + 400 + one 100 MB interim = 900 MB.
    snap = snapshot([make_server("A", free_mb)], apps("a1", "a2", primary_variant="m"))
    assert recoveries(plan_progressive(snap, ["a1", "a2"])) == {
        "a1": ("A", "s", "m"), "a2": ("A", "s", second)}


# --- order and input --------------------------------------------------------------------------


def test_priority_order_serves_critical_apps_first() -> None:
    snap = snapshot([make_server("A", 150)], [make_app("a", "fam"),
                                               make_app("b", "fam", critical=True)])
    plan = plan_progressive(snap, ["a", "b"])
    assert [r.app_id for r in plan.recoveries] == ["b"]
    assert [u.app_id for u in plan.unrecoverable] == ["a"]
    plan = plan_progressive(snap, ["a", "b"], ProgressiveConfig(order="input"))
    assert [r.app_id for r in plan.recoveries] == ["a"]


def test_priority_order_then_takes_larger_matched_variants_first() -> None:
    big = make_family("big", [("bs", 100, 0.6), ("bl", 2000, 1.0)])
    snap = snapshot([make_server("A", 4000)], [make_app("a", "fam"), make_app("b", "big")],
                    [FAM, big])
    plan = plan_progressive(snap, ["a", "b"])
    assert [r.app_id for r in plan.recoveries] == ["b", "a"]
    assert plan.recoveries[0] == ProgressiveRecovery("b", "A", "bs", "bl")


def test_unknown_app_is_rejected() -> None:
    snap = snapshot([make_server("A", 1000)], apps("x"))
    with pytest.raises(UnknownReferenceError, match="nope"):
        plan_progressive(snap, ["x", "nope"])


def test_a_string_is_not_a_list_of_app_ids() -> None:
    snap = snapshot([make_server("A", 1000)], apps("x"))
    with pytest.raises(InvalidInputError):
        plan_progressive(snap, "x")


def test_duplicate_ids_are_planned_once() -> None:
    snap = snapshot([make_server("A", 3000)], apps("x", "y"))
    plan = plan_progressive(snap, ["x", "y", "x"])
    assert sorted(r.app_id for r in plan.recoveries) == ["x", "y"]


def test_nothing_to_recover() -> None:
    snap = snapshot([make_server("A", 1000)], apps("x"))
    assert plan_progressive(snap, []) == ProgressivePlan(recoveries=(), unrecoverable=(),
                                                          demand_ratio=0.0)


# --- variants above the matched one, and apps given up too early (issue 21) ---------------

# s and m are slow: only l meets a 10 ms SLO. "a", "b" and "c" have no SLO.
FAST_LARGE = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)],
                         latency_ms=[50.0, 50.0, 5.0])


def test_a_larger_variant_is_tried_when_none_up_to_the_matched_one_meets_the_slo() -> None:
    """Bug (b): δ = 3000 / 4000 matches m; s and m miss x's SLO but l fits and meets it."""
    snap = snapshot([make_server("A", 3000)],
                    [*apps("a", "b", "c"), make_app("x", "fam", latency_slo_ms=10.0)],
                    [FAST_LARGE])
    plan = plan_progressive(snap, ["a", "b", "c", "x"], NO_UPGRADE)
    assert plan.demand_ratio == pytest.approx(0.75)
    assert plan.unrecoverable == ()
    assert recoveries(plan)["x"] == ("A", "l", "l")
    assert_matches_reference(snap, ["a", "b", "c", "x"], plan, NO_UPGRADE)


def test_the_larger_variant_tried_is_never_above_the_primary() -> None:
    # x's primary is m: l is faster and fits, but it is above the user's choice.
    snap = snapshot([make_server("A", 3000)],
                    [*apps("a", "b", "c"),
                     make_app("x", "fam", latency_slo_ms=10.0, primary_variant="m")],
                    [FAST_LARGE])
    plan = plan_progressive(snap, ["a", "b", "c", "x"], NO_UPGRADE)
    assert [u.app_id for u in plan.unrecoverable] == ["x"]
    assert "latency SLO" in plan.unrecoverable[0].reason
    allowed = snapshot([make_server("A", 3000)],
                       [*apps("a", "b", "c"),
                        make_app("x", "fam", latency_slo_ms=10.0, primary_variant="m",
                                 allow_larger_backups=True)],
                       [FAST_LARGE])
    plan = plan_progressive(allowed, ["a", "b", "c", "x"], NO_UPGRADE)
    assert recoveries(plan)["x"] == ("A", "l", "l")
    assert_matches_reference(allowed, ["a", "b", "c", "x"], plan, NO_UPGRADE)


def test_the_unrecoverable_reason_does_not_contradict_itself() -> None:
    """Bug (b)'s reason: it named the smallest interim of one server type and the free memory
    of another, claiming no room for 100 MB beside a server with 300 MB free."""
    fam = make_family("fam", [("s", 100, 0.6), ("m", 400, 1.0)],
                      latency_ms=[{"reference": 2.0, "gpu-b": 20.0},
                                  {"reference": 4.0, "gpu-b": 4.0}])
    servers = [make_server("F", 50), make_server("B", 300, server_type="gpu-b")]
    snap = snapshot(servers, [make_app("x", "fam", latency_slo_ms=5.0)], [fam])
    [lost] = plan_progressive(snap, ["x"]).unrecoverable
    assert lost.reason == (
        "no live server it may use has room for a variant meeting its latency SLO there "
        "(plus the transient reserve): 's' needs 100 MB GPU memory where at most 50 MB is "
        "left; 'm' needs 400 MB GPU memory where at most 300 MB is left")


def test_apps_left_over_are_retried_once_the_upgrade_pass_frees_compute() -> None:
    """Bug (c): an upgrade to a variant needing less compute makes room for an app given up."""
    fam = make_family("fam", [("s", 100, 0.6), ("m", 400, 0.8), ("l", 1000, 1.0)],
                      compute_per_rps=[0.5, 2.0, 0.5])
    greedy = make_family("g", [("g", 100, 1.0)], compute_per_rps=2.0)
    huge = make_family("huge", [("h", 2000, 1.0)])
    snap = snapshot([make_server("A", 1500, compute=30)],
                    [make_app("a", "fam", max_rate_rps=10.0), make_app("b", "g", max_rate_rps=10.0),
                     make_app("z", "huge")], [fam, greedy, huge])
    # δ = 1500 / 3100 matches m for a (20 % compute + 5 % reserve for s); b's 20 % does not fit
    # beside it. a -> l needs only 5 %: then b fits (5 + 20 + 5 reserve = 30 %).
    plan = plan_progressive(snap, ["a", "b", "z"])
    assert recoveries(plan) == {"a": ("A", "s", "l"), "b": ("A", "g", "g")}
    assert [u.app_id for u in plan.unrecoverable] == ["z"]
    assert_matches_reference(snap, ["a", "b", "z"], plan)
