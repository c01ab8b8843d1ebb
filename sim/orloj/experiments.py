"""Orloj's figures as simulated experiments: ``orloj-fig3``, ``orloj-fig7`` ... ``orloj-slope``.

``orloj-load`` is the finish rate against the offered load, which the paper does not plot;
``orloj-slope`` the finish rate on the live bench's shared early-exit queue against what a
batch costs (the batch law's slope), which moves between runs on a shared machine.

Each experiment yields :class:`Point` rows: one finish rate (or, for Fig. 10, a time) per case,
x value and series. The runs of one case share one trace (same arrivals and execution times)
and one offline profile, so the schedulers differ only in their decisions.

Settings (documented in docs/scheduling.md): the load is ``LOAD`` of one worker's capacity at
batch 16 (``orloj-load``: each of ``LOADS``); SLOs are 1.5-5 × the P99 solo execution time;
``--quick`` serves fewer requests and fewer cases.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from scheduling.hull import UpperHull
from scheduling.orloj import Orloj
from sim.orloj.engine import RunResult, simulate
from sim.orloj.paper import SLOS
from sim.orloj.schedulers import (
    ALL,
    BATCH_SIZES,
    MAX_BATCH,
    ORLOJ,
    OURS_CONFIG,
    factories,
    model_profile,
)
from sim.orloj.workload import (
    REAL,
    STATIC,
    Trace,
    Workload,
    bimodal,
    capacity_rps,
    early_exit_queue,
    make_trace,
    modal,
    profile_samples,
)

LOAD = 0.4
"""Mean offered load, as a share of the worker's capacity at the largest batch size."""
LOADS = (0.2, 0.4, 0.6, 0.8, 1.0)
"""``orloj-load``'s loads (``--quick``: 0.4 and 0.8)."""
SLOPES = (0.02, 0.05, 0.1, 0.2, 0.4)
"""``orloj-slope``'s batch slopes (``--quick``: 0.02 and 0.4)."""
SLOPE_LOAD = 0.7
"""``orloj-slope``'s load: the live bench's heaviest (``--sweep-loads``)."""
LIVE_BATCH_SIZES = (1, 2, 4, 8)
"""``orloj-slope``'s batch sizes: the live bench's (at most 8 rows a batch)."""
REQUESTS, QUICK_REQUESTS = 2000, 400


@dataclass(frozen=True, slots=True)
class Point:
    """One measured value: ``experiment``/``case``, x, series -> value."""

    experiment: str
    case: str
    x: float
    series: str
    value: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Experiment:
    name: str
    title: str
    xlabel: str
    ylabel: str
    run: Callable[[bool, int], Iterator[Point]]
    """(quick, seed) -> points."""


@dataclass(frozen=True, slots=True)
class _Setup:
    workload: Workload
    samples: dict[str, np.ndarray]
    p99_s: float
    rate_rps: float


def _setup(workload: Workload, seed: int, load: float = LOAD,
           max_batch: int = MAX_BATCH) -> _Setup:
    samples = profile_samples(workload, np.random.default_rng(seed))
    mix = model_profile(samples, workload.law).mix
    rate = load * capacity_rps(workload, mix, max_batch)
    return _Setup(workload, samples, mix.quantile(0.99), rate)


def _detail(result: RunResult) -> str:
    drops = ",".join(f"{k}={v}" for k, v in sorted(result.dropped.items()))
    return (f"late={result.late};batch={result.mean_batch:.2f};drops={drops};"
            f"decision_us_p50={result.decision_us_p50:.1f}")


def _each_scheduler(name: str, case: str, x: float, setup: _Setup, trace: Trace, slo_s: float,
                    schedulers: tuple[str, ...] = ALL,
                    batch_sizes: tuple[int, ...] = BATCH_SIZES) -> Iterator[Point]:
    """One point per scheduler: its finish rate on ``trace`` for the objective ``slo_s``."""
    law = setup.workload.law
    made = factories(setup.samples, law, slo_s, batch_sizes=batch_sizes)
    for scheduler in schedulers:
        result = simulate(made[scheduler](), trace, law, slo_s)
        yield Point(name, case, x, scheduler, result.finish_rate, _detail(result))


