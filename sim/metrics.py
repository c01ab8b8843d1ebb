"""FailLite §5.1's metrics over many simulated failures.

* **Recovery rate**: "the percentage of DNN applications that were affected by the failure and
  were recovered". Per failure scenario; ``recovery_rate`` is the mean over scenarios (the
  paper reports "the average recovery rate ... across six runs", one failure each), with the
  worst scenario (``recovery_rate_min``) and the rate over all affected apps pooled.
* **MTTR**: from failure detection to the client notification, recovered apps only
  ("non-recovered applications have an infinite MTTR"): mean, median and 99th percentile over
  every recovered app of every scenario. ``e2e`` counts from the failure itself.
* **Accuracy reduction**: of the backup the app ends on, relative to its primary, recovered
  apps only ("non-recovered applications have zero accuracy"), mean and maximum, in percent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from sim.engine import COLD, LOST, PROGRESSIVE, WARM, AppOutcome


@dataclass(frozen=True, slots=True)
class Summary:
    """Aggregates over a set of failure scenarios (rates in 0..1, times in ms, accuracy in %)."""

    scenarios: int
    affected: int
    recovered: int
    recovery_rate: float
    recovery_rate_min: float
    recovery_rate_pooled: float
    mttr_mean_ms: float | None
    mttr_p50_ms: float | None
    mttr_p99_ms: float | None
    e2e_mean_ms: float | None
    settled_mean_ms: float | None
    accuracy_reduction_pct: float | None
    accuracy_reduction_max_pct: float | None
    warm: int
    progressive: int
    cold: int
    lost: int

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(scenarios: Iterable[Sequence[AppOutcome]]) -> Summary:
    """The §5.1 metrics over ``scenarios`` (each the outcomes of one failure).

    Scenarios with no affected app are left out (their recovery rate is undefined).
    """
    rates: list[float] = []
    outcomes: list[AppOutcome] = []
    for scenario in scenarios:
        if not scenario:
            continue
        rates.append(sum(o.recovered for o in scenario) / len(scenario))
        outcomes.extend(scenario)
    recovered = [o for o in outcomes if o.recovered]
    mttr = [o.mttr_ms for o in recovered if o.mttr_ms is not None]
    accuracy = [100.0 * o.accuracy_reduction for o in recovered
                if o.accuracy_reduction is not None]
    counts = {how: sum(o.how == how for o in outcomes) for how in (WARM, PROGRESSIVE, COLD, LOST)}
    return Summary(
        scenarios=len(rates), affected=len(outcomes), recovered=len(recovered),
        recovery_rate=float(np.mean(rates)) if rates else 1.0,
        recovery_rate_min=min(rates, default=1.0),
        recovery_rate_pooled=len(recovered) / len(outcomes) if outcomes else 1.0,
        mttr_mean_ms=_mean(mttr), mttr_p50_ms=_percentile(mttr, 50),
        mttr_p99_ms=_percentile(mttr, 99),
        e2e_mean_ms=_mean([o.e2e_ms for o in recovered if o.e2e_ms is not None]),
        settled_mean_ms=_mean([o.settled_ms for o in recovered if o.settled_ms is not None]),
        accuracy_reduction_pct=_mean(accuracy),
        accuracy_reduction_max_pct=max(accuracy, default=None),
        warm=counts[WARM], progressive=counts[PROGRESSIVE], cold=counts[COLD], lost=counts[LOST])
