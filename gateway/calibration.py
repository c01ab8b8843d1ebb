"""What an app's batch scheduler plans with: its execution times, measured in the gateway.

Every scheduler of ``gateway.batching`` starts from the same measurements, taken on the app's
first requests (the *warm-up*): each is sent alone, and right after it a *probe* (the same
rows repeated ``n`` times, for ``n`` cycling over the batch sizes; its answer goes to nobody).
From them, :meth:`Calibration.profile` gives:

- the *solo* execution times: with a dynamic model that reports each row's execution time
  (``exec_output``), those; otherwise the measured time of a request sent alone;
- the batch law (``scheduling.types.BatchLaw``): ``overhead_s`` is what a request alone took
  beyond its reported execution time (transfer, encoding; 0 without reports, when it is part
  of the solo time), and ``slope`` the median over sizes of
  ``((probe(n) - overhead) / (alone - overhead) - 1) / (n - 1)`` (a probe's rows share one
  execution time, so the ratio is batching's cost alone).

After the warm-up the solo times keep coming from the batches the scheduler sends (the reported
times, or a batch's time divided by the law's scale), in a sliding window: Orloj rebuilds its
distribution from it (§3.2), and the fixed-profile baselines are re-planned from the same window
(Nexus's mean, Clockwork's p99), so none plans with staler numbers than the others.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduling.baselines import ClipperLike, ClockworkLike, NexusLike, TritonBatcher, plan_batch
from scheduling.distribution import Distribution
from scheduling.orloj import Orloj
from scheduling.orloj_config import OURS, OrlojConfig
from scheduling.profile import ModelProfile, Profiler
from scheduling.types import BatchLaw, BatchScheduler

SCHEDULERS = ("orloj", "orloj_paper", "clipper", "nexus", "clockwork", "triton")
MAX_SLOPE = 1.5
TRITON_DELAY_OF_SLO = 0.1
"""Triton-like baseline: the oldest request waits at most this fraction of the SLO."""
CLOCKWORK_WINDOW_OF_P99 = 1.0
"""Clockwork-like baseline: a planned batch may start this many p99 solo times after its
predicted start before it misses its window (the simulator's 0 assumes exact predictions; a
live worker's times jitter, and Clockwork's actions carry a window of slack)."""
REFRESH_EVERY = 256
"""Solo measurements between two re-plans (Orloj's profile refresh, the baselines' numbers)."""
REFRESH_TOLERANCE = 0.05
"""Orloj keeps its curves while no refreshed distribution moved by more than this (the largest
gap between CDFs): a rebuild holds the event loop for milliseconds, and on a steady workload a
window of 2,048 times moves by less than this between refreshes."""
PROFILE_BINS = 32
"""Equal-mass knots of Orloj's refreshed solo distribution (its profiler's window). Eq. 2's
curves use 16 bins; with 64 knots the batch maxima of a refresh grow past the knot limit
and are coarsened twice, which costs the event loop several milliseconds per refresh."""


ORLOJ_CONFIGS: dict[str, Mapping[str, Any]] = {
    "orloj": OURS,
    "orloj_paper": {},
}
"""Orloj's settings by scheduler name: ours (the departures of ``docs/scheduling.md``)
and the paper's rules."""


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch``, and ``max_batch`` itself."""
    sizes = {max_batch}
    n = 1
    while n < max_batch:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


@dataclass
class Calibration:
    """The warm-up's measurements (seconds)."""

    alone: list[float] = field(default_factory=list)
    """Requests sent alone: measured latency."""
    alone_exec: list[float] = field(default_factory=list)
    """Their reported execution times (empty for a model that reports none)."""
    apps: list[str] = field(default_factory=list)
    """Their apps (a queue shared by several apps warms up on all of them)."""
    probes: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Size -> (probe latency, latency of the request it copies sent alone)."""

    def overhead_s(self) -> float:
        if self.static():  # its solo times are whole latencies: no overhead beside them
            return 0.0
        return max(0.0, statistics.median(
            a - e for a, e in zip(self.alone, self.alone_exec, strict=True)))

    def slope(self, overhead_s: float) -> float:
        slopes = []
        for n, pairs in self.probes.items():
            if n < 2 or not pairs:
                continue
            probe = statistics.median(p for p, _ in pairs) - overhead_s
            alone = statistics.median(a for _, a in pairs) - overhead_s
            if alone > 0:
                slopes.append((probe / alone - 1.0) / (n - 1))
        return min(MAX_SLOPE, max(0.0, statistics.median(slopes))) if slopes else 0.0

    def law(self) -> BatchLaw:
        overhead = self.overhead_s()
        return BatchLaw(slope=self.slope(overhead), overhead_s=overhead)

    def static(self) -> bool:
        """Whether the model reported no execution times of its own (a static model).

        Its solo times are then whole requests' latencies, whose spread is the machine's.
        """
        return not self.alone_exec or len(self.alone_exec) != len(self.alone)

    def solo(self) -> list[float]:
        """The solo execution times the profile starts from."""
        return list(self.alone) if self.static() else list(self.alone_exec)

    def solo_by_app(self) -> dict[str, list[float]]:
        """:meth:`solo`, per app."""
        found: dict[str, list[float]] = {}
        for app_id, seconds in zip(self.apps, self.solo(), strict=True):
            found.setdefault(app_id, []).append(seconds)
        return found


MIN_APP_SAMPLES = 2
"""Solo times an app needs for a distribution of its own (with fewer, the queue's pool)."""


def profile_of(solo: Mapping[str, Sequence[float]], law: BatchLaw, per_batch: bool = False,
               arrivals: Mapping[str, int] | None = None, pooled: str = "pool") -> ModelProfile:
    """The profile of a queue's model: each app's solo times (seconds) as its distribution.

    ``arrivals``: recent requests per app, the mixture's weights (default: equal). An app with
    fewer than ``MIN_APP_SAMPLES`` times has none of its own (``ModelProfile.solo`` gives it
    the mixture); when no app has that many, all times are pooled under ``pooled``.
    ``per_batch``: a static model (``ModelProfile.per_batch``).
    """
    own = {app_id: Distribution.from_samples(np.asarray(times, dtype=float))
           for app_id, times in solo.items() if len(times) >= MIN_APP_SAMPLES}
    if not own:
        everything = [t for times in solo.values() for t in times]
        if not everything:
            raise ValueError("a profile needs at least one solo time")
        own = {pooled: Distribution.from_samples(np.asarray(everything, dtype=float))}
    counts = arrivals or {}
    weights = {app_id: float(counts.get(app_id, 0)) + 1.0 for app_id in own}
    return ModelProfile(own, weights, law, per_batch=per_batch)


def make_scheduler(name: str, profile: ModelProfile, slo_s: float,
                   max_batch: int) -> BatchScheduler:
    """A scheduler of ``SCHEDULERS`` planned from ``profile`` for the objective ``slo_s``.

    ``orloj``: with our departures on (``docs/scheduling.md``), as the simulator's "Orloj
    (ours)"; ``orloj_paper``: the paper's rules; the baselines with the settings the simulator
    gives them.
    """
    sizes = batch_sizes(max_batch)
    law, solo = profile.law, profile.mix
    if name in ORLOJ_CONFIGS:
        config = OrlojConfig(batch_sizes=sizes, refresh_every=REFRESH_EVERY,
                             refresh_tolerance=REFRESH_TOLERANCE, background_refresh=True,
                             **ORLOJ_CONFIGS[name])
        return Orloj(profile, config, Profiler(window=2048, bins=PROFILE_BINS, law=law))
    if name == "clipper":
        return ClipperLike(slo_s, max_batch=max_batch)
    if name == "nexus":
        return NexusLike(law, solo.mean(), slo_s, max_batch=max_batch)
    if name == "clockwork":
        p99 = solo.quantile(0.99)
        return ClockworkLike(law, p99, sizes, window_s=CLOCKWORK_WINDOW_OF_P99 * p99)
    if name == "triton":
        return TritonBatcher(max_batch, max_queue_delay_s=TRITON_DELAY_OF_SLO * slo_s)
    raise ValueError(f"unknown scheduler {name!r} (one of {', '.join(SCHEDULERS)})")


def replan(scheduler: BatchScheduler, profile: ModelProfile, slo_s: float,
           max_batch: int) -> None:
    """Give a fixed-profile baseline the window's numbers (Orloj refreshes on its own)."""
    if isinstance(scheduler, NexusLike):
        scheduler.law, scheduler.solo_s = profile.law, profile.mix.mean()
        scheduler.batch_size = plan_batch(profile.law, scheduler.solo_s, slo_s, max_batch)
    elif isinstance(scheduler, ClockworkLike):
        scheduler.law, scheduler.solo_s = profile.law, profile.mix.quantile(0.99)
        scheduler.window_s = CLOCKWORK_WINDOW_OF_P99 * scheduler.solo_s


def describe_apps(profile: ModelProfile) -> str:
    """Each app's solo p50 / p99 in ms, for the log."""
    return ", ".join(f"{app} {d.quantile(0.5) * 1000:.3f} / {d.quantile(0.99) * 1000:.3f}"
                     for app, d in sorted(profile.apps.items()))


def describe_overhead(profile: ModelProfile) -> str:
    """The measured overhead's p50 in ms, or the law's constant, for the log."""
    if profile.overhead is None:
        return f"{profile.law.overhead_s * 1000:.3f} ms (the law's)"
    return f"{profile.overhead.quantile(0.5) * 1000:.3f} ms"
