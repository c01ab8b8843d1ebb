"""The live benches' repeats: finish rates combine as medians, outcomes as sums; gains pair
the schedulers of each repeat."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
import pytest

from tests.unit.scripts import load_script


def _run(rate: float, finished: int, late: int) -> dict[str, object]:
    return {"finish_rate": {"dynamic": {"orloj": {"1x": rate}}},
            "outcomes": {"dynamic": {"orloj": {"1x": {"finished": finished, "late": late}}}},
            "send_lag_s": {"dynamic": [finished / 1000.0]}}


def test_orloj_repeats_give_median_finish_rates_and_summed_outcomes() -> None:
    figures = load_script("bench/orloj_figures.py")
    combined = figures.combine([_run(0.5, 5, 5), _run(0.9, 9, 1), _run(0.6, 6, 4)])
    assert combined["finish_rate"] == {"dynamic": {"orloj": {"1x": 0.6}}}
    assert combined["outcomes"] == {"dynamic": {"orloj": {"1x": {"finished": 20, "late": 10}}}}
    assert [r["dynamic"]["orloj"]["1x"] for r in combined["finish_rate_by_repeat"]] == [
        0.5, 0.9, 0.6]
    assert combined["send_lag_ms"]["dynamic"]["p50"] == 6.0  # over every request sent


def test_orloj_gains_and_static_gap_use_the_baselines_that_ran() -> None:
    figures = load_script("bench/orloj_figures.py")
    finish = {"orloj": {"1x": 0.6, "3x": 0.9}, "nexus": {"1x": 0.4, "3x": 0.95},
              "orloj_paper": {"1x": 0.9, "3x": 0.99}}
    gain, detail = figures.gains([finish], [1.0, 3.0])
    assert gain == 50.0 and detail["best_baseline_tight"] == "nexus"  # not the variant
    assert detail["gain_by_slo_pct"] == {"1x": 50.0, "3x": -5.3}
    assert figures.gains([{"orloj": {"1x": 0.5}}], [1.0]) == (None, {})  # no baseline ran
    paired, unpaired = figures.static_gap([finish])
    assert round(paired, 3) == round(unpaired, 3) == 0.05
    assert figures.static_gap(None) is None
    assert figures.static_gap([{"nexus": {"1x": 0.5}}]) is None


def test_orloj_gains_and_static_gap_pair_each_repeats_schedulers() -> None:
    """A slow repeat slows every scheduler in it: the gap is taken within each repeat."""
    figures = load_script("bench/orloj_figures.py")
    repeats = [{"orloj": {"1x": 0.80}, "clipper": {"1x": 0.81}, "nexus": {"1x": 0.5}},
               {"orloj": {"1x": 0.60}, "clipper": {"1x": 0.61}, "nexus": {"1x": 0.5}},
               {"orloj": {"1x": 0.70}, "clipper": {"1x": 0.85}, "nexus": {"1x": 0.5}}]
    paired, unpaired = figures.static_gap(repeats)
    # one point behind in two repeats of three; the medians come from different repeats
    assert round(paired, 3) == 0.01 and round(unpaired, 3) == 0.11
    gain, detail = figures.gains(repeats, [1.0])
    assert detail["best_baseline_tight"] == "clipper"
    assert gain == round(100 * (0.60 / 0.61 - 1), 1)  # the median of -1.2, -1.6, -17.6 %
    assert detail["gain_unpaired_pct"] == round(100 * (0.70 / 0.81 - 1), 1)
    assert detail["gain_by_slo_pct"] == {"1x": gain}  # one SLO: the same pairs


def test_orloj_gains_are_taken_per_load_on_the_early_exit_workloads() -> None:
    figures = load_script("bench/orloj_figures.py")
    light = {"shared": {"orloj": {"1x": 0.6, "3x": 1.0}, "nexus": {"1x": 0.5, "3x": 1.0}},
             "static": {"orloj": {"1x": 0.1, "3x": 0.9}, "nexus": {"1x": 0.2, "3x": 0.9}}}
    heavy = {"shared": {"orloj": {"1x": 0.45}, "nexus": {"1x": 0.15}}}
    by_load = figures.gains_by_load({0.4: ([light], [1.0, 3.0]), 0.7: ([heavy], [1.0])})
    assert set(by_load) == {0.4, 0.7} and set(by_load[0.4]) == {"shared"}  # not the static
    assert by_load[0.4]["shared"][0] == 20.0 and by_load[0.7]["shared"][0] == 200.0
    assert by_load[0.7]["shared"][1]["best_baseline_tight"] == "nexus"


def test_orloj_refuses_a_sweep_load_that_is_the_main_load(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    orloj = load_script("bench/orloj.py")
    monkeypatch.setattr(sys, "argv", ["orloj.py", "--load", "0.7", "--sweep-loads", "0.5,0.7"])
    with pytest.raises(SystemExit):
        orloj.parse_args()
    assert "0.7 is --load" in capsys.readouterr().err


def test_orloj_p99_is_not_moved_by_one_slow_stretch_of_the_measurement() -> None:
    figures = load_script("bench/orloj_figures.py")
    steady = [0.001 + 0.000001 * (i % 100) for i in range(2000)]
    slow = steady[:1000] + [0.010] * 40 + steady[1040:]  # a slow stretch in one part
    assert figures.steady_p99(slow) == figures.steady_p99(steady)
    assert abs(figures.steady_p99(steady) - 0.001099) < 2e-6
    assert float(np.percentile(slow, 99)) > 0.009  # what one p99 over all of it says


def test_orloj_capacity_probes_are_spread_over_the_measurement() -> None:
    orloj = load_script("bench/orloj.py")
    eight = (b"eight", ())
    one = (b"one", ())
    sent: list[object] = []

    class Client:
        async def sequential(self, app: str, requests: list[object], count: int,
                             strict: bool = True) -> list[float]:
            sent.extend(requests[i % len(requests)] for i in range(count))
            return [0.016 if requests[0] == eight else 0.002] * count

    figures = asyncio.run(orloj.measure(Client(), [orloj.WORKLOADS["static"]],
                                        {"static": {"": [one]}}, eight))
    at = [i for i, request in enumerate(sent) if request == eight]
    assert len(at) == orloj.BATCH_PROBES
    assert len(sent) == 50 + orloj.MEASURE_REQUESTS + orloj.BATCH_PROBES  # warm-up first
    every = orloj.MEASURE_REQUESTS // orloj.BATCH_PROBES
    assert at[0] == 50 + every and at[-1] > len(sent) - 2 * every
    assert {b - a for a, b in zip(at, at[1:], strict=False)} == {every + 1}  # evenly spread
    assert figures["static"]["capacity_rps"] == pytest.approx(8 / 0.016)


def test_orloj_client_niceness_is_bounded_and_kept_where_not_permitted(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    orloj = load_script("bench/orloj.py")
    monkeypatch.setattr(sys, "argv", ["orloj.py", "--client-nice", "-21"])
    with pytest.raises(SystemExit):
        orloj.parse_args()
    assert "--client-nice: -20..19" in capsys.readouterr().err

    def refuse(which: int, who: int, nice: int) -> None:
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    assert orloj.set_client_nice(-10) == os.getpriority(os.PRIO_PROCESS, 0)


def test_orloj_rates_are_the_load_of_each_workloads_capacity_under_the_cap() -> None:
    orloj = load_script("bench/orloj.py")
    figures = {"shared": {"capacity_rps": 1000.0}, "static": {"capacity_rps": 10000.0}}
    workloads = [orloj.WORKLOADS["shared"], orloj.WORKLOADS["static"]]
    assert orloj.rates_at(0.4, 500.0, workloads, figures) == {"shared": 400.0, "static": 500.0}
    assert orloj.rates_at(0.7, 1000.0, workloads[:1], figures) == {"shared": 700.0}


def test_orloj_slices_of_a_run_add_up() -> None:
    client = load_script("bench/orloj_client.py")
    run = client.Run(10, 7, {"finished": 7, "late": 3})
    run.add(client.Run(5, 4, {"finished": 4, "deadline-unreachable": 1}, send_lag_s=[0.002]))
    assert (run.sent, run.finished) == (15, 11)
    assert run.send_lag_s == [0.002]
    assert run.outcomes == {"finished": 11, "late": 3, "deadline-unreachable": 1}


def test_orloj_shared_workload_gives_each_scheduler_and_slo_one_queue_of_two_apps() -> None:
    orloj = load_script("bench/orloj.py")
    shared, static = orloj.WORKLOADS["shared"], orloj.WORKLOADS["static"]
    figures = {"shared": {"p99_s": 0.010}, "static": {"p99_s": 0.002}}
    by_app, slo_ms, options = orloj.gateway_settings([shared, static], ["orloj"], [1.5], figures)
    assert by_app == {"shared-orloj-1p5-easy": "orloj", "shared-orloj-1p5-hard": "orloj",
                      "static-orloj-1p5": "orloj"}
    assert slo_ms["shared-orloj-1p5-hard"] == 15.0 and slo_ms["static-orloj-1p5"] == 3.0
    assert options == ["--max-batch", str(orloj.MAX_BATCH),
                       "--model-queue", "shared-orloj-1p5-easy=shared-orloj-1p5",
                       "--model-queue", "shared-orloj-1p5-hard=shared-orloj-1p5"]


def test_orloj_outcomes_per_class_add_up_over_slices_and_repeats() -> None:
    figures = load_script("bench/orloj_figures.py")
    client = load_script("bench/orloj_client.py")
    run = client.Run(3, 2, {"finished": 2, "late": 1},
                    {"easy": {"finished": 2}, "hard": {"late": 1}})
    run.add(client.Run(2, 1, {"finished": 1, "late": 1},
                      {"easy": {"finished": 1}, "hard": {"late": 1}}))
    assert run.by_class == {"easy": {"finished": 3}, "hard": {"late": 2}}
    repeat = _run(0.5, 3, 2) | {"outcomes_by_class": {"shared": {"orloj": {"1x": run.by_class}}}}
    combined = figures.combine([repeat, repeat, _run(0.5, 3, 2)])  # (a repeat without classes)
    assert combined["outcomes_by_class"] == {
        "shared": {"orloj": {"1x": {"easy": {"finished": 6}, "hard": {"late": 4}}}}}
