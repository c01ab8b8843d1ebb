"""Run one Orloj experiment (``understudy sim experiment orloj-figN``) and write its outputs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sim.orloj.experiments import EXPERIMENTS, Point
from sim.orloj.report import text_table, write_all

logger = logging.getLogger(__name__)

NAMES = tuple(EXPERIMENTS)


@dataclass(frozen=True, slots=True)
class OrlojRun:
    """The points, the text table, the summary and the wall time of one experiment."""

    points: tuple[Point, ...]
    table: str
    summary: dict[str, object]
    wall_s: float


def run_experiment(name: str, *, out: Path, quick: bool = False, seed: int = 0) -> OrlojRun:
    """Run ``name``; write ``out/name/{points.csv,table.txt,summary.json,name.png}``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; one of {', '.join(NAMES)}")
    started = time.perf_counter()
    points = tuple(EXPERIMENTS[name].run(quick, seed))
    wall = time.perf_counter() - started
    result = write_all(name, points, out)
    result["wall_s"] = round(wall, 2)
    result["quick"] = quick
    logger.info("%s: %d points in %.1f s, outputs in %s", name, len(points), wall, out / name)
    return OrlojRun(points, text_table(name, points), result, wall)
