"""Running a set of experiments: units in order (or in worker processes), with a progress bar."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from model_repo.profiles import load_families
from policies.model import Family
from sim.cluster import CALIBRATED, MixKnobs
from sim.experiments import ORDER, Unit, UnitResult, run_unit, ticks, units
from sim.pool import worker_pool
from sim.report import write_all
from sim.timing import Timing, profiler_fit, timing_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SuiteResult:
    """What a run produced: the unit results, the JSON summary and the wall time."""

    results: tuple[UnitResult, ...]
    summary: dict[str, object]
    wall_s: float


def expand(name: str) -> list[str]:
    """``all`` or one experiment name, as the list of experiments to run."""
    return list(ORDER) if name == "all" else [name]


_WORKER: tuple[Mapping[str, Family], Timing, MixKnobs] | None = None


def make_timing(families: Mapping[str, Family], profile_dir: str | None,
                load_times: str) -> Timing:
    """The timing model with load times from ``load_times`` ("profiles" or "paper")."""
    fit = profiler_fit(profile_dir) if load_times == "profiles" else None
    return timing_for(families, load_times, fit)


def _init_worker(profile_dir: str | None, load_times: str, knobs: MixKnobs,
                 stores: tuple[str, ...] = ()) -> None:
    global _WORKER
    families = load_families(profile_dir, stores)
    _WORKER = (families, make_timing(families, profile_dir, load_times), knobs)


def _run_in_worker(unit: Unit) -> UnitResult:
    assert _WORKER is not None
    families, timing, knobs = _WORKER
    return run_unit(unit, families, timing, knobs=knobs)


def run_suite(names: Sequence[str], *, seeds: int, quick: bool, out: Path, jobs: int = 1,
              progress: bool = True, profile_dir: str | None = None,
              load_times: str = "profiles", knobs: MixKnobs = CALIBRATED,
              stores: tuple[str, ...] = ()) -> SuiteResult:
    """Run ``names``' units for seeds 0..seeds-1, write every output under ``out``.

    Results are identical for any ``jobs``: units are independent and kept in order.
    ``knobs`` is the application mix (default: the calibrated one, ``sim.calibrate``).
    ``stores``: artifact stores whose imported families join the packaged ones.
    """
    started = time.perf_counter()
    families = load_families(profile_dir, stores)
    timing = make_timing(families, profile_dir, load_times)
    todo = units(names, seeds, quick)
    total = sum(ticks(u) for u in todo)
    bar = tqdm(total=total, desc="sim", unit="run", disable=not progress, leave=False)
    results: list[UnitResult] = []
    if jobs <= 1:
        for unit in todo:
            bar.set_postfix_str(f"{unit.experiment} seed {unit.seed} {unit.value}")
            results.append(run_unit(unit, families, timing, tick=lambda: bar.update(1),
                                    knobs=knobs))
    else:
        with worker_pool(jobs, initializer=_init_worker,
                         initargs=(profile_dir, load_times, knobs, stores)) as pool:
            for unit, result in zip(todo, pool.map(_run_in_worker, todo), strict=True):
                bar.update(ticks(unit))
                results.append(result)
    bar.close()
    wall = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    summary = write_all(out, results, seeds=seeds, quick=quick, wall_s=wall, names=names,
                        timing=timing, knobs=knobs)
    logger.info("simulated %d units in %.1f s; report in %s", len(todo), wall,
                out / "report.md")
    return SuiteResult(tuple(results), summary, wall)
