"""Orloj's size queues for requests that found the queue idle, without hulls or heaps.

When the worker frees and every waiting request arrived during the batch before (the queue
held none), placing them in the size queues (a hull insertion and two heap pushes per size)
only to take most of them out again as the next batch is most of a decision's CPU time, on
the path of every request in that batch. :func:`fresh_queues` builds, for the same requests,
queues that rank them as the size queues would: the same members (a request is in the queue
of every size it can still make, ``Curve.placed``), the same points on eq. 2's curves, the
same order (a queue holding no more than its size gives its members in arrival order, a
fuller one its best first, equal priorities in arrival order, as the hull's scan does).
Orloj weighs its candidate batches on them as on its own queues; the requests the batch
leaves wait unplaced, and the next decision ranks them again from their slack then.

It answers None where the size queues might rank otherwise: past ``hull.SMALL`` requests (the
hull then keeps blocks, whose ties may fall otherwise) or when a request sits exactly on its
curve's next edge (the size queues would move it at once).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduling.hull import SMALL
from scheduling.priority import DEAD, Curve
from scheduling.types import QueuedRequest

CurveOf = Callable[[str, int], Curve]
"""Eq. 2's curve of an app's request in a batch of ``n``."""


class RankedQueue(Protocol):
    """What Orloj's choice of a batch asks of a size's queue (``SizeQueue`` or ``FreshQueue``)."""

    @property
    def size(self) -> int: ...

    @property
    def members(self) -> Mapping[Hashable, object]: ...

    def earliest(self) -> float: ...

    def top(self, u: float, count: int = 0) -> list[Hashable]: ...


@dataclass(slots=True)
class FreshQueue:
    """A size's queue of requests placed at one instant (``SizeQueue``'s ranking, no hull)."""

    size: int
    members: dict[Hashable, tuple[float, float]] = field(default_factory=dict)
    """Key → its point (A, β), in arrival order."""
    earliest_s: float = float("inf")

    def add(self, key: Hashable, point: tuple[float, float], deadline_s: float) -> None:
        self.members[key] = point
        self.earliest_s = min(self.earliest_s, deadline_s)

    def earliest(self) -> float:
        """Earliest deadline among the members."""
        return self.earliest_s

    def top(self, u: float, count: int = 0) -> list[Hashable]:
        """As ``SizeQueue.top``: the ``count`` (default: ``size``) keys of highest ``A·u + β``.

        All of them, in arrival order, when the queue holds no more than a batch.
        """
        if len(self.members) <= self.size:
            return list(self.members)
        count = min(count or self.size, len(self.members))
        points = self.members  # a stable sort: equal priorities keep their arrival order
        return sorted(points, key=lambda key: -(points[key][0] * u + points[key][1]))[:count]


def fresh_queues(requests: Sequence[QueuedRequest], now_s: float, curve_of: CurveOf,
                 sizes: Sequence[int]) -> list[FreshQueue] | None:
    """Per batch size: the queue ``requests`` make, placed at ``now_s`` as the reference time.

    ``requests``: in arrival order, each able to make a batch of the smallest size. Only the
    sizes that can be ready; the smallest first. None where the size queues might rank
    otherwise (see the module doc).
    """
    if len(requests) > SMALL:
        return None
    # a size whose next smaller one can hold them all is never ready (Orloj._ready): left out
    sizes = [size for i, size in enumerate(sizes) if i == 0 or sizes[i - 1] < len(requests)]
    queues = [FreshQueue(size) for size in sizes]
    curves: dict[str, list[Curve]] = {}
    for request in requests:
        own = curves.get(request.app)
        if own is None:
            own = curves[request.app] = [curve_of(request.app, size) for size in sizes]
        for queue, curve in zip(queues, own, strict=True):  # feasible sizes are a prefix
            regime, a, beta, leaves_at = curve.placed(request.deadline_s, now_s)
            if regime == DEAD:
                break
            if leaves_at <= now_s:
                return None
            queue.add(request.key, (a, beta), request.deadline_s)
    return queues
