"""Whether a queue can still be cleared in time: every request served by its deadline.

Orloj's goodput selection (``Orloj._keep_clearable``) asks it before each batch: while the
whole queue can be cleared, no batch may be picked after which it could not be. The test
serves the requests in deadline order, in greedy batches, with each batch's latency known by
its composition (requests per app).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence

from scheduling.types import QueuedRequest

LatencyOf = Callable[[dict[str, int]], tuple[float, float]]
"""(mean, p99) latency of a batch with the given requests per app."""


def clears(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
           largest: int, skip: Collection[Hashable] = ()) -> bool:
    """Whether ``order`` (by deadline) less ``skip`` can all finish in time from ``start_s``.

    Served in deadline order, in batches of at most ``largest``: each batch takes the next
    requests while the earliest deadline among them is still met within the batch's p99
    latency, and the next starts after its expected latency. A request is protected while it
    still has a margin, not once its chance is down to a coin toss.
    """
    t = start_s
    batch: dict[str, int] = {}
    first = 0.0
    for request in order:
        if request.key in skip:
            continue
        if batch and sum(batch.values()) < largest:
            batch[request.app] = batch.get(request.app, 0) + 1
            if t + latency_of(batch)[1] <= first:
                continue  # it rides along
            batch[request.app] -= 1
        if batch:  # the batch so far goes; this request opens the next one
            t += latency_of(batch)[0]
        batch, first = {request.app: 1}, request.deadline_s
        if t + latency_of(batch)[1] > first:
            return False
    return True


def first_batch(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
                largest: int) -> list[QueuedRequest]:
    """The first batch :func:`clears` would send from ``order`` (by deadline) at ``start_s``.

    The earliest deadline's request and the next ones while that deadline is still met
    within the batch's p99 latency, at most ``largest``.
    """
    batch = list(order[:1])
    if not batch:
        return batch
    counts = {batch[0].app: 1}
    for request in order[1:largest]:
        counts[request.app] = counts.get(request.app, 0) + 1
        if start_s + latency_of(counts)[1] > batch[0].deadline_s:
            break
        batch.append(request)
    return batch