def slo_sweep(name: str, cases: list[Workload], quick: bool, seed: int,
              schedulers: tuple[str, ...] = ALL) -> Iterator[Point]:
    """Finish rate per case, SLO multiple and scheduler."""
    count = QUICK_REQUESTS if quick else REQUESTS
    slos = (1.5, 3.0, 5.0) if quick else SLOS
    for workload in cases:
        setup = _setup(workload, seed)
        trace = make_trace(workload, count, setup.rate_rps, np.random.default_rng(seed + 1))
        for mult in slos:
            yield from _each_scheduler(name, workload.name, mult, setup, trace,
                                       mult * setup.p99_s, schedulers)


def _fig3(quick: bool, seed: int) -> Iterator[Point]:
    cases = [modal(1), modal(2), modal(2, stds=(0.5, 2.0))]
    return slo_sweep("orloj-fig3", cases, quick, seed)


def _fig7(quick: bool, seed: int) -> Iterator[Point]:
    names = ("rdinet-cifar", "gpt-cornell") if quick else tuple(REAL)
    return slo_sweep("orloj-fig7", [REAL[n] for n in names], quick, seed)


def _fig8(quick: bool, seed: int) -> Iterator[Point]:
    if quick:
        cases = [modal(2), modal(4), modal(2, stds=(0.5, 2.0))]
    else:
        cases = [modal(k) for k in range(1, 9)]
        cases += [bimodal(0.5), bimodal(2.0), modal(2, stds=(2.0, 0.5)),
                  modal(2, stds=(0.5, 2.0))]
    return slo_sweep("orloj-fig8", cases, quick, seed)


def _fig9(quick: bool, seed: int) -> Iterator[Point]:
    return slo_sweep("orloj-fig9", list(STATIC.values()), quick, seed)


def _fig10(quick: bool, seed: int) -> Iterator[Point]:
    """Insertion (per request, filling the queue) and query time against the queue's size."""
    rng = random.Random(seed)
    sizes = (10, 100, 1000) if quick else (10, 30, 100, 300, 1000, 3000, 10000)
    for size in sizes:
        points = [(rng.uniform(0, 1), rng.uniform(0, 1)) for _ in range(size)]
        hull = UpperHull()
        started = time.perf_counter()
        for key, (a, beta) in enumerate(points):
            hull.insert(key, a, beta)
        insert_us = (time.perf_counter() - started) / size * 1e6
        queries = 100
        started = time.perf_counter()
        for _ in range(queries):
            hull.best(math.exp(rng.uniform(-5, 5)))
        query_us = (time.perf_counter() - started) / queries * 1e6
        started = time.perf_counter()
        for _ in range(queries):
            u = math.exp(rng.uniform(-5, 5))
            max(a * u + beta for a, beta in points)
        scan_us = (time.perf_counter() - started) / queries * 1e6
        yield Point("orloj-fig10", "hull", size, "insert", insert_us)
        yield Point("orloj-fig10", "hull", size, "query", query_us)
        yield Point("orloj-fig10", "hull", size, "linear-scan query", scan_us)


def _orloj_factory(setup: _Setup, **changes: float) -> Callable[[], Orloj]:
    config = OURS_CONFIG.model_copy(update=changes)
    profile = model_profile(setup.samples, setup.workload.law)
    return lambda: Orloj(profile, config)


def _fig11(quick: bool, seed: int) -> Iterator[Point]:
    """Finish rate of Orloj against the anticipated delay a (× P99), one series per SLO."""
    workload = modal(3)
    setup = _setup(workload, seed)
    count = QUICK_REQUESTS if quick else REQUESTS
    trace = make_trace(workload, count, setup.rate_rps, np.random.default_rng(seed + 1))
    delays = (0.1, 1.0, 10.0) if quick else (0.01, 0.1, 1.0, 10.0, 100.0)
    slos = (1.5, 3.0) if quick else SLOS
    for delay in delays:
        make = _orloj_factory(setup, delay_p99=delay)
        for mult in slos:
            result = simulate(make(), trace, workload.law, mult * setup.p99_s)
            yield Point("orloj-fig11", workload.name, delay, f"SLO {mult:g}x",
                        result.finish_rate, _detail(result))


