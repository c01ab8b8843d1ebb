"""Empirical distributions and the order statistics of a batch, against Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.distribution import Distribution, max_of, mixture


def bimodal(rng: np.random.Generator, size: int) -> np.ndarray:
    """Half around 10 ms (sd 1), half around 30 ms (sd 2): a high-variance dynamic model."""
    short = rng.normal(10e-3, 1e-3, size)
    long = rng.normal(30e-3, 2e-3, size)
    return np.where(rng.random(size) < 0.5, short, long)


@pytest.fixture(scope="module")
def population() -> np.ndarray:
    return bimodal(np.random.default_rng(7), 400_000)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32])
def test_expected_max_matches_monte_carlo(population: np.ndarray, n: int) -> None:
    rng = np.random.default_rng(n)
    empirical = Distribution.from_samples(rng.choice(population, 20_000))
    draws = rng.choice(population, size=(40_000, n)).max(axis=1)
    assert empirical.expected_max(n) == pytest.approx(draws.mean(), rel=0.01)
    # the distribution of the maximum, not only its mean
    batch = max_of([empirical], [n])
    assert batch.mean() == pytest.approx(draws.mean(), rel=0.01)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert batch.quantile(q) == pytest.approx(np.quantile(draws, q), rel=0.03)


def test_max_of_different_distributions_matches_monte_carlo() -> None:
    rng = np.random.default_rng(3)
    short = rng.normal(10e-3, 1e-3, 200_000)
    long = rng.gamma(4.0, 5e-3, 200_000)
    dists = [Distribution.from_samples(short[:20_000]), Distribution.from_samples(long[:20_000])]
    batch = max_of(dists, [3, 2])  # eq. 7-8: three of one app, two of the other
    draws = np.maximum(rng.choice(short, (50_000, 3)).max(axis=1),
                       rng.choice(long, (50_000, 2)).max(axis=1))
    assert batch.mean() == pytest.approx(draws.mean(), rel=0.01)
    for q in (0.25, 0.5, 0.9):
        assert batch.quantile(q) == pytest.approx(np.quantile(draws, q), rel=0.03)
    assert batch.cdf(float(np.median(draws))) == pytest.approx(0.5, abs=0.02)


def test_a_static_model_is_a_degenerate_distribution() -> None:
    point = Distribution.from_samples([4e-3] * 50)
    assert point.is_point and point.low == point.high == pytest.approx(4e-3)
    assert point.expected_max(16) == pytest.approx(4e-3)
    assert max_of([point], [8]).mean() == pytest.approx(4e-3)
    assert max_of([point, Distribution.point(1e-3)], [2, 3]).mean() == pytest.approx(4e-3)
    assert point.cdf(4e-3) == 1.0 and point.cdf_left(4e-3) == 0.0
    assert point.quantile(0.99) == pytest.approx(4e-3)


def test_mixture_keeps_point_masses_and_weights() -> None:
    mix = mixture([Distribution.point(5.0), Distribution.point(7.0)], [1.0, 3.0])
    assert mix.cdf_left(5.0) == 0.0 and mix.cdf(5.0) == pytest.approx(0.25)
    assert mix.cdf(6.0) == pytest.approx(0.25) and mix.cdf(7.0) == pytest.approx(1.0)
    assert mix.mean() == pytest.approx(6.5)
    # the maximum of two draws is 5 only when both are 5
    assert max_of([mix], [2]).cdf(5.0) == pytest.approx(0.25 ** 2)


def test_coarsen_keeps_the_gap_between_modes(population: np.ndarray) -> None:
    fine = Distribution.from_samples(population[:50_000], bins=128)
    coarse = fine.coarsen(17)
    assert coarse.xs.size <= 17
    for x in (8e-3, 10e-3, 20e-3, 30e-3, 33e-3):
        assert coarse.cdf(x) == pytest.approx(fine.cdf(x), abs=0.03)
    atoms = mixture([Distribution.point(1.0), fine], [1.0, 1.0]).coarsen(9)
    assert atoms.cdf(1.0) - atoms.cdf_left(1.0) == pytest.approx(0.5)


def test_sampling_follows_the_distribution(population: np.ndarray) -> None:
    dist = Distribution.from_samples(population[:20_000])
    draws = dist.sample(np.random.default_rng(0), 50_000)
    assert draws.mean() == pytest.approx(dist.mean(), rel=0.01)
    assert np.quantile(draws, 0.9) == pytest.approx(dist.quantile(0.9), rel=0.02)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        Distribution.from_samples([])
    with pytest.raises(ValueError):
        Distribution.from_samples([-1.0, 2.0])
    with pytest.raises(ValueError):
        Distribution(np.array([2.0, 1.0]), np.array([0.0, 1.0]))
    with pytest.raises(ValueError):
        Distribution.point(1.0).expected_max(0)


def test_the_sum_of_independent_draws_matches_monte_carlo(population: np.ndarray) -> None:
    rng = np.random.default_rng(7)
    overhead = rng.gamma(4.0, 0.0005, 20000) + 0.001  # a skewed transfer-and-server time
    model, extra = Distribution.from_samples(population), Distribution.from_samples(overhead)
    total = model.plus(extra)
    draws = rng.choice(population, 200000) + rng.choice(overhead, 200000)
    assert total.mean() == pytest.approx(draws.mean(), rel=0.02)
    for q in (0.1, 0.25, 0.75, 0.9, 0.99):  # (the median falls in the gap between modes)
        assert total.quantile(q) == pytest.approx(np.quantile(draws, q), rel=0.05)
    assert total.distance(Distribution.from_samples(draws, 256)) < 0.03
    # a constant adds as a shift, exactly
    shifted = model.plus(Distribution.point(0.002))
    np.testing.assert_allclose(shifted.xs, model.xs + 0.002)
    assert Distribution.point(0.002).plus(model).mean() == pytest.approx(model.mean() + 0.002)


def test_the_distance_is_the_largest_gap_between_the_cdfs() -> None:
    uniform = Distribution.from_knots([0.0, 1.0], [0.0, 1.0])
    assert uniform.distance(uniform) == 0.0
    assert uniform.distance(uniform.affine(1.0, 0.25)) == pytest.approx(0.25)
    # an atom's jump counts on whichever side of it the gap is largest
    assert Distribution.point(0.5).distance(uniform) == pytest.approx(0.5)
    assert Distribution.point(0.2).distance(Distribution.point(0.3)) == pytest.approx(1.0)
    reps = uniform.representatives(4)
    np.testing.assert_allclose(reps, [0.125, 0.375, 0.625, 0.875])
    with pytest.raises(ValueError):
        uniform.representatives(0)


def test_quantiles_in_one_pass_agree_with_each_quantile() -> None:
    rng = np.random.default_rng(11)
    shapes = [Distribution.from_samples(rng.lognormal(0.0, 1.0, 500)),
              Distribution.from_knots([0.01, 0.012, 0.03, 0.034], [0.0, 0.5, 0.5, 1.0]),  # a gap
              Distribution.from_knots([1.0, 1.0, 2.0, 2.0, 3.0], [0.0, 0.3, 0.6, 0.8, 1.0]),
              Distribution.point(4e-3)]
    qs = np.concatenate([[0.0, 1e-15, 0.3, 0.5, 0.6, 0.8, 1.0], rng.random(100)])
    for shape in shapes:
        assert shape.quantiles(qs).tolist() == [shape.quantile(q) for q in qs]
