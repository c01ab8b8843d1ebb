"""The baselines' defining behaviour: Clipper's AIMD, Nexus's plan and early drop, Clockwork's
p99 plan and action windows, Triton's max batch and queue delay."""

from __future__ import annotations

import pytest

from scheduling.baselines import (
    ClipperLike,
    ClockworkLike,
    NexusLike,
    TritonBatcher,
    plan_batch,
)
from scheduling.types import (
    EXPIRED,
    UNREACHABLE,
    WINDOW_MISSED,
    BatchDone,
    BatchLaw,
    QueuedRequest,
)

LAW = BatchLaw(slope=0.5)


def request(key: int, arrival: float, deadline: float) -> QueuedRequest:
    return QueuedRequest(key, "app", arrival, deadline)


def test_clipper_aimd() -> None:
    clipper = ClipperLike(slo_s=0.1, max_batch=8)
    for key in range(20):
        clipper.enqueue(request(key, 0.0, 10.0), 0.0)
    sizes = []
    for latency in (0.05, 0.05, 0.05, 0.2, 0.05):
        batch = clipper.next_batch(0.0).batch
        sizes.append(len(batch))
        clipper.completed(BatchDone(batch, 0.0, latency))
    assert sizes == [1, 2, 3, 4, 3]  # +1 while under the SLO, x0.9 (floored) after a miss
    assert clipper.batch_size == pytest.approx(4.0 * 0.9 + 1)


def test_clipper_discards_expired_requests_only() -> None:
    clipper = ClipperLike(slo_s=0.1)
    clipper.enqueue(request(1, 0.0, 0.05), 0.0)
    clipper.enqueue(request(2, 0.0, 0.5), 0.0)
    decision = clipper.next_batch(0.1)
    assert [(d.request.key, d.reason) for d in decision.drops] == [(1, EXPIRED)]
    assert [r.key for r in decision.batch] == [2]


def test_nexus_plans_from_the_mean_and_drops_early() -> None:
    # 2 * l(b) <= SLO with l(b) = 10 ms * (1 + 0.5 (b - 1)): b = 3 for a 40 ms SLO
    assert plan_batch(LAW, 0.010, 0.040, 16) == 3
    nexus = NexusLike(LAW, mean_solo_s=0.010, slo_s=0.040)
    nexus.enqueue(request(1, 0.0, 0.015), 0.0)  # a batch of 2 takes 15 ms: too late at 1 ms
    nexus.enqueue(request(2, 0.0, 0.040), 0.0)
    decision = nexus.next_batch(0.001)
    assert [(d.request.key, d.reason) for d in decision.drops] == [(1, UNREACHABLE)]
    assert [r.key for r in decision.batch] == [2]
    assert decision.expected_latency_s == pytest.approx(0.010)


def test_clockwork_largest_batch_that_meets_the_earliest_deadline() -> None:
    clockwork = ClockworkLike(LAW, p99_solo_s=0.010, batch_sizes=(1, 2, 4))
    clockwork.enqueue(request(1, 0.0, 0.005), 0.0)  # cannot finish even alone
    for key in range(2, 7):
        clockwork.enqueue(request(key, 0.0, 0.020), 0.0)  # 4 take 25 ms, 2 take 15 ms
    decision = clockwork.next_batch(0.0)
    assert [(d.request.key, d.reason) for d in decision.drops] == [(1, UNREACHABLE)]
    assert len(decision.batch) == 2
    assert decision.expected_latency_s == pytest.approx(0.015)


def test_clockwork_fails_the_planned_batch_when_the_worker_overruns() -> None:
    clockwork = ClockworkLike(LAW, p99_solo_s=0.010, batch_sizes=(1,), window_s=0.002)
    for key in range(3):
        clockwork.enqueue(request(key, 0.0, 1.0), 0.0)
    assert len(clockwork.next_batch(0.0).batch) == 1  # predicted to end at 10 ms
    on_time = clockwork.next_batch(0.011)  # within the window: fine
    assert on_time.drops == () and len(on_time.batch) == 1
    late = clockwork.next_batch(0.030)  # predicted 21 ms, window to 23 ms: the plan failed
    assert [d.reason for d in late.drops] == [WINDOW_MISSED]
    assert late.batch == ()


def test_triton_waits_for_the_queue_delay_or_a_full_batch() -> None:
    triton = TritonBatcher(max_batch=3, max_queue_delay_s=0.005)
    triton.enqueue(request(1, 0.0, 1.0), 0.0)
    waiting = triton.next_batch(0.001)
    assert waiting.batch == () and waiting.wake_at_s == pytest.approx(0.005)
    assert [r.key for r in triton.next_batch(0.005).batch] == [1]
    for key in range(2, 7):
        triton.enqueue(request(key, 0.006, 1.0), 0.006)
    assert [r.key for r in triton.next_batch(0.006).batch] == [2, 3, 4]
    triton.enqueue(request(9, 0.006, 0.007), 0.006)
    decision = triton.next_batch(0.012)
    assert [(d.request.key, d.reason) for d in decision.drops] == [(9, EXPIRED)]
    assert [r.key for r in decision.batch] == [5, 6]