def _fig12(quick: bool, seed: int) -> Iterator[Point]:
    """Finish rate of Orloj as the execution times shrink, its own running time charged."""
    base = modal(3)
    base_p99_ms = _setup(base, seed).p99_s * 1e3
    targets_ms = (10.0, 1.0, 0.3) if quick else (30.0, 10.0, 3.0, 1.0, 0.5, 0.3, 0.1)
    count = QUICK_REQUESTS if quick else REQUESTS // 2
    slos = (1.5, 3.0) if quick else (1.5, 2.0, 3.0, 5.0)
    for target in targets_ms:
        workload = base.scaled(target / base_p99_ms)
        setup = _setup(workload, seed)
        trace = make_trace(workload, count, setup.rate_rps, np.random.default_rng(seed + 1))
        for mult in slos:
            make = factories(setup.samples, workload.law, mult * setup.p99_s)[ORLOJ]
            result = simulate(make(), trace, workload.law, mult * setup.p99_s,
                              charge_overhead=True)
            yield Point("orloj-fig12", "3-modal", round(setup.p99_s * 1e3, 3),
                        f"SLO {mult:g}x", result.finish_rate, _detail(result))


def _load(quick: bool, seed: int) -> Iterator[Point]:
    """Finish rate against the offered load at tight SLOs, one case per (modes, SLO).

    The paper scales its trace "to the system load" without giving it; this shows how much
    of a gain at a tight SLO is the load's.
    """
    cases = [(modal(2), 1.5)] if quick else [(modal(2), 1.5), (modal(2), 2.0), (modal(3), 1.5)]
    loads = (0.4, 0.8) if quick else LOADS
    count = QUICK_REQUESTS if quick else REQUESTS
    for workload, mult in cases:
        for load in loads:
            setup = _setup(workload, seed, load)
            trace = make_trace(workload, count, setup.rate_rps, np.random.default_rng(seed + 1))
            yield from _each_scheduler("orloj-load", f"{workload.name}, {mult:g}x P99", load,
                                       setup, trace, mult * setup.p99_s)


def _slope(quick: bool, seed: int) -> Iterator[Point]:
    """Finish rate on the shared early-exit queue against the batch slope, one case per SLO.

    As the live bench sets them: batches of at most 8, the load a share of the capacity at
    8 (so the arrival rate falls as batches grow dearer), the SLOs multiples of the p99
    latency of a request alone, the overhead included (what the bench's client measures).
    """
    slopes = (0.02, 0.4) if quick else SLOPES
    multiples = (1.0, 2.0) if quick else (1.0, 1.5, 2.0)
    count = QUICK_REQUESTS if quick else REQUESTS
    for slope in slopes:
        workload = early_exit_queue(slope)
        setup = _setup(workload, seed, SLOPE_LOAD, max(LIVE_BATCH_SIZES))
        alone_p99_s = workload.law.latency(1, setup.p99_s)
        trace = make_trace(workload, count, setup.rate_rps, np.random.default_rng(seed + 1))
        for mult in multiples:
            yield from _each_scheduler("orloj-slope", f"{mult:g}x P99", slope, setup, trace,
                                       mult * alone_p99_s, batch_sizes=LIVE_BATCH_SIZES)


EXPERIMENTS = {e.name: e for e in (
    Experiment("orloj-fig3", "Existing systems on dynamic models (Fig. 3)",
               "SLO (x P99)", "finish rate", _fig3),
    Experiment("orloj-fig7", "Real tasks, stand-in distributions (Fig. 7)",
               "SLO (x P99)", "finish rate", _fig7),
    Experiment("orloj-fig8", "Modes, spreads and unequal peaks (§5.3, Tables 2-3)",
               "SLO (x P99)", "finish rate", _fig8),
    Experiment("orloj-fig9", "Static models (Fig. 9)", "SLO (x P99)", "finish rate", _fig9),
    Experiment("orloj-fig10", "Priority queue efficiency (Fig. 10)", "requests in queue",
               "time (us)", _fig10),
    Experiment("orloj-fig11", "Sensitivity to the anticipated delay a (Fig. 11)",
               "a (x P99)", "finish rate", _fig11),
    Experiment("orloj-fig12", "Shrinking execution times, overhead charged (Fig. 12)",
               "P99 execution time (ms)", "finish rate", _fig12),
    Experiment("orloj-load", "Finish rate against the offered load (not in the paper)",
               "load", "finish rate", _load),
    Experiment("orloj-slope", "The live early-exit queue against the batch slope (not in "
               "the paper)", "batch slope", "finish rate", _slope),
)}
