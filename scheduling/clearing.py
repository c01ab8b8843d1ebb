"""Whether a queue can still be cleared in time: every request served by its deadline.

Orloj's goodput selection asks it before each batch: while the whole queue can be cleared,
the schedule's first batch goes (``Orloj._clearing_batch``), or, with ``while_clearable=
"goodput"``, no batch may be picked after which it could not be (``Orloj._keep_clearable``).
The schedule serves the requests in deadline order, in greedy batches, with each batch's
latency known by its composition (requests per app).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from operator import attrgetter

from scheduling.types import QueuedRequest

CLEAR_LIMIT = 64
"""Queues longer than this are not checked for being cleared in time (``clears`` walks the
whole queue, for every candidate Orloj weighs): such a queue is overloaded in all but name."""

LatencyOf = Callable[[dict[str, int]], tuple[float, float]]
"""(mean, p99) latency of a batch with the given requests per app."""


def schedule(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
             largest: int, skip: Collection[Hashable] = ()
             ) -> Iterator[tuple[list[QueuedRequest], float]]:
    """The clearing schedule of ``order`` (by deadline) less ``skip``: batches and their starts.

    In deadline order, in batches of at most ``largest``: each batch takes the next requests
    while the earliest deadline among them is still met within the batch's p99 latency, and
    the next starts after its expected latency.
    """
    t = start_s
    batch: list[QueuedRequest] = []
    counts: dict[str, int] = {}
    for request in order:
        if request.key in skip:
            continue
        if batch and len(batch) < largest:
            counts[request.app] = counts.get(request.app, 0) + 1
            if t + latency_of(counts)[1] <= batch[0].deadline_s:
                batch.append(request)
                continue  # it rides along
            counts[request.app] -= 1
        if batch:  # the batch so far goes; this request opens the next one
            yield batch, t
            t += latency_of(counts)[0]
        batch, counts = [request], {request.app: 1}
    if batch:
        yield batch, t


def _in_time(head: QueuedRequest, start_s: float, latency_of: LatencyOf) -> bool:
    """Whether a batch opened by ``head`` and started at ``start_s`` meets its deadline.

    Within the p99 latency of ``head`` alone: the check :func:`clears` makes of every batch.
    """
    return start_s + latency_of({head.app: 1})[1] <= head.deadline_s


def clears(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
           largest: int, skip: Collection[Hashable] = ()) -> bool:
    """Whether ``order`` (by deadline) less ``skip`` can all finish in time from ``start_s``.

    Served as :func:`schedule` batches them, every batch meets its earliest deadline within
    its p99 latency. A request is protected while it still has a margin, not once its chance
    is down to a coin toss.
    """
    head = next((r for r in order if r.key not in skip), None)
    if head is not None and not _in_time(head, start_s, latency_of):
        return False  # the first batch's own check, before its batch is formed
    return all(_in_time(batch[0], t, latency_of)
               for batch, t in schedule(order, start_s, latency_of, largest, skip))


def first_if_clears(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
                    largest: int) -> tuple[list[QueuedRequest], float] | None:
    """:func:`first_batch` and its mean latency where :func:`clears` holds, else None.

    One walk of the schedule for both (the clearing check runs on the path of every batch).
    """
    first: tuple[list[QueuedRequest], float] | None = None
    if order and not _in_time(order[0], start_s, latency_of):
        return None  # the first batch's own check, before its batch is formed
    for batch, t in schedule(order, start_s, latency_of, largest):
        if not _in_time(batch[0], t, latency_of):
            return None
        if first is None:
            first = (batch, latency_of(counts_of(batch))[0])
    return first


def first_batch(order: Sequence[QueuedRequest], start_s: float, latency_of: LatencyOf,
                largest: int) -> list[QueuedRequest]:
    """The first batch of ``order``'s clearing schedule (:func:`schedule`) at ``start_s``.

    The earliest deadline's request and the next ones while that deadline is still met
    within the batch's p99 latency, at most ``largest``.
    """
    return next(iter(schedule(order, start_s, latency_of, largest)), ([], start_s))[0]


def counts_of(requests: Sequence[QueuedRequest]) -> dict[str, int]:
    """Requests per app among ``requests`` (a batch's composition)."""
    counts: dict[str, int] = {}
    for request in requests:
        counts[request.app] = counts.get(request.app, 0) + 1
    return counts


def by_deadline(requests: Sequence[QueuedRequest]) -> list[QueuedRequest] | None:
    """``requests`` by deadline (ties in their order), for :func:`clears`.

    None past ``CLEAR_LIMIT``: the check walks the whole queue for every candidate weighed.
    """
    if len(requests) > CLEAR_LIMIT:
        return None
    return sorted(requests, key=attrgetter("deadline_s"))
