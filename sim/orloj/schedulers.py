"""The schedulers an experiment compares, each built from the same offline profile.

Every scheduler sees the same historical solo execution times (``profile_samples``): Orloj
keeps their empirical distribution per app; the baselines reduce them to the one number their
design uses (Nexus the mean, Clockwork the p99) or ignore them (Clipper, Triton).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from scheduling.baselines import ClipperLike, ClockworkLike, NexusLike, TritonBatcher
from scheduling.distribution import Distribution
from scheduling.orloj import Orloj
from scheduling.orloj_config import OURS, OrlojConfig
from scheduling.profile import ModelProfile, Profiler
from scheduling.types import BatchLaw, BatchScheduler

BATCH_SIZES = (1, 2, 4, 8, 16)
MAX_BATCH = max(BATCH_SIZES)
ORLOJ, ORLOJ_PAPER = "orloj", "orloj-paper"
BASELINES = ("clipper", "nexus", "clockwork", "triton")
ALL = (ORLOJ, ORLOJ_PAPER, *BASELINES)
LABELS = {ORLOJ: "Orloj (ours)", ORLOJ_PAPER: "Orloj (paper's rules)", "clipper": "Clipper",
          "nexus": "Nexus", "clockwork": "Clockwork", "triton": "Triton"}

PAPER_CONFIG = OrlojConfig(batch_sizes=BATCH_SIZES)
"""§4 as written: the mixture for every member, earliest-deadline batch-size selection."""
OURS_CONFIG = OrlojConfig(batch_sizes=BATCH_SIZES, **OURS)
"""Ours: the departures of ``scheduling.orloj_config.OURS`` on (docs/scheduling.md)."""


def model_profile(samples: Mapping[str, np.ndarray], law: BatchLaw) -> ModelProfile:
    apps = {app: Distribution.from_samples(times) for app, times in samples.items()}
    weights = {app: float(times.size) for app, times in samples.items()}
    return ModelProfile(apps, weights, law)


Factory = Callable[[], BatchScheduler]


def factories(samples: Mapping[str, np.ndarray], law: BatchLaw, slo_s: float,
              ours: OrlojConfig = OURS_CONFIG, paper: OrlojConfig = PAPER_CONFIG,
              batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict[str, Factory]:
    """One fresh-scheduler factory per name of ``ALL``, batching up to ``max(batch_sizes)``."""
    if batch_sizes != BATCH_SIZES:
        ours = ours.model_copy(update={"batch_sizes": batch_sizes})
        paper = paper.model_copy(update={"batch_sizes": batch_sizes})
    largest = max(batch_sizes)
    every = np.concatenate(list(samples.values()))
    mean, p99 = float(every.mean()), float(np.quantile(every, 0.99))
    profile = model_profile(samples, law)

    def orloj(config: OrlojConfig, name: str) -> Factory:
        def make() -> BatchScheduler:
            scheduler = Orloj(profile, config, Profiler(law=law))
            scheduler.name = name
            return scheduler
        return make

    return {
        ORLOJ: orloj(ours, ORLOJ),
        ORLOJ_PAPER: orloj(paper, ORLOJ_PAPER),
        "clipper": lambda: ClipperLike(slo_s, max_batch=largest),
        "nexus": lambda: NexusLike(law, mean, slo_s, max_batch=largest),
        "clockwork": lambda: ClockworkLike(law, p99, batch_sizes),
        "triton": lambda: TritonBatcher(largest, max_queue_delay_s=0.1 * slo_s),
    }
