"""Eq. 1-2's priority, its convex-hull form (§4.4) and the dynamic hull itself."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scheduling.distribution import Distribution, mixture
from scheduling.hull import SMALL, UpperHull
from scheduling.priority import DEAD, Curve

A = 0.02  # anticipated delay (s)


def latency() -> Distribution:
    """A bimodal batch latency with a point mass: 10-14 ms, 30 ms exactly, 40-50 ms."""
    ramp = Distribution.from_knots([0.010, 0.014], [0.0, 1.0])
    tail = Distribution.from_knots([0.040, 0.050], [0.0, 1.0])
    return mixture([ramp, Distribution.point(0.030), tail], [0.5, 0.2, 0.3])


def direct_score(dist: Distribution, slack: float, delay: float) -> float:
    """Eq. 2 from its definition, by numerical integration inside each segment."""
    lo, hi, p = dist.segments()
    total = 0.0
    for a, b, mass in zip(lo, hi, p, strict=True):
        mid = (a + b) / 2
        if b - a < 1e-15:
            xs = np.array([a])
        else:
            xs = np.linspace(a, b, 20_001)
        gain = np.where(xs <= slack, np.exp(-(slack - xs) / delay), 0.0)
        total += mass / mid * float(gain.mean())
    return total


@pytest.mark.parametrize("slack", [0.005, 0.011, 0.013, 0.0299, 0.03, 0.035, 0.045, 0.06, 0.2])
def test_score_is_eq2(slack: float) -> None:
    dist = latency()
    curve = Curve.build(dist, A, bins=64)
    assert curve.score(slack) == pytest.approx(direct_score(dist, slack, A), rel=1e-3, abs=1e-9)


def test_hull_point_reproduces_the_score_between_milestones() -> None:
    curve = Curve.build(latency(), A)
    deadline, t0 = 1.0, 0.9
    for now in np.linspace(0.92, 0.99, 15):
        k = curve.regime(deadline - now)
        a, beta = curve.point(k, deadline - t0)
        at_now = a * math.exp((now - t0) / A) + beta
        assert at_now == pytest.approx(curve.score(deadline - now), rel=1e-9, abs=1e-12)
        # the point holds until its milestone, which is still ahead
        assert curve.leaves_at(k, deadline) >= now - 1e-12


def test_priority_order() -> None:
    """Urgent before relaxed; the hopeless at zero; the nearly hopeless below the urgent."""
    curve = Curve.build(latency(), A)
    urgent, relaxed = curve.score(0.06), curve.score(0.2)
    assert urgent > relaxed > 0
    assert curve.score(0.009) == 0.0 and curve.regime(0.009) == DEAD
    nearly_hopeless = curve.score(0.0105)  # only a sliver of the 10-14 ms mode fits
    assert 0 < nearly_hopeless < urgent


def test_threshold_floor_removes_unlikely_requests_earlier() -> None:
    dist = latency()
    strict = Curve.build(dist, A, min_probability=0.4)
    assert strict.floor_s == pytest.approx(dist.quantile(0.4))
    assert strict.regime(dist.quantile(0.4) - 1e-4) == DEAD
    assert Curve.build(dist, A).regime(dist.quantile(0.4) - 1e-4) != DEAD


def test_no_overflow_far_from_the_reference_time() -> None:
    curve = Curve.build(latency(), 1e-4)  # a tiny a: huge exponents without the relative form
    a, beta = curve.point(curve.regime(0.5), 600.0)
    assert math.isfinite(a) and math.isfinite(beta)


def test_upper_hull_matches_brute_force() -> None:
    rng = random.Random(1)
    hull, ref = UpperHull(), {}
    for _ in range(5000):
        op = rng.random()
        if op < 0.5 or not ref:
            key = rng.randrange(300)
            a, b = rng.uniform(-1, 1), rng.uniform(-1, 1)
            hull.insert(key, a, b)
            ref[key] = (a, b)
        elif op < 0.8:
            key = rng.choice(list(ref))
            hull.remove(key)
            del ref[key]
        else:
            u = math.exp(rng.uniform(-5, 5))
            got = hull.best(u)
            want = max(a * u + b for a, b in ref.values())
            assert got is not None and got[1] == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert got[0] in ref
        assert len(hull) == len(ref)
    assert UpperHull().best(1.0) is None


def test_upper_hull_stays_right_as_it_grows_past_and_shrinks_below_the_scanned_size() -> None:
    rng = random.Random(2)
    hull, ref = UpperHull(), {}
    key = 0
    for _ in range(6):  # up past SMALL (blocks built), down to empty (blocks dropped)
        for phase in ("grow", "shrink"):
            for _ in range(3 * SMALL):
                if phase == "grow":
                    a, b = rng.uniform(-1, 1), rng.uniform(-1, 1)
                    hull.insert(key, a, b)
                    ref[key] = (a, b)
                    key += 1
                elif ref:
                    gone = rng.choice(list(ref))
                    hull.remove(gone)
                    del ref[gone]
                if rng.random() < 0.3 and ref:  # a point moves
                    moved = rng.choice(list(ref))
                    ref[moved] = (rng.uniform(-1, 1), rng.uniform(-1, 1))
                    hull.insert(moved, *ref[moved])
                u = math.exp(rng.uniform(-3, 3))
                got = hull.best(u)
                if not ref:
                    assert got is None
                    continue
                want = max(a * u + b for a, b in ref.values())
                assert got is not None and got[0] in ref
                assert got[1] == pytest.approx(want, rel=1e-12, abs=1e-12)
                assert len(hull) == len(ref)
