"""The baselines of Orloj's evaluation, behind the same ``BatchScheduler`` interface.

Each keeps the idea that defines it and nothing of its system around it:

* :class:`ClipperLike` — reactive: FIFO, and the batch size adapts by AIMD (Clipper §4.3.1:
  add ``step`` while batches finish within the latency objective, cut by ``backoff`` when one
  does not). No deadline-aware drop; requests whose deadline has passed are discarded.
* :class:`NexusLike` — a plan from a fixed profile (the *mean* execution time): the largest
  batch ``b`` with ``2·ℓ(b) <= SLO`` (a request may wait for one batch and run in the next,
  Nexus §6.1), FIFO, and early drop: requests at the head that cannot finish in a batch
  started now are dropped (Nexus §6.3).
* :class:`ClockworkLike` — plan ahead with a fixed p99 execution time: EDF, drop what cannot
  finish even alone, then the largest batch size whose earliest ``n`` requests all finish by
  ``now + ℓ99(n)``. The next batch is planned for the predicted end of the current one; when
  the worker is still busy past that prediction plus ``window_s``, the planned batch misses
  its execution window and fails (Clockwork's action timeouts, the "fail every other batch"
  pattern of Orloj §2.3).
* :class:`TritonBatcher` — Triton's dynamic batcher: FIFO, send ``max_batch`` as soon as that
  many wait, else whatever waits once the oldest has waited ``max_queue_delay_s``; requests
  past their deadline are rejected (a queue policy with timeouts).

``ℓ(n)`` is the batch law (``scheduling.types.BatchLaw``) applied to the profile's constant.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from scheduling.types import (
    EXPIRED,
    UNREACHABLE,
    WINDOW_MISSED,
    BatchDone,
    BatchLaw,
    Decision,
    Drop,
    QueuedRequest,
)


class _Fifo:
    """Arrival order, with the requests past their deadline dropped at the head."""

    def __init__(self) -> None:
        self.queue: deque[QueuedRequest] = deque()

    def __len__(self) -> int:
        return len(self.queue)

    def enqueue(self, request: QueuedRequest, now_s: float) -> None:
        self.queue.append(request)

    def expired(self, now_s: float) -> list[Drop]:
        """Drop every request whose deadline has passed (a FIFO may hold them anywhere)."""
        if not any(r.deadline_s < now_s for r in self.queue):
            return []
        keep: deque[QueuedRequest] = deque()
        drops = []
        for r in self.queue:
            if r.deadline_s < now_s:
                drops.append(Drop(r, EXPIRED))
            else:
                keep.append(r)
        self.queue = keep
        return drops

    def take(self, n: int) -> tuple[QueuedRequest, ...]:
        return tuple(self.queue.popleft() for _ in range(min(n, len(self.queue))))

    def completed(self, done: BatchDone) -> None:
        return None


class ClipperLike(_Fifo):
    name = "clipper"

    def __init__(self, slo_s: float, max_batch: int = 64, step: float = 1.0,
                 backoff: float = 0.9) -> None:
        super().__init__()
        if slo_s <= 0 or max_batch < 1 or step <= 0 or not 0 < backoff < 1:
            raise ValueError("slo_s > 0, max_batch >= 1, step > 0, 0 < backoff < 1")
        self.slo_s, self.max_batch, self.step, self.backoff = slo_s, max_batch, step, backoff
        self.batch_size = 1.0

    def next_batch(self, now_s: float) -> Decision:
        drops = self.expired(now_s)
        return Decision(self.take(int(self.batch_size)), tuple(drops))

    def completed(self, done: BatchDone) -> None:
        if done.latency_s > self.slo_s:
            self.batch_size = max(1.0, self.batch_size * self.backoff)
        else:
            self.batch_size = min(float(self.max_batch), self.batch_size + self.step)


def plan_batch(law: BatchLaw, solo_s: float, slo_s: float, max_batch: int) -> int:
    """Nexus's batch size: the largest ``b <= max_batch`` with ``2·ℓ(b) <= slo_s`` (at least 1)."""
    best = 1
    for b in range(1, max_batch + 1):
        if 2 * law.latency(b, solo_s) <= slo_s:
            best = b
    return best


