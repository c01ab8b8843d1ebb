"""Timing inputs for hand-computed simulator timelines (sim/engine.py), shared by its tests."""

from __future__ import annotations

import random

from sim.timing import LoadTimeFit, Timing

ONE_MS_PER_MB = LoadTimeFit(0.0, 1.0, "test: 1 ms per MB")
TIMING = Timing(detection_jitter_ms=0.0, notification_ms=10.0, command_ms=1.0, load_threads=1,
                fit=ONE_MS_PER_MB)
"""Command 1 ms, 1 ms of load per MB, notification 10 ms, one load thread per server."""


class HalfPhase(random.Random):
    """Heartbeat phase 0.5 and no jitter: every detection takes (2 - 0.5) x 20 = 30 ms."""

    def random(self) -> float:
        return 0.5

    def uniform(self, a: float, b: float) -> float:
        return a
