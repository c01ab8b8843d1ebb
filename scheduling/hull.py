"""A dynamic upper convex hull for "which point maximises A·u + β" (Orloj §4.4).

Each queued request is a point ``(A, β)``; its priority at time ``t`` is ``A·u + β`` with
``u = e^{(t - t0)/a} > 0``, so the request of highest priority is an extreme point of the upper
hull in direction ``(u, 1)``. Orloj keeps the hull with Overmars and van Leeuwen's structure;
here the logarithmic method (Bentley and Saxe) stands in for it: the points live in blocks of
sizes that are powers of two, each block keeps its static upper hull, an insertion merges equal
blocks (amortised O(log² n)), a query searches each block's hull (O(log² n)), and a deletion
marks the point dead — a block whose answer is dead is rebuilt from its live points before it
answers again, so answers are always live points.

While it holds few points (at most ``SMALL``) it keeps no blocks: a query scans them, which
costs less than the block merges every insertion would (most queues hold a handful of
requests); past ``SMALL`` it builds its blocks, and drops them again below ``SMALL // 2``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

SMALL = 16
"""Up to this many points, no blocks: a query scans them all."""

Point = tuple[float, float, Hashable, int]
"""(A, β, key, version)."""


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


@dataclass(slots=True)
class _Block:
    points: list[Point]
    hull: list[Point] = field(default_factory=list)
    neg_slopes: list[float] = field(default_factory=list)
    """-(slope of hull edge i → i+1), increasing (the upper hull's slopes decrease)."""

    def __post_init__(self) -> None:
        self.build()

    def build(self) -> None:
        # Among equal A only the highest β can be extreme in any direction (u, 1).
        best: dict[float, Point] = {}
        for p in self.points:
            q = best.get(p[0])
            if q is None or p[1] > q[1]:
                best[p[0]] = p
        hull: list[Point] = []
        for p in sorted(best.values(), key=lambda q: q[0]):
            while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) >= 0:
                hull.pop()
            hull.append(p)
        self.hull = hull
        self.neg_slopes = [-(b[1] - a[1]) / (b[0] - a[0])
                           for a, b in zip(hull, hull[1:], strict=False)]

    def best(self, u: float) -> Point:
        # Moving from vertex i to i+1 gains Δβ + u·ΔA = ΔA·(slope + u): stop at the first
        # edge whose slope is <= -u, i.e. whose negated slope is >= u.
        return self.hull[bisect_left(self.neg_slopes, u)]


class UpperHull:
    """Points keyed by a hashable; ``best(u)`` is the live key maximising ``A·u + β``."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []
        self._live: dict[Hashable, tuple[float, float, int]] = {}
        self._dead = 0
        self._version = 0
        self._blocked = False
        """Whether the points are in blocks (else few enough to scan)."""

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._live

    def keys(self) -> Iterable[Hashable]:
        return self._live.keys()

    def point(self, key: Hashable) -> tuple[float, float]:
        """(A, β) of ``key`` (KeyError when absent)."""
        a, beta, _ = self._live[key]
        return a, beta

    def insert(self, key: Hashable, a: float, beta: float) -> None:
        """Add ``key`` at ``(a, beta)`` (an existing key is moved)."""
        if key in self._live:
            self.remove(key)
        self._version += 1
        self._live[key] = (a, beta, self._version)
        if not self._blocked:
            if len(self._live) > SMALL:
                self._blocked = True
                self._rebuild()
            return
        carry: list[Point] = [(a, beta, key, self._version)]
        while self._blocks and len(self._blocks[-1].points) <= len(carry):
            carry += self._blocks.pop().points
        live = [p for p in carry if self._is_live(p)]
        self._dead -= len(carry) - len(live)
        self._blocks.append(_Block(live))

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (no-op when absent)."""
        if self._live.pop(key, None) is None or not self._blocked:
            return
        if len(self._live) <= SMALL // 2:  # few again: scanning is cheaper
            self._blocked, self._blocks, self._dead = False, [], 0
            return
        self._dead += 1
        if self._dead > max(64, 2 * len(self._live)):
            self._rebuild()

    def best(self, u: float) -> tuple[Hashable, float] | None:
        """(key, A·u + β) of the live point of highest value at ``u``; None when empty."""
        top: tuple[Hashable, float] | None = None
        if not self._blocked:
            for key, (a, beta, _) in self._live.items():
                value = a * u + beta
                if top is None or value > top[1]:
                    top = (key, value)
            return top
        for block in self._blocks:
            while block.hull:
                point = block.best(u)
                if self._is_live(point):
                    a, beta, key, _ = point
                    value = a * u + beta
                    if top is None or value > top[1]:
                        top = (key, value)
                    break
                self._purge(block)
        return top

    def _is_live(self, point: Point) -> bool:
        entry = self._live.get(point[2])
        return entry is not None and entry[2] == point[3]

    def _purge(self, block: _Block) -> None:
        before = len(block.points)
        block.points = [p for p in block.points if self._is_live(p)]
        self._dead -= before - len(block.points)
        block.build()

    def _rebuild(self) -> None:
        points = [(a, beta, key, v) for key, (a, beta, v) in self._live.items()]
        self._blocks, self._dead = [], 0
        # re-insert as binary-counter blocks, largest first
        size = 1
        while size * 2 <= len(points):
            size *= 2
        start = 0
        while start < len(points):
            while size > len(points) - start:
                size //= 2
            self._blocks.append(_Block(points[start:start + size]))
            start += size
