"""The simulator's clock: failure detection, notifications and model load times.

Every number is a documented default; ``Timing`` holds them so an experiment can change any.

* **Detection** (FailLite §4): each agent pushes a heartbeat every T = 20 ms and the
  controller declares a server failed when k = 2 consecutive heartbeats are missing. Our
  controller keeps a deadline per server (DESIGN.md: an event-driven timer, not a scan). The
  failure strikes at a uniformly random phase of the heartbeat period, so the last heartbeat
  was sent U·T before it (U ~ U[0, 1)) and the deadline passes (k - U)·T after the failure,
  plus a network jitter uniform in [0, ``detection_jitter_ms``]: 20..45 ms with the
  defaults. ``detector_period_ms`` > 0 models a periodic check instead (the paper's testbed
  checks every 100 ms and reports detection "typically took 65 ms", §5.1 and §5.8).
* **Notification** (§5.8): "informing the clients with the location of the failover replica
  was around 10ms": ``notification_ms = 10``.
* **Commands**: a controller-to-agent command (promote, load) takes ``command_ms`` = 1 ms on
  an edge LAN before the agent acts on it.
* **Loads** (``timing_for``, source "profiles", the default): a variant's load time is its
  measured ``Variant.load_time_s`` (``understudy models profile``) when present; otherwise
  the profiler's fitted line stored in the profile files (``load_time_fit``:
  ``a + b x weights_mb``, the artifact's weights being ``size_mb x artifact_scale``); failing
  that a least-squares line over the measured variants; failing that ``PAPER_LOAD_FIT``.
  Source "paper" uses ``PAPER_LOAD_FIT`` for every variant: the line through FailLite
  Fig. 5's two ConvNeXt points on the A2 testbed, 158 MB in 441 ms and 806 MB in 2105 ms
  (Fig. 2b shows the same linear growth with size), i.e. a = 35.3 ms, b = 2.568 ms per MB of
  GPU memory. Each server loads at most ``load_threads`` = 10 models at once (§5.1: "set the
  model loading thread to 10"); a warm backup needs no load.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.model import Family, Variant

PAPER_SMALL_MB, PAPER_SMALL_MS = 158.0, 441.0
"""FailLite Fig. 5 / §5.2: the small ConvNeXt "of size 158MB, requires 441 ms to load"."""

PAPER_LARGE_MB, PAPER_LARGE_MS = 806.0, 2105.0
"""FailLite Fig. 5 / §5.2: "the large one of size 806MB, requires 2105 ms to load"."""


@dataclass(frozen=True, slots=True)
class LoadTimeFit:
    """Load time as ``intercept_ms + ms_per_mb x MB``, and where the line comes from.

    The MB are the variant's GPU memory (``basis="memory_mb"``) or its weights file
    (``basis="size_mb"``), times ``scale`` (the profiler's artifacts are scaled-down copies).
    """

    intercept_ms: float
    ms_per_mb: float
    source: str
    basis: str = "memory_mb"
    scale: float = 1.0

    def load_ms(self, megabytes: float) -> float:
        """Milliseconds to load (and warm up) a model of ``megabytes`` on this line's basis."""
        return max(0.0, self.intercept_ms + self.ms_per_mb * megabytes * self.scale)

    def variant_ms(self, variant: Variant) -> float:
        """Milliseconds to load ``variant``."""
        size = variant.size_mb if self.basis == "size_mb" else None
        return self.load_ms(variant.memory_mb if size is None else size)


def _paper_fit() -> LoadTimeFit:
    slope = (PAPER_LARGE_MS - PAPER_SMALL_MS) / (PAPER_LARGE_MB - PAPER_SMALL_MB)
    return LoadTimeFit(PAPER_SMALL_MS - slope * PAPER_SMALL_MB, slope,
                       "FailLite Fig. 5 (ConvNeXt on an A2: 158 MB in 441 ms, 806 MB in 2105 ms)")


PAPER_LOAD_FIT = _paper_fit()
"""The default load-time line (a = 35.3 ms, b = 2.568 ms/MB)."""


def fit_measured(families: Iterable[Family]) -> LoadTimeFit | None:
    """Least-squares line through the variants with a measured load time, if two sizes exist."""
    points = [(v.memory_mb, v.load_time_s * 1000.0) for f in families for v in f.variants
              if v.load_time_s is not None]
    sizes = {x for x, _ in points}
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return LoadTimeFit(mean_y - slope * mean_x, slope,
                       f"least squares over {n} measured variants (profiler)")


@dataclass(frozen=True, slots=True)
class Timing:
    """Delays of the failover timeline, in milliseconds (see the module docstring)."""

    heartbeat_ms: float = 20.0
    missed_heartbeats: int = 2
    detection_jitter_ms: float = 5.0
    detector_period_ms: float = 0.0
    notification_ms: float = 10.0
    command_ms: float = 1.0
    load_threads: int = 10
    fit: LoadTimeFit = PAPER_LOAD_FIT
    measured: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """Measured load times in ms by (family, variant); they win over ``fit``."""

    def __post_init__(self) -> None:
        if self.heartbeat_ms <= 0 or self.missed_heartbeats < 1 or self.load_threads < 1:
            raise ValueError("heartbeat_ms > 0, missed_heartbeats >= 1, load_threads >= 1")
        if min(self.detection_jitter_ms, self.detector_period_ms, self.notification_ms,
               self.command_ms) < 0:
            raise ValueError("delays must be >= 0")

    def load_ms(self, variant: Variant) -> float:
        """Load time of ``variant``: measured if known, else the fitted line."""
        measured = self.measured.get((variant.family, variant.name))
        if measured is not None:
            return measured
        return self.fit.variant_ms(variant)

    def detection_ms(self, rng: random.Random) -> float:
        """Delay from a server's failure to the controller declaring it failed."""
        phase = rng.random()
        deadline = (self.missed_heartbeats - phase) * self.heartbeat_ms
        deadline += rng.uniform(0.0, self.detection_jitter_ms)
        if self.detector_period_ms <= 0:
            return deadline
        offset = rng.random() * self.detector_period_ms  # the check loop's phase
        return math.ceil((deadline + offset) / self.detector_period_ms) \
            * self.detector_period_ms - offset

    def load_source(self, variant: Variant) -> str:
        """Where ``variant``'s load time comes from: "measured" or "fit"."""
        return "measured" if (variant.family, variant.name) in self.measured else "fit"


LOAD_TIME_SOURCES = ("profiles", "paper")


def profiler_fit(profile_dir: str | Path | None = None) -> LoadTimeFit | None:
    """The profiler's load-time line stored in the profile files (the one over most variants)."""
    from model_repo.profiles import load_family_documents

    fits = [doc.load_time_fit for doc in load_family_documents(profile_dir).values()
            if doc.load_time_fit is not None]
    if not fits:
        return None
    best = max(fits, key=lambda f: (f.variants, f.r2))
    return LoadTimeFit(1000.0 * best.intercept_s, 1000.0 * best.slope_s_per_mb,
                       f"profiler fit over {best.variants} variants on {best.server_type!r} "
                       f"(r2 {best.r2:.2f}; weights at scale {best.artifact_scale:g})",
                       basis="size_mb", scale=best.artifact_scale)


def timing_for(families: Mapping[str, Family], source: str = "profiles",
               fit: LoadTimeFit | None = None, **overrides: Any) -> Timing:
    """``Timing`` whose load times come from ``source`` (see the module docstring).

    ``fit`` is the profiler's line (``profiler_fit``), used with source "profiles".
    """
    if source == "paper":
        return Timing(fit=PAPER_LOAD_FIT, **overrides)
    if source != "profiles":
        raise ValueError(f"unknown load-time source {source!r}; choose {LOAD_TIME_SOURCES}")
    measured = {(v.family, v.name): v.load_time_s * 1000.0
                for f in families.values() for v in f.variants if v.load_time_s is not None}
    line = fit or fit_measured(families.values()) or PAPER_LOAD_FIT
    return Timing(fit=line, measured=measured, **overrides)
