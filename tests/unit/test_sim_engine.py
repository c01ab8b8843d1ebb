"""Hand-computed timelines of the SimPy engine, the timing model and the §5.1 metrics."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from model_repo.profiles import PROFILE_DIR
from policies.actions import FailoverPlan, ProgressiveRecovery, Unrecoverable, WarmSwitch
from policies.baselines import FullSizeCold
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot, Family
from sim.engine import COLD, LOST, PROGRESSIVE, WARM, AppOutcome, simulate_failover
from sim.metrics import summarize
from sim.runner import PolicySettings, Scenario, run_policy
from sim.timing import (
    PAPER_LOAD_FIT,
    Timing,
    fit_measured,
    profiler_fit,
    timing_for,
)
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement
from tests.unit.sim_fixtures import ONE_MS_PER_MB, TIMING, HalfPhase

FAM = make_family("fam", [("fam-s", 100, 0.7), ("fam-m", 200, 0.85), ("fam-l", 400, 1.0)])
def cluster() -> ClusterSnapshot:
    servers = [make_server("A", 2000), make_server("X", 2000), make_server("W", 2000)]
    apps = [make_app(a, FAM) for a in ("a", "b", "c", "d")]
    return make_snapshot([FAM], servers, apps, placements=[
        placement(a, "A", "fam-l") for a in ("a", "b", "c", "d")])


def by_id(outcomes: tuple[AppOutcome, ...]) -> dict[str, AppOutcome]:
    return {o.app_id: o for o in outcomes}


def test_timeline_with_one_load_thread_and_one_upgrade_at_a_time() -> None:
    plan = FailoverPlan(frozenset({"A"}), (WarmSwitch("a", "W", "fam-m"),),
                        (ProgressiveRecovery("b", "X", "fam-s", "fam-l"),
                         ProgressiveRecovery("c", "X", "fam-s", "fam-l")),
                        (Unrecoverable("d", "no room"),))
    got = by_id(simulate_failover(cluster(), plan, TIMING, HalfPhase()))
    # Warm: promote command (1) + notification (10).
    assert (got["a"].how, got["a"].mttr_ms, got["a"].e2e_ms) == (WARM, 11.0, 41.0)
    # b: command 1, interim 100 ms on the only thread (1..101), notified at 111.
    assert (got["b"].how, got["b"].mttr_ms) == (PROGRESSIVE, 111.0)
    # c's interim waits for the thread: 101..201, notified at 211.
    assert got["c"].mttr_ms == 211.0
    # Upgrades run in the plan's "upgrade" stage, after every interim of the failure serves
    # (FailoverPlan.stages(), the controller's order too), so b's upgrade starts at 211, when
    # c's interim serves, not at 111 after its own: slot and thread at 211, 211..611, +10.
    # (Before the simulator ran the shared stages it took the slot at 111 and the thread,
    # freed by c's interim, at 201, settling at 611; c at 1021. MTTRs do not move.)
    assert got["b"].settled_ms == 621.0
    # c's upgrade waits for b's upgrade slot (621): 621..1021, +10.
    assert got["c"].settled_ms == 1031.0
    assert got["b"].accuracy_reduction == 0.0
    assert got["b"].interim_accuracy_reduction == pytest.approx(0.3)
    assert got["a"].accuracy_reduction == pytest.approx(0.15)
    assert (got["d"].how, got["d"].mttr_ms, got["d"].accuracy_reduction) == (LOST, None, None)
    assert all(o.detection_ms == 30.0 for o in got.values())


def test_ten_load_threads_run_interims_in_parallel() -> None:
    plan = FailoverPlan(frozenset({"A"}), (), tuple(
        ProgressiveRecovery(a, "X", "fam-s", "fam-s") for a in ("a", "b", "c")), ())
    timing = Timing(detection_jitter_ms=0.0, fit=ONE_MS_PER_MB)
    got = simulate_failover(cluster(), plan, timing, HalfPhase())
    assert [(o.how, o.mttr_ms, o.settled_ms) for o in got] == [(COLD, 111.0, 111.0)] * 3


def test_site_failure_is_declared_when_its_last_server_is_detected() -> None:
    plan = FailoverPlan(frozenset({"A", "W"}), (), (), (Unrecoverable("a", "x"),))
    probe = random.Random(7)
    expected = max(TIMING.detection_ms(probe), TIMING.detection_ms(probe))  # A, then W
    [outcome] = simulate_failover(cluster(), plan, TIMING, random.Random(7))
    assert outcome.detection_ms == expected


def test_detection_delay_bounds_and_periodic_detector() -> None:
    timing = Timing()  # T = 20 ms, k = 2, jitter up to 5 ms
    delays = [timing.detection_ms(random.Random(s)) for s in range(200)]
    assert all(20.0 < d <= 45.0 for d in delays)
    periodic = Timing(detection_jitter_ms=0.0, detector_period_ms=100.0)
    assert all(20.0 < periodic.detection_ms(random.Random(s)) <= 140.0 for s in range(200))


def test_paper_load_fit_passes_through_figure_5() -> None:
    assert PAPER_LOAD_FIT.load_ms(158.0) == pytest.approx(441.0)
    assert PAPER_LOAD_FIT.load_ms(806.0) == pytest.approx(2105.0)


def test_measured_load_times_win_and_fit_the_rest() -> None:
    measured = Family("fam", tuple(
        replace(v, load_time_s=t) for v, t in zip(FAM.variants, (0.2, 0.3, None), strict=True)))
    fit = fit_measured([measured])
    assert fit is not None
    assert fit.intercept_ms == pytest.approx(100.0) and fit.ms_per_mb == pytest.approx(1.0)
    timing = timing_for({"fam": measured})
    assert timing.load_ms(measured.variants[0]) == pytest.approx(200.0)
    assert timing.load_ms(measured.variants[2]) == pytest.approx(500.0)  # 100 + 400 x 1
    assert timing.load_source(measured.variants[2]) == "fit"
    assert timing_for({"fam": FAM}).fit == PAPER_LOAD_FIT


def test_profiler_fit_applies_to_scaled_weights(tmp_path: Path) -> None:
    doc = json.loads((PROFILE_DIR / "mobilenet_v3.json").read_text())
    doc["load_time_fit"] = {"intercept_s": 0.4, "slope_s_per_mb": 0.005, "r2": 0.9,
                            "variants": 2, "artifact_scale": 0.5, "server_type": "vm"}
    (tmp_path / "mobilenet_v3.json").write_text(json.dumps(doc))
    fit = profiler_fit(tmp_path)
    assert fit is not None and fit.basis == "size_mb"
    variant = replace(FAM.variants[0], size_mb=100.0)
    assert fit.variant_ms(variant) == pytest.approx(400.0 + 5.0 * 100.0 * 0.5)
    plain = replace(FAM.variants[0], size_mb=None)  # no weights size: falls back to memory
    assert fit.variant_ms(plain) == pytest.approx(400.0 + 5.0 * 100.0 * 0.5)
    assert timing_for({"fam": FAM}, "profiles", fit).fit is fit
    assert timing_for({"fam": FAM}, "paper").fit == PAPER_LOAD_FIT
    with pytest.raises(ValueError, match="unknown load-time source"):
        timing_for({"fam": FAM}, "guess")


def test_full_size_cold_mttr_is_the_full_size_load() -> None:
    snap = make_snapshot([FAM], [make_server("A", 1000), make_server("B", 1000)],
                         [make_app("x", FAM)], placements=[placement("x", "A", "fam-l")])
    run = run_policy("full-size-cold", snap, [Scenario("A", ("A",))],
                     _settings(), Timing(), seed=0)
    [result] = run.results
    [outcome] = result.outcomes
    load = 35.27160493827 + 2.567901234567901 * 400
    assert outcome.how == COLD and outcome.server_id == "B"
    assert outcome.mttr_ms == pytest.approx(1.0 + load + 10.0)
    assert result.plan == FullSizeCold(seed=0).plan_failover(snap, ["A"])


def test_understudy_small_scenario_warm_and_progressive() -> None:
    """k's warm backup switches in 11 ms; n comes back progressively, interim first.

    Free after placing both primaries on A: B 500, C 1000. The ILP puts k's full-size backup
    (400) on C or B; packing is worst-fit, so C (600 left). n: demand ratio (600 + 500) / 400
    >= 1, so fam-l, with fam-s as interim (400 + 100 reserve fits C's 600, the most free).
    """
    snap = make_snapshot([FAM], [make_server("A", 1000), make_server("B", 500),
                                 make_server("C", 1000)],
                         [make_app("k", FAM, critical=True), make_app("n", FAM)],
                         placements=[placement("k", "A", "fam-l"), placement("n", "A", "fam-l")])
    run = run_policy("understudy", snap, [Scenario("A", ("A",))], _settings(alpha=0.0),
                     Timing(), seed=0)
    assert run.warm_method == "decomposed"
    got = by_id(run.results[0].outcomes)
    assert (got["k"].how, got["k"].server_id, got["k"].variant) == (WARM, "C", "fam-l")
    assert got["k"].mttr_ms == pytest.approx(11.0)
    # n: fam-s interim (100 MB: 35.27 + 256.79 ms) then fam-l on C (the server with room).
    assert (got["n"].how, got["n"].server_id, got["n"].interim, got["n"].variant) == (
        PROGRESSIVE, "C", "fam-s", "fam-l")
    assert got["n"].mttr_ms == pytest.approx(1.0 + 35.27160493827 + 256.7901234567901 + 10.0)
    assert UnderstudyPolicy().name == "understudy"


def _settings(alpha: float = 0.1) -> PolicySettings:
    return PolicySettings(alpha=alpha)


def _outcome(app: str, how: str, mttr: float | None, acc: float | None) -> AppOutcome:
    return AppOutcome(app, False, how, None, None, None, 30.0, mttr,
                      None if mttr is None else mttr + 30.0, mttr, acc, acc)


def test_metrics_follow_section_5_1() -> None:
    one = [_outcome("a", WARM, 10.0, 0.0), _outcome("b", PROGRESSIVE, 100.0, 0.1),
           _outcome("c", LOST, None, None), _outcome("d", COLD, 1000.0, 0.0)]
    two = [_outcome("e", WARM, 10.0, 0.02)]
    s = summarize([one, two, []])
    assert s.scenarios == 2 and s.affected == 5 and s.recovered == 4
    assert s.recovery_rate == pytest.approx((0.75 + 1.0) / 2)  # mean over scenarios
    assert s.recovery_rate_min == 0.75 and s.recovery_rate_pooled == pytest.approx(0.8)
    assert s.mttr_mean_ms == pytest.approx((10 + 100 + 1000 + 10) / 4)  # lost apps excluded
    assert s.mttr_p50_ms == pytest.approx(55.0)
    assert s.accuracy_reduction_pct == pytest.approx(100 * 0.12 / 4)
    assert s.accuracy_reduction_max_pct == pytest.approx(10.0)
    assert (s.warm, s.progressive, s.cold, s.lost) == (2, 1, 1, 1)
    empty = summarize([])
    assert empty.recovery_rate == 1.0 and empty.mttr_mean_ms is None
