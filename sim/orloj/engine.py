"""SimPy model of one worker serving one model's queue under a ``BatchScheduler``.

Two processes: the *source* hands each request of the trace to the scheduler at its arrival;
the *worker* asks the scheduler for a batch whenever it is free, runs it for the batch law's
latency of its longest member (``BatchLaw.latency``, padding), then reports it. With no batch it
waits for the next arrival or the decision's ``wake_at_s``, whichever comes first.

A request *finishes* when its batch completes by its deadline; the finish rate is finished
requests over all requests (§5.2). The scheduler's own running time (its thread's CPU time,
so that other processes on a shared machine do not inflate it) is measured but, by default, not
charged to the simulated clock, so a run is deterministic; ``charge_overhead`` adds it (Fig. 12,
where it is the point). ``profile_every``: one finished request in that many
is measured alone and reported (the asynchronous profiler, §3.2).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from scheduling.types import BatchDone, BatchLaw, BatchScheduler, QueuedRequest
from sim.orloj.workload import Trace

Proc = Generator[simpy.Event, Any, None]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one scheduler did with one trace."""

    scheduler: str
    requests: int
    finished: int
    late: int
    dropped: Counter[str]
    batches: int
    mean_batch: float
    decision_us_p50: float
    decision_us_p99: float

    @property
    def finish_rate(self) -> float:
        return self.finished / self.requests if self.requests else 0.0


class _Run:
    def __init__(self, scheduler: BatchScheduler, trace: Trace, law: BatchLaw, slo_s: float,
                 profile_every: int, charge_overhead: bool) -> None:
        self.env = simpy.Environment()
        self.scheduler, self.trace, self.law, self.slo_s = scheduler, trace, law, slo_s
        self.profile_every, self.charge = profile_every, charge_overhead
        self.arrived = self.env.event()
        self.source_done = False
        self.finished = self.late = self.batches = self.batched = 0
        self.dropped: Counter[str] = Counter()
        self.decision_s: list[float] = []

    def source(self) -> Proc:
        trace, env = self.trace, self.env
        for i in range(len(trace)):
            at = float(trace.arrivals[i])
            if at > env.now:
                yield env.timeout(at - env.now)
            self.scheduler.enqueue(QueuedRequest(i, trace.apps[i], at, at + self.slo_s), at)
            if not self.arrived.triggered:
                self.arrived.succeed()
        self.source_done = True
        if not self.arrived.triggered:
            self.arrived.succeed()

    def worker(self) -> Proc:
        env, scheduler = self.env, self.scheduler
        while True:
            started = time.thread_time()
            decision = scheduler.next_batch(env.now)
            spent = time.thread_time() - started
            self.decision_s.append(spent)
            if self.charge and spent > 0:
                yield env.timeout(spent)
            for drop in decision.drops:
                self.dropped[drop.reason] += 1
            if decision.batch:
                yield from self._run_batch(decision.batch)
                continue
            if self.source_done and len(scheduler) == 0:
                return
            if self.source_done and decision.wake_at_s is None:
                self.dropped["stranded"] += len(scheduler)
                return
            if self.arrived.triggered:
                self.arrived = env.event()
            waits: list[simpy.Event] = [self.arrived]
            if decision.wake_at_s is not None:
                waits.append(env.timeout(max(0.0, decision.wake_at_s - env.now)))
            yield env.any_of(waits)

    def _run_batch(self, batch: tuple[QueuedRequest, ...]) -> Proc:
        env, solo = self.env, self.trace.solo
        longest = max(float(solo[int(r.key)]) for r in batch)  # type: ignore[call-overload]
        latency = self.law.latency(len(batch), longest)
        started = env.now
        yield env.timeout(latency)
        self.batches += 1
        self.batched += len(batch)
        for r in batch:
            if env.now <= r.deadline_s + 1e-12:
                self.finished += 1
            else:
                self.late += 1
        sampled = {r.key: float(solo[int(r.key)]) for r in batch  # type: ignore[call-overload]
                   if int(r.key) % self.profile_every == 0}  # type: ignore[call-overload]
        self.scheduler.completed(BatchDone(batch, started, latency, sampled))

    def result(self) -> RunResult:
        us = np.asarray(self.decision_s) * 1e6 if self.decision_s else np.zeros(1)
        return RunResult(self.scheduler.name, len(self.trace), self.finished, self.late,
                         self.dropped, self.batches,
                         self.batched / self.batches if self.batches else 0.0,
                         float(np.percentile(us, 50)), float(np.percentile(us, 99)))


def simulate(scheduler: BatchScheduler, trace: Trace, law: BatchLaw, slo_s: float, *,
             profile_every: int = 8, charge_overhead: bool = False) -> RunResult:
    """Serve ``trace`` (deadline = arrival + ``slo_s``) with ``scheduler`` on one worker."""
    run = _Run(scheduler, trace, law, slo_s, profile_every, charge_overhead)
    run.env.process(run.source())
    run.env.process(run.worker())
    run.env.run()
    return run.result()
