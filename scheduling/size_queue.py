"""One of Orloj's per-batch-size queues: the requests that can still make a batch of its size.

Each member is a point on the queue's upper convex hull (``scheduling.hull``), placed by its
eq.-2 priority curve (``scheduling.priority``); the point with the highest priority at time
``t`` is the hull's best for ``u = e^{(t - t0)/a}`` (§4.4). ``scheduling.orloj`` moves the
points as deadlines near; this module only holds them and ranks them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from scheduling.hull import UpperHull


@dataclass(slots=True)
class Member:
    """Where a request stands in one size's queue."""

    regime: int
    """Its priority curve's segment (the latency histogram's bin its slack is in)."""
    generation: int
    """Bumped each time it moves, so that the milestones of its old positions are skipped."""


@dataclass(slots=True)
class SizeQueue:
    """The requests that can still make a batch of ``size`` in time."""

    size: int
    hull: UpperHull = field(default_factory=UpperHull)
    members: dict[Hashable, Member] = field(default_factory=dict)
    milestones: list[tuple[float, int, Hashable, int]] = field(default_factory=list)
    """(time, tie-break, key, generation): when a member's slack crosses its next bin edge."""
    deadlines: list[tuple[float, int, Hashable]] = field(default_factory=list)
    """(deadline, tie-break, key), departed members dropped lazily."""

    def earliest(self) -> float:
        """Earliest deadline among the members (stale heap entries dropped lazily)."""
        while self.deadlines and self.deadlines[0][2] not in self.members:
            heapq.heappop(self.deadlines)
        return self.deadlines[0][0] if self.deadlines else math.inf

    def leave(self, key: Hashable) -> None:
        """Take ``key`` out, if it is in."""
        if self.members.pop(key, None) is not None:
            self.hull.remove(key)

    def top(self, u: float, count: int = 0) -> list[Hashable]:
        """The ``count`` (default: ``size``) keys of highest priority at ``u``, best first.

        All of them, unranked, when the queue holds no more than a batch. The queue is left
        as it was: the caller decides whether they leave.
        """
        if len(self.members) <= self.size:
            return list(self.members)
        count = min(count or self.size, len(self.members))
        taken: list[tuple[Hashable, float, float]] = []
        for _ in range(count):
            best = self.hull.best(u)
            if best is None:
                break
            key = best[0]
            taken.append((key, *self.hull.point(key)))
            self.hull.remove(key)
        for key, a, beta in taken:
            self.hull.insert(key, a, beta)
        return [key for key, _, _ in taken]
