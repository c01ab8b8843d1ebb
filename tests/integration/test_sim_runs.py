"""Whole simulator runs (seconds each): experiments, the CLI, the calibration's checks.

They run the simulator end to end rather than one piece of it, so they sit with the
integration tier (``make test`` runs them; ``make test-fast`` does not).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_repo.profiles import load_families
from sim import calibrate
from sim.cluster import ClusterSpec, build_cluster, with_headroom
from sim.runner import POLICIES, UNDERSTUDY_NO_PREEMPT, PolicySettings, run_policy, site_failures
from sim.suite import run_suite
from sim.timing import Timing
from understudy.cli import main as cli

FAMILIES = load_families()


def test_preemption_shows_up_in_big_site_failures() -> None:
    # The pre-calibration mix (all families, uniform 1-10 req/s, primaries <= 20 % of a GPU):
    # with the calibrated one, five failed sites leave nothing for preemption to do.
    spec = ClusterSpec(seed=0, mix="all", rate_rps=(1.0, 10.0), rate_distribution="uniform",
                       max_primary_compute_pct=20.0)
    snap = with_headroom(build_cluster(FAMILIES, spec), 0.2)
    settings = PolicySettings(site_independent=True)
    scenarios = site_failures(snap, 5, 1, seed=0)
    ours = run_policy("understudy", snap, scenarios, settings, Timing(), seed=0)
    paper = run_policy(UNDERSTUDY_NO_PREEMPT, snap, scenarios, settings, Timing(), seed=0)
    [with_preemption], [without] = ours.results, paper.results
    assert with_preemption.plan.preempted and not without.plan.preempted
    assert len(with_preemption.plan.unrecoverable) < len(without.plan.unrecoverable)


def _csvs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*/*.csv"))
            if p.name != "timings.csv"}


def test_same_seeds_give_byte_identical_csv(tmp_path: Path) -> None:
    first = run_suite(["fig7"], seeds=2, quick=True, out=tmp_path / "a", progress=False)
    run_suite(["fig7"], seeds=2, quick=True, out=tmp_path / "b", progress=False)
    run_suite(["fig7"], seeds=2, quick=True, out=tmp_path / "c", progress=False, jobs=2)
    a = _csvs(tmp_path / "a")
    assert set(a) == {"summary.csv", "scenarios.csv"}
    assert a == _csvs(tmp_path / "b") == _csvs(tmp_path / "c")
    assert (tmp_path / "a" / "fig7" / "fig7.png").stat().st_size > 0
    report = (tmp_path / "a" / "report.md").read_text()
    assert "| §5.2 Fig. 7a | Understudy recovery rate | 100 % |" in report
    assert first.summary["fig7"]["understudy"]["testbed"]["recovery_rate_pct"] == 100.0
    other = run_suite(["fig7"], seeds=1, quick=True, out=tmp_path / "d", progress=False)
    assert other.summary != first.summary  # seed 1 is part of the first run's pool


def test_fig8_quick_prints_one_json_object_last(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["--log-level", "WARNING", "sim", "experiment", "fig8", "--quick",
                       "--no-progress", "--out", str(tmp_path)])
    assert status == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fig8 = json.loads(last)["fig8"]
    assert set(fig8) == set(POLICIES)
    for policy in POLICIES:
        assert set(fig8[policy]) == {"0.1", "0.2", "0.3", "0.4", "0.5"}
        for numbers in fig8[policy].values():
            assert set(numbers) == {"recovery_rate_pct", "mttr_mean_ms", "accuracy_reduction_pct"}
    ten = {p: fig8[p]["0.1"]["recovery_rate_pct"] for p in POLICIES}
    assert ten["understudy"] == 100.0
    assert fig8["understudy"]["0.1"]["accuracy_reduction_pct"] <= 4.5
    assert all(ten[p] < 80.0 for p in POLICIES if p != "understudy")
    for name in ("summary.csv", "scenarios.csv", "timings.csv", "fig8.png"):
        assert (tmp_path / "fig8" / name).exists()


def test_fig11_check_of_the_fig7_8_fit() -> None:
    # The curve check (sim/fig11_check.py) on one seed: the best fit to Fig. 7/8 alone keeps
    # its best full-size policy above 71.8 % at five failed sites (full run: 77.7 %), so
    # Understudy is not run and the table says the claim does not hold either way.
    from sim import fig11_check
    from sim.cluster import FIG78_FIT
    from sim.timing import profiler_fit, timing_for

    timing = timing_for(FAMILIES, "profiles", profiler_fit(None))
    result = fig11_check.check(FIG78_FIT, FAMILIES, timing, seeds=1)
    assert set(result.best_baseline) == {1, 5, 7}
    assert all(0.0 <= v <= 100.0 for v in result.best_baseline.values())
    assert result.best_baseline[5] > fig11_check.CLAIM_RELATIVE
    assert result.understudy_at_5 is None
    row = fig11_check.table([result]).splitlines()[-1]
    assert "(Fig. 7/8 fit)" in row and row.endswith("| no / no |")


def test_the_calibrated_mix_meets_the_issue_targets_where_the_fig7_8_fit_does_not() -> None:
    # The constraint of the calibration on seed 0 (sim.calibrate.check_targets: the report's
    # verdicts on Fig. 8 at 10 % headroom and Fig. 11 with 5 sites failed): the default meets
    # all six (+46.8 points at five sites); the best fit to Fig. 7/8 alone misses the five-site
    # gap in points and read as relative (+24.9 points, +33.2 %).
    from sim.cluster import CALIBRATED, FIG78_FIT
    from sim.timing import profiler_fit, timing_for

    timing = timing_for(FAMILIES, "profiles", profiler_fit(None))
    calibrated = calibrate.check_targets(CALIBRATED, FAMILIES, timing, seeds=1)
    assert len(calibrated) == 6 and all(t.met for t in calibrated)
    fit = calibrate.check_targets(FIG78_FIT, FAMILIES, timing, seeds=1)
    missed = [t.what for t in fit if not t.met]
    assert len(missed) == 2 and all("5 of 10 sites: >= 39" in what for what in missed)
