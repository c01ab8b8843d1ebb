"""Empirical execution-time distributions and the order statistics of a batch (Orloj §4.2).

A :class:`Distribution` is a piecewise-linear CDF: knots ``xs`` (non-decreasing) with CDF values
``cs`` (non-decreasing, from 0 to 1). Between two knots the probability mass is spread uniformly;
two equal knots make a point mass (an atom), so a static model's constant execution time is the
degenerate case ``Distribution.point(x)`` and goes through the same code as a dynamic model.

The batch of ``n`` requests runs as long as its longest member (requests are padded to the
longest, §4.2.1), so its latency is a function of the maximum order statistic. For independent
draws the CDF of the maximum is the product of the CDFs (eq. 6 for identical ones, eq. 7-8 for
different ones); :func:`max_of` evaluates that product on a refined knot set, and
:meth:`Distribution.expected_max` integrates ``1 - F(x)^n`` exactly over the piecewise-linear CDF
rather than from the midpoints of a histogram (the inaccuracy §4.2.1 warns about).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

_EPS = 1e-12
MAX_KNOTS = 257
"""Knots kept after an operation that would grow them (a product, a mixture of many)."""


@dataclass(frozen=True, eq=False)
class Distribution:
    """A non-negative random duration (seconds) with a piecewise-linear CDF."""

    xs: FloatArray
    cs: FloatArray

    def __post_init__(self) -> None:
        if self.xs.shape != self.cs.shape or self.xs.size < 2:
            raise ValueError("a distribution needs at least two knots, as many CDF values")
        if np.any(np.diff(self.xs) < 0) or np.any(np.diff(self.cs) < -_EPS):
            raise ValueError("knots and CDF values must be non-decreasing")
        if self.xs[0] < 0 or abs(self.cs[0]) > 1e-9 or abs(self.cs[-1] - 1.0) > 1e-9:
            raise ValueError("a duration distribution starts at CDF 0, ends at 1, on x >= 0")

    # --- constructors --------------------------------------------------------------------

    @classmethod
    def point(cls, value_s: float) -> Distribution:
        """The degenerate distribution of a constant duration (a static model)."""
        return cls(np.array([value_s, value_s]), np.array([0.0, 1.0]))

    @classmethod
    def from_knots(cls, xs: Sequence[float] | FloatArray,
                   cs: Sequence[float] | FloatArray) -> Distribution:
        cs_arr = np.clip(np.maximum.accumulate(np.asarray(cs, dtype=float)), 0.0, 1.0)
        cs_arr[0], cs_arr[-1] = 0.0, 1.0
        return cls(np.asarray(xs, dtype=float), cs_arr)

    @classmethod
    def from_samples(cls, samples: Sequence[float] | FloatArray,
                     bins: int = 64) -> Distribution:
        """The empirical distribution of ``samples``: knots at ``bins`` equal-mass quantiles.

        Equal-mass knots follow the modes of a multimodal distribution, and equal samples give
        equal knots, i.e. a point mass, without a special case.
        """
        data = np.sort(np.asarray(samples, dtype=float))
        if data.size == 0:
            raise ValueError("no samples")
        if data[0] < 0:
            raise ValueError("durations are non-negative")
        if data.size == 1 or data[-1] - data[0] <= 1e-9 * max(data[-1], _EPS):
            return cls.point(float(data.mean()))
        count = max(1, min(bins, data.size - 1))
        # extra knots in the upper tail: the maximum of a large batch lives there
        depth = int(math.log2(data.size / count)) if data.size > count else 0
        tail = 1.0 - (1.0 / count) * 0.5 ** np.arange(1, depth + 1)
        cs = np.union1d(np.linspace(0.0, 1.0, count + 1), tail)
        return cls(np.quantile(data, cs), cs)

    # --- queries -------------------------------------------------------------------------

    @property
    def low(self) -> float:
        """The smallest possible value."""
        return float(self.xs[0])

    @property
    def high(self) -> float:
        """The largest possible value."""
        return float(self.xs[-1])

    @property
    def is_point(self) -> bool:
        return self.high - self.low <= 1e-12

    def cdf(self, x: float) -> float:
        """P(X <= x) (right-continuous: an atom at ``x`` counts)."""
        return float(self.cdfs(np.array([x]))[0])

    def cdf_left(self, x: float) -> float:
        """P(X < x) (the left limit: an atom at ``x`` does not count)."""
        return float(self.cdfs(np.array([x]), left=True)[0])

    def cdfs(self, points: FloatArray, left: bool = False) -> FloatArray:
        """The CDF at each of ``points`` (its left limits with ``left``)."""
        xs, cs = self.xs, self.cs
        k = np.searchsorted(xs, points, side="left" if left else "right")
        inside = (k > 0) & (k < xs.size)
        j = np.clip(k, 1, xs.size - 1)
        x0, x1 = xs[j - 1], xs[j]
        span = np.where(x1 > x0, x1 - x0, 1.0)
        value = cs[j - 1] + (cs[j] - cs[j - 1]) * (points - x0) / span
        return np.asarray(np.where(inside, value, np.where(k == 0, 0.0, 1.0)))

    @cached_property
    def _knots(self) -> tuple[list[float], list[float]]:
        return self.xs.tolist(), self.cs.tolist()

    def cdf_list(self, points: Sequence[float]) -> list[float]:
        """:meth:`cdfs` for a few points, as Python floats (no array overhead)."""
        xs, cs = self._knots
        last = len(xs) - 1
        out = []
        for x in points:
            k = bisect_right(xs, x)
            if k == 0:
                out.append(0.0)
            elif k > last:
                out.append(1.0)
            else:
                x0, x1 = xs[k - 1], xs[k]
                span = x1 - x0 if x1 > x0 else 1.0
                out.append(cs[k - 1] + (cs[k] - cs[k - 1]) * (x - x0) / span)
        return out

    def quantile(self, q: float) -> float:
        """The smallest x with P(X <= x) >= q."""
        xs, cs = self.xs, self.cs
        if q <= 0.0:
            return float(xs[0])
        k = int(np.searchsorted(cs, q - 1e-12, side="left"))
        if k >= xs.size:
            return float(xs[-1])
        if k == 0 or cs[k] - cs[k - 1] <= _EPS:
            return float(xs[k])
        frac = (q - cs[k - 1]) / (cs[k] - cs[k - 1])
        return float(xs[k - 1] + frac * (xs[k] - xs[k - 1]))

    def quantiles(self, qs: FloatArray) -> FloatArray:
        """:meth:`quantile` at each of ``qs`` (in [0, 1]), in one pass."""
        xs, cs = self.xs, self.cs
        qs = np.asarray(qs, dtype=float)
        k = np.searchsorted(cs, qs - 1e-12, side="left")
        j = np.clip(k, 1, xs.size - 1)
        rise = cs[j] - cs[j - 1]
        steep = rise > _EPS
        frac = np.where(steep, (qs - cs[j - 1]) / np.where(steep, rise, 1.0), 1.0)
        inside = xs[j - 1] + frac * (xs[j] - xs[j - 1])
        found = np.where(k == 0, xs[0], np.where(k >= xs.size, xs[-1], inside))
        return np.asarray(np.where(qs <= 0.0, xs[0], found))

    def mean(self) -> float:
        """E[X] (computed once: schedulers ask it at every decision)."""
        return self._mean

    @cached_property
    def _mean(self) -> float:
        p = np.diff(self.cs)
        return float(np.sum(p * (self.xs[:-1] + self.xs[1:]) / 2.0))

    def expected_max(self, n: int) -> float:
        """E[max of n independent draws], exact for this piecewise-linear CDF (eq. 5-6).

        E[M] = ∫ (1 - F(x)^n) dx over x >= 0; on a segment where F goes linearly from a to b,
        ∫ F^n dx = Δx (b^(n+1) - a^(n+1)) / ((n + 1)(b - a)).
        """
        if n < 1:
            raise ValueError("a batch has at least one request")
        a, b = self.cs[:-1], self.cs[1:]
        dx = np.diff(self.xs)
        flat = (b - a) <= _EPS
        safe = np.where(flat, 1.0, b - a)
        power = np.where(flat, a ** n, (b ** (n + 1) - a ** (n + 1)) / ((n + 1) * safe))
        return float(self.xs[0] + np.sum(dx * (1.0 - power)))

    def segments(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(lo, hi, probability) of each segment with mass (atoms have lo == hi)."""
        p = np.diff(self.cs)
        keep = p > _EPS
        return self.xs[:-1][keep], self.xs[1:][keep], p[keep]

    def sample(self, rng: np.random.Generator, size: int) -> FloatArray:
        """Draws by inverse transform (uniform within each segment)."""
        u = rng.random(size)
        k = np.clip(np.searchsorted(self.cs, u, side="right"), 1, self.xs.size - 1)
        c0, c1 = self.cs[k - 1], self.cs[k]
        frac = np.where(c1 - c0 > _EPS, (u - c0) / np.where(c1 - c0 > _EPS, c1 - c0, 1.0), 0.0)
        return np.asarray(self.xs[k - 1] + frac * (self.xs[k] - self.xs[k - 1]))

    def representatives(self, count: int) -> FloatArray:
        """``count`` equal-mass stand-ins, for averaging over the distribution.

        The quantiles at the middles of ``count`` equal slices of probability.
        """
        if count < 1:
            raise ValueError("at least one representative")
        return self.quantiles((np.arange(count) + 0.5) / count)

    def distance(self, other: Distribution) -> float:
        """The largest gap between the two CDFs (the Kolmogorov-Smirnov distance).

        Both CDFs are linear between the union of their knots, so the gap is largest at a
        knot, on one side of it or the other (atoms).
        """
        points = np.union1d(self.xs, other.xs)
        right = np.abs(self.cdfs(points) - other.cdfs(points))
        left = np.abs(self.cdfs(points, left=True) - other.cdfs(points, left=True))
        return float(max(right.max(), left.max()))

    # --- transforms ----------------------------------------------------------------------

    def plus(self, other: Distribution, points: int = 32) -> Distribution:
        """The distribution of X + Y, X from this one and Y from ``other``, independent.

        A constant adds as a shift; otherwise each is stood in for by ``points`` equal-mass
        representatives and the sum takes the distribution of their ``points²`` pairwise sums.
        """
        if other.is_point:
            return self.affine(1.0, other.low)
        if self.is_point:
            return other.affine(1.0, self.low)
        sums = (self.representatives(points)[:, None]
                + other.representatives(points)[None, :]).ravel()
        return Distribution.from_samples(sums, bins=2 * points)

    def affine(self, scale: float, offset_s: float) -> Distribution:
        """The distribution of ``scale * X + offset_s`` (scale > 0)."""
        if scale <= 0:
            raise ValueError("scale must be positive")
        return Distribution(self.xs * scale + offset_s, self.cs.copy())

    def coarsen(self, max_knots: int) -> Distribution:
        """At most ``max_knots`` knots, chosen to keep the CDF's shape (gaps and atoms included).

        Top-down Douglas-Peucker on the CDF curve, vertical error as the distance: split the
        segment whose inner knot is farthest from its chord until ``max_knots`` are kept; a
        jump (a point mass) inside a segment is split first, so atoms survive.
        """
        if self.xs.size <= max_knots:
            return self
        if max_knots < 2:
            raise ValueError("at least two knots")
        keep = [0, self.xs.size - 1]
        heap: list[tuple[float, int, int, int]] = []
        xs, cs = self.xs.tolist(), self.cs.tolist()
        _push_split(heap, xs, cs, 0, len(xs) - 1)
        while heap and len(keep) < max_knots:
            _, split, i, j = heapq.heappop(heap)
            keep.append(split)
            _push_split(heap, xs, cs, i, split)
            _push_split(heap, xs, cs, split, j)
        keep.sort()
        return Distribution.from_knots(self.xs[keep], self.cs[keep])


