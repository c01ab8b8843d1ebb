"""The SLO-aware cost and priority of a request (Orloj §4.1, eq. 1-2, after Chi et al. [7, 8]).

A request with deadline ``d`` pays a penalty ``w`` if it finishes after ``d`` (the step cost of
Fig. 5). Run now, it finishes after its batch latency ``L``; delayed by the anticipated delay
``τ ~ Exp(mean a)``, after ``τ + L``. Its priority is the expected cost that running it now
saves, per second of worker time (eq. 1), computed bin by bin over the histogram of ``L``
(eq. 2). With slack ``s = d - t`` and a bin ``[lo, hi)`` of mass ``p`` (uniform inside, value
``m = (lo + hi) / 2`` for the worker time)::

    hi <= s (the bin finishes in time):  w p / m · (a / Δ)(e^-(s-hi)/a - e^-(s-lo)/a)
    lo <= s < hi (partly in time):       w p / m · (a / Δ)(1 - e^-(s-lo)/a)
    s < lo (too late either way):        0

(a point mass at ``x``: ``w p / x · e^-(s-x)/a`` when ``x <= s``). Between two bin edges the
sum has the form ``A · e^{(t - t0)/a} + β`` in the current time ``t``: a point ``(A, β)`` per
request, so the request of highest priority is the one a line of slope ``-e^{(t - t0)/a}``
meets first on their upper convex hull (§4.4, ``scheduling.hull``). The point changes only when
the slack crosses a bin edge (a *milestone*).

Overflow (§4.4): ``A`` holds ``e^{-(d - t0)/a}`` and the query ``e^{(t - t0)/a}``, so both are
computed from a reference time ``t0`` close to now; every exponent in :meth:`Curve.point` is
at most 0, and the caller rebases ``t0`` before ``(t - t0) / a`` nears the float range.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from scheduling.distribution import Distribution, FloatArray

DEAD = -1
"""Regime of a request that cannot finish in time at this batch size any more."""


@dataclass(frozen=True, eq=False)
class Curve:
    """Eq. 2 for one batch-latency distribution, precomputed per regime (bin-edge interval).

    In regime ``k`` (slack in ``[edges[k], edges[k+1])``) the priority is
    ``e^{(edges[k] - s)/a} · slope[k] + beta[k]``.
    """

    edges: FloatArray
    slope: FloatArray
    beta: FloatArray
    delay_s: float
    floor_s: float
    """Below this slack the request leaves the queue (P(L <= s) is under the threshold)."""
    latency: Distribution
    """The batch-latency distribution the curve was built from (full resolution)."""

    @classmethod
    def build(cls, latency: Distribution, delay_s: float, *, penalty: float = 1.0,
              bins: int = 16, min_probability: float = 0.0) -> Curve:
        """The curve of ``latency`` with anticipated delay ``delay_s`` (a) and cost ``penalty``.

        ``bins``: histogram bins of eq. 2 (the latency is coarsened to them, keeping gaps and
        point masses). ``min_probability``: a request whose chance of finishing in time at this
        batch size falls under it stops being considered for it (0: only when it is nil).
        """
        if delay_s <= 0 or penalty <= 0:
            raise ValueError("the anticipated delay and the penalty are positive")
        lo, hi, p = latency.coarsen(bins + 1).segments()
        edges = np.unique(np.concatenate([lo, hi]))
        mid = np.maximum((lo + hi) / 2.0, 1e-12)
        weight = penalty * p / mid
        width = hi - lo
        # every regime at once: rows are the edges x, columns the segments
        x = edges[:, None]
        full = hi[None, :] <= x
        atom = full & (width <= 1e-15)[None, :]
        ramp = full & ~atom
        safe = np.where(width > 1e-15, width, 1.0)
        # exponents of a full segment are <= 0; others are masked out (clipped: no overflow)
        to_lo = np.exp(np.minimum((lo[None, :] - x) / delay_s, 0.0))
        to_hi = np.exp(np.minimum((hi[None, :] - x) / delay_s, 0.0))
        slope = (np.sum(np.where(atom, weight * to_lo, 0.0), axis=1)
                 + np.sum(np.where(ramp, weight * delay_s / safe * (to_hi - to_lo), 0.0),
                          axis=1))
        partial = (lo[None, :] <= x) & (hi[None, :] > x) & (width > 1e-15)[None, :]
        some = partial.any(axis=1)
        j = np.argmax(partial, axis=1)
        ramp_top = np.where(some, weight[j] * delay_s / safe[j], 0.0)
        slope = slope - ramp_top * to_lo[np.arange(edges.size), j]
        beta = ramp_top
        floor = latency.quantile(min_probability) if min_probability > 0 else latency.low
        return cls(edges, slope, beta, delay_s, max(floor, float(edges[0])), latency)

    @cached_property
    def _lists(self) -> tuple[list[float], list[float], list[float]]:
        """Edges, slopes and betas as Python floats (scalar look-ups on the hot path)."""
        return self.edges.tolist(), self.slope.tolist(), self.beta.tolist()

    def regime(self, slack_s: float) -> int:
        """The regime index at ``slack_s``, or DEAD."""
        if slack_s < self.floor_s:
            return DEAD
        return bisect_right(self._lists[0], slack_s) - 1

    def score(self, slack_s: float) -> float:
        """The priority (eq. 2) at ``slack_s`` (0 once DEAD)."""
        k = self.regime(slack_s)
        if k == DEAD:
            return 0.0
        return float(math.exp((self.edges[k] - slack_s) / self.delay_s) * self.slope[k]
                     + self.beta[k])

    def point(self, k: int, deadline_rel_s: float) -> tuple[float, float]:
        """(A, β) of a request in regime ``k`` whose deadline is ``deadline_rel_s`` after t0.

        Its priority at ``t`` is ``A · e^{(t - t0)/a} + β`` while it stays in regime ``k``.
        """
        edges, slope, beta = self._lists
        exponent = (edges[k] - deadline_rel_s) / self.delay_s
        return (slope[k] * math.exp(min(exponent, 0.0)), beta[k])

    def placed(self, deadline_s: float, now_s: float) -> tuple[int, float, float, float]:
        """(regime, A, β, when it leaves the regime) of a request placed at ``now_s``.

        :meth:`regime`, :meth:`point` and :meth:`leaves_at` in one call, with the reference
        time at ``now_s``. ``(DEAD, 0, 0, 0)`` when the request cannot make this size.
        """
        slack = deadline_s - now_s
        if slack < self.floor_s:
            return DEAD, 0.0, 0.0, 0.0
        edges, slope, beta = self._lists
        k = bisect_right(edges, slack) - 1
        a = slope[k] * math.exp(min((edges[k] - slack) / self.delay_s, 0.0))
        return k, a, beta[k], deadline_s - max(edges[k], self.floor_s)

    def leaves_at(self, k: int, deadline_s: float) -> float:
        """When a request in regime ``k`` with ``deadline_s`` moves to the next regime down."""
        return deadline_s - max(self._lists[0][k], self.floor_s)

    def on_time(self, slack_s: float) -> float:
        """P(L <= slack): the chance a batch started now meets the deadline."""
        return self.latency.cdf(slack_s)
