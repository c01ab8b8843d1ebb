"""The figures of ``bench/orloj.py`` from its runs' counts: medians, paired gains, the gap.

Pure functions over the finish rates and outcomes each repeat recorded (no gateway, no
client), so that the statistics the issue's targets are judged on are tested on their own
(``tests/unit/test_bench_repeats.py``).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

SCHEDULERS = ("orloj", "clipper", "nexus", "clockwork", "triton")
BASELINES = SCHEDULERS[1:]
TIGHT_MAX = 2.0
"""The tight SLOs, the headline's, are those up to this multiple of the p99."""
DYNAMIC_WORKLOADS = ("shared", "dynamic")
"""The early-exit model's workloads, the one the headline gain is taken on first."""
MEASURE_PARTS = 4
"""The execution-time p99 is the median of this many consecutive parts' p99s."""


def add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` (outcome -> requests) into ``into``."""
    for kind, count in counts.items():
        into[kind] = into.get(kind, 0) + count


def steady_p99(latencies: list[float], parts: int = MEASURE_PARTS) -> float:
    """The p99 of ``latencies`` (in the order taken) as the median of ``parts`` parts' p99s.

    A slow second of the machine during the measurement moves one part's p99, not the
    figure every SLO is a multiple of (a p99 inflated so leaves every objective loose).
    """
    size = max(1, len(latencies) // parts)
    pieces = [latencies[i:i + size] for i in range(0, size * parts, size)]
    return statistics.median(float(np.percentile(piece, 99)) for piece in pieces if piece)


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats as one result: each finish rate their median, the outcomes summed."""
    finish = {key: {scheduler: {slo: round(rate, 4) for slo, rate in rates.items()}
                    for scheduler, rates in median_rates(
                        [run["finish_rate"][key] for run in runs]).items()}
              for key in runs[0]["finish_rate"]}
    outcomes: dict[str, Any] = {}
    by_class: dict[str, Any] = {}
    for run in runs:
        for key, per in run["outcomes"].items():
            for scheduler, by_slo in per.items():
                for slo, counts in by_slo.items():
                    add_counts(outcomes.setdefault(key, {}).setdefault(scheduler, {})
                               .setdefault(slo, {}), counts)
        for key, per in run.get("outcomes_by_class", {}).items():
            for scheduler, by_slo in per.items():
                for slo, labelled in by_slo.items():
                    for label, counts in labelled.items():
                        add_counts(by_class.setdefault(key, {}).setdefault(scheduler, {})
                                   .setdefault(slo, {}).setdefault(label, {}), counts)
    lags: dict[str, list[float]] = {}
    for run in runs:
        for key, found in run.get("send_lag_s", {}).items():
            lags.setdefault(key, []).extend(found)
    return {"finish_rate": finish, "outcomes": outcomes, "outcomes_by_class": by_class,
            "finish_rate_by_repeat": [run["finish_rate"] for run in runs],
            "send_lag_ms": {key: {"p50": round(float(np.percentile(v, 50)) * 1000, 3),
                                  "p99": round(float(np.percentile(v, 99)) * 1000, 3)}
                            for key, v in lags.items() if v}}


def baselines_in(finish: dict[str, dict[str, float]]) -> list[str]:
    """The baselines that ran (have finish rates)."""
    return [b for b in BASELINES if b in finish]


def gains(repeats: list[dict[str, dict[str, float]]], slos: list[float]
          ) -> tuple[float | None, dict[str, Any]]:
    """Orloj's gain over the best baseline at the tight SLOs, from each repeat's finish rates.

    The best baseline has the highest mean finish rate over the tight SLOs (of the repeats'
    medians). The gain is paired: each repeat's 100 (Orloj / best - 1) of those means, the
    median over the repeats. A repeat's schedulers took turns on the same arrivals in the
    same slices of time, so the machine's drift between repeats (tens of points) falls on
    both sides of each ratio; a ratio of medians would take each side from whichever repeat
    was its median (``gain_unpaired_pct``, beside it).
    """
    tight = [f"{s:g}x" for s in slos if s <= TIGHT_MAX]
    if not tight or not repeats:
        return None, {}
    medians = median_rates(repeats)
    baselines = baselines_in(medians)
    if "orloj" not in medians or not baselines:
        return None, {}

    def mean(finish: dict[str, dict[str, float]], name: str) -> float:
        return statistics.mean(finish[name][s] for s in tight)

    best = max(baselines, key=lambda name: mean(medians, name))
    paired = [100.0 * (mean(run, "orloj") / mean(run, best) - 1.0) for run in repeats
              if mean(run, best) > 0]
    unpaired = (100.0 * (mean(medians, "orloj") / mean(medians, best) - 1.0)
                if mean(medians, best) > 0 else None)
    by_slo = {}
    for s in (f"{x:g}x" for x in slos):
        ratios = [100.0 * (run["orloj"][s] / top - 1.0) for run in repeats
                  if (top := max(run[b][s] for b in baselines)) > 0]
        by_slo[s] = round(statistics.median(ratios), 1) if ratios else None
    gain = round(statistics.median(paired), 1) if paired else None
    return gain, {"best_baseline_tight": best, "gain_by_slo_pct": by_slo,
                  "gain_unpaired_pct": None if unpaired is None else round(unpaired, 1)}


def median_rates(repeats: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each scheduler's finish rate at each SLO, the median over the repeats."""
    return {name: {s: statistics.median(run[name][s] for run in repeats) for s in rates}
            for name, rates in repeats[0].items()}


def gains_by_load(runs: dict[float, tuple[list[dict[str, Any]], list[float]]]
                  ) -> dict[float, dict[str, tuple[float | None, dict[str, Any]]]]:
    """Per load, each early-exit workload's :func:`gains` (``runs``: load -> each repeat's
    finish rates by workload, and the SLOs they ran)."""
    return {load: {key: gains([run[key] for run in repeats], slos)
                   for key in DYNAMIC_WORKLOADS if key in repeats[0]}
            for load, (repeats, slos) in runs.items() if repeats}


def static_gap(repeats: list[dict[str, dict[str, float]]] | None
               ) -> tuple[float, float] | None:
    """Orloj's largest shortfall behind the best baseline on the static model (fractions).

    At each SLO, in each repeat, the best baseline's finish rate less Orloj's (the best of
    those that ran, there); the median over the repeats; the largest over the SLOs. Beside
    it, unpaired: the same from the repeats' medians. None when Orloj or no baseline ran.
    """
    if not repeats or "orloj" not in repeats[0] or not baselines_in(repeats[0]):
        return None
    baselines = baselines_in(repeats[0])

    def shortfall(finish: dict[str, dict[str, float]], s: str) -> float:
        return max(finish[b][s] for b in baselines) - finish["orloj"][s]

    slos = list(repeats[0]["orloj"])
    medians = median_rates(repeats)
    paired = max(statistics.median(shortfall(run, s) for run in repeats) for s in slos)
    unpaired = max(shortfall(medians, s) for s in slos)
    return paired, unpaired