def _push_split(heap: list[tuple[float, int, int, int]], xs: list[float], cs: list[float],
                i: int, j: int) -> None:
    """Queue the best split of segment (i, j): its inner knot farthest from the chord.

    Plain Python on lists: the segments are short, and a coarsening makes hundreds of them
    (per-call array overhead would dominate).
    """
    if j - i < 2:
        return
    x0, c0 = xs[i], cs[i]
    span = xs[j] - x0
    if span <= _EPS:  # the whole segment is one atom: its inner knots carry no shape
        return
    for k in range(i, j):
        if xs[k + 1] - xs[k] <= _EPS and cs[k + 1] - cs[k] > _EPS:
            # a point mass inside: the chord cannot stand for a jump
            heapq.heappush(heap, (-2.0, k if k > i else k + 1, i, j))
            return
    rise = cs[j] - c0
    best, best_err = -1, -1.0
    for k in range(i + 1, j):
        err = abs(cs[k] - (c0 + rise * (xs[k] - x0) / span))
        if err > best_err:
            best, best_err = k, err
    if best_err > 1e-9:
        heapq.heappush(heap, (-best_err, best, i, j))


def _knot_points(dists: Sequence[Distribution], refine: int) -> FloatArray:
    """The union of the knots, each gap split ``refine`` times (products are not linear)."""
    union = np.unique(np.concatenate([d.xs for d in dists]))
    if refine <= 1 or union.size < 2:
        return np.asarray(union, dtype=float)
    steps = np.linspace(0.0, 1.0, refine + 1)[:-1]
    inner = (union[:-1, None] + np.diff(union)[:, None] * steps[None, :]).ravel()
    return np.asarray(np.unique(np.concatenate([inner, union[-1:]])), dtype=float)


