"""The clearing check: can every queued request still be served by its deadline?"""

from __future__ import annotations

import random

from scheduling.clearing import clears, first_batch, first_if_clears
from scheduling.types import QueuedRequest


def latency_of(counts: dict[str, int]) -> tuple[float, float]:
    """A batch takes 10 ms plus 2 ms per request (p99: 20 % more)."""
    mean = 0.010 + 0.002 * sum(counts.values())
    return mean, 1.2 * mean


def request(key: int, deadline: float) -> QueuedRequest:
    return QueuedRequest(key, "app", 0.0, deadline)


def test_requests_that_fit_only_batched_together_clear() -> None:
    # alone, the second would start at 12 ms and end at 26.4 ms (p99) > 25 ms; batched with
    # the first, both end at 16.8 ms (p99)
    order = [request(1, 0.020), request(2, 0.025)]
    assert clears(order, 0.0, latency_of, largest=8)
    assert not clears(order, 0.0, latency_of, largest=1)


def test_a_deadline_within_the_mean_but_not_the_p99_does_not_clear() -> None:
    assert not clears([request(1, 0.013)], 0.0, latency_of, largest=8)  # 12 ms mean, 14.4 p99
    assert clears([request(1, 0.015)], 0.0, latency_of, largest=8)


def test_a_later_start_and_the_skipped_requests_count() -> None:
    order = [request(1, 0.020), request(2, 0.030), request(3, 0.031)]
    assert clears(order, 0.0, latency_of, largest=8)
    assert not clears(order, 0.010, latency_of, largest=8)  # the first no longer makes it
    assert clears(order, 0.010, latency_of, largest=8, skip={1})  # the batch that took it


def test_the_first_batch_takes_what_the_earliest_deadline_can_carry() -> None:
    # p99 of a batch of n: 1.2 (10 + 2n) ms; the earliest deadline, 17 ms, carries 2 (16.8)
    order = [request(1, 0.017), request(2, 0.030), request(3, 0.031)]
    assert [r.key for r in first_batch(order, 0.0, latency_of, largest=8)] == [1, 2]
    assert [r.key for r in first_batch(order, 0.0, latency_of, largest=1)] == [1]
    loose = [request(k, 1.0) for k in range(10)]
    assert len(first_batch(loose, 0.0, latency_of, largest=8)) == 8
    assert first_batch([], 0.0, latency_of, largest=8) == []


def test_the_first_batch_where_it_clears_is_both_in_one_walk() -> None:
    rng = random.Random(3)
    for _ in range(500):
        start = rng.uniform(0.0, 0.010)
        order = sorted((request(k, rng.uniform(0.010, 0.080)) for k in range(rng.randint(1, 9))),
                       key=lambda r: r.deadline_s)
        largest = rng.choice([1, 2, 4, 8])
        found = first_if_clears(order, start, latency_of, largest)
        if not clears(order, start, latency_of, largest):
            assert found is None
            continue
        first = first_batch(order, start, latency_of, largest)
        assert found == (first, latency_of({"app": len(first)})[0])