class NexusLike(_Fifo):
    name = "nexus"

    def __init__(self, law: BatchLaw, mean_solo_s: float, slo_s: float,
                 max_batch: int = 64) -> None:
        super().__init__()
        self.law, self.solo_s = law, mean_solo_s
        self.batch_size = plan_batch(law, mean_solo_s, slo_s, max_batch)

    def next_batch(self, now_s: float) -> Decision:
        drops = self.expired(now_s)
        # early drop: a head request that misses even in a batch started now goes
        while self.queue:
            size = min(self.batch_size, len(self.queue))
            if now_s + self.law.latency(size, self.solo_s) <= self.queue[0].deadline_s:
                break
            drops.append(Drop(self.queue.popleft(), UNREACHABLE))
        batch = self.take(self.batch_size)
        expected = self.law.latency(len(batch), self.solo_s) if batch else None
        return Decision(batch, tuple(drops), expected_latency_s=expected)


class ClockworkLike:
    name = "clockwork"

    def __init__(self, law: BatchLaw, p99_solo_s: float,
                 batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16), window_s: float = 0.0) -> None:
        if window_s < 0 or not batch_sizes or min(batch_sizes) < 1:
            raise ValueError("window_s >= 0, positive batch sizes")
        self.law, self.solo_s = law, p99_solo_s
        self.sizes = tuple(sorted(set(batch_sizes), reverse=True))
        self.window_s = window_s
        self._heap: list[tuple[float, int, QueuedRequest]] = []
        self._seq = itertools.count()
        self._predicted_end: float | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def enqueue(self, request: QueuedRequest, now_s: float) -> None:
        heapq.heappush(self._heap, (request.deadline_s, next(self._seq), request))

    def _plan(self, at_s: float) -> tuple[list[Drop], tuple[QueuedRequest, ...]]:
        drops = []
        while self._heap and at_s + self.law.latency(1, self.solo_s) > self._heap[0][0]:
            drops.append(Drop(heapq.heappop(self._heap)[2], UNREACHABLE))
        for n in self.sizes:
            # EDF: the earliest deadline of the n first is the head's
            if len(self._heap) >= n and at_s + self.law.latency(n, self.solo_s) <= \
                    self._heap[0][0]:
                return drops, tuple(heapq.heappop(self._heap)[2] for _ in range(n))
        return drops, ()

    def next_batch(self, now_s: float) -> Decision:
        drops: list[Drop] = []
        planned_at = self._predicted_end
        if planned_at is not None and now_s > planned_at + self.window_s:
            # the batch planned for the predicted end was sent to the worker with a window
            # that has passed by now: it times out
            missed, batch = self._plan(planned_at)
            drops += missed + [Drop(r, WINDOW_MISSED) for r in batch]
        self._predicted_end = None
        missed, batch = self._plan(now_s)
        drops += missed
        if not batch:
            return Decision(drops=tuple(drops))
        expected = self.law.latency(len(batch), self.solo_s)
        self._predicted_end = now_s + expected
        return Decision(batch, tuple(drops), expected_latency_s=expected)

    def completed(self, done: BatchDone) -> None:
        return None


class TritonBatcher(_Fifo):
    name = "triton"

    def __init__(self, max_batch: int = 16, max_queue_delay_s: float = 0.0) -> None:
        super().__init__()
        if max_batch < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch >= 1, max_queue_delay_s >= 0")
        self.max_batch, self.delay_s = max_batch, max_queue_delay_s

    def next_batch(self, now_s: float) -> Decision:
        drops = tuple(self.expired(now_s))
        if len(self.queue) >= self.max_batch:
            return Decision(self.take(self.max_batch), drops)
        if self.queue:
            due = self.queue[0].arrival_s + self.delay_s
            if now_s >= due:
                return Decision(self.take(self.max_batch), drops)
            return Decision(drops=drops, wake_at_s=due)
        return Decision(drops=drops)