def _interleave(points: FloatArray, left: FloatArray,
                right: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Knots from CDF left and right limits at ``points`` (a jump gives two knots)."""
    xs = np.repeat(points, 2)
    cs = np.column_stack([left, right]).ravel()
    keep = np.ones(xs.size, dtype=bool)
    keep[1::2] = (right - left) > _EPS
    return xs[keep], cs[keep]


def _combine(points: FloatArray, left: FloatArray, right: FloatArray,
             max_knots: int | None = MAX_KNOTS) -> Distribution:
    xs, cs = _interleave(points, left, right)
    if xs.size < 2 or xs[-1] - xs[0] <= 0 and cs[-1] - cs[0] <= _EPS:
        return Distribution.point(float(points[0]))
    found = Distribution.from_knots(xs, cs)
    return found if max_knots is None else found.coarsen(max_knots)


def mixture(dists: Sequence[Distribution], weights: Sequence[float]) -> Distribution:
    """The distribution of a draw from ``dists[i]`` with probability ``weights[i]``."""
    if not dists or len(dists) != len(weights):
        raise ValueError("one weight per distribution, at least one")
    total = float(sum(weights))
    if total <= 0 or min(weights) < 0:
        raise ValueError("weights are non-negative with a positive sum")
    if len(dists) == 1:
        return dists[0]
    points = _knot_points(dists, 1)
    left = sum(w / total * d.cdfs(points, left=True)
               for d, w in zip(dists, weights, strict=True))
    right = sum(w / total * d.cdfs(points) for d, w in zip(dists, weights, strict=True))
    return _combine(points, np.asarray(left), np.asarray(right))


def _max_limits(dists: Sequence[Distribution], counts: Sequence[int],
                refine: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    if not dists or len(dists) != len(counts) or min(counts) < 0 or sum(counts) < 1:
        raise ValueError("one count per distribution, at least one draw")
    used = [(d, c) for d, c in zip(dists, counts, strict=True) if c > 0]
    points = _knot_points([d for d, _ in used], refine)
    left = np.ones(points.size)
    right = np.ones(points.size)
    for d, c in used:
        left *= d.cdfs(points, left=True) ** c
        right *= d.cdfs(points) ** c
    return points, left, right


def max_of(dists: Sequence[Distribution], counts: Sequence[int],
           refine: int = 4, max_knots: int | None = MAX_KNOTS) -> Distribution:
    """The distribution of the maximum of ``counts[i]`` independent draws from ``dists[i]``.

    F_max(x) = Π F_i(x)^counts[i] (eq. 6 for one distribution, eq. 7-8 for several: the
    maximum of independent, not identically distributed variables). Coarsened to
    ``max_knots`` (None: every refined knot kept, for a result only summed or sampled).
    """
    points, left, right = _max_limits(dists, counts, refine)
    return _combine(points, left, right, max_knots)

