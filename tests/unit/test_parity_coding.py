"""The ParM coding algebra: encoders, the subtraction decoder, coding groups, accuracy measures."""

from __future__ import annotations

import numpy as np
import pytest

from parity.coding import (
    CodingGroup,
    EncoderKind,
    Reconstruction,
    decode,
    decoder_target,
    downsample,
    encode,
    encode_group,
    subtract,
    tile_grid,
)
from parity.errors import CodingError, ParityError
from parity.evaluation import (
    available_accuracy,
    default_accuracy,
    default_response,
    degraded_accuracy,
    overall_accuracy,
    random_groups,
)

RNG = np.random.default_rng(7)


def _images(count: int, *lead: int, dtype: type = np.float32) -> list[np.ndarray]:
    return [RNG.random((*lead, 1, 8, 8)).astype(dtype) for _ in range(count)]


def _group(k: int) -> CodingGroup:
    return CodingGroup("g", tuple(f"q{i}" for i in range(k)))


# --- the addition encoder and the subtraction decoder ------------------------------------------

@pytest.mark.parametrize("k", [2, 3, 4])
def test_addition_encoder_is_the_elementwise_sum(k: int) -> None:
    queries = _images(k)
    parity = encode(queries, EncoderKind.ADDITION)
    assert parity.shape == queries[0].shape
    assert parity.dtype == np.float32
    np.testing.assert_allclose(parity, np.sum(queries, axis=0), rtol=1e-6)
    np.testing.assert_allclose(encode(queries[::-1]), parity, rtol=1e-6)


def test_addition_encodes_the_ith_items_of_k_batches_together() -> None:
    batches = _images(3, 5)  # three batches of five queries
    parity = encode(batches)
    assert parity.shape == (5, 1, 8, 8)
    for item in range(5):
        np.testing.assert_allclose(parity[item], encode([b[item] for b in batches]), rtol=1e-6)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_linear_deployed_model_is_its_own_exact_parity_model(k: int) -> None:
    weights = RNG.normal(size=(10, 64))

    def linear(x: np.ndarray) -> np.ndarray:
        return x.reshape(*x.shape[:-3], 64) @ weights.T

    group = _group(k)
    # float64 queries: the algebra is exact, only float rounding could tell the two apart.
    queries = dict(zip(group.query_ids, _images(k, dtype=np.float64), strict=True))
    outputs = {query: linear(x) for query, x in queries.items()}
    parity_output = linear(encode_group(group, queries))  # F_P = F
    np.testing.assert_allclose(parity_output, decoder_target(list(outputs.values())), rtol=1e-9)
    for missing in group.query_ids:
        available = {q: o for q, o in outputs.items() if q != missing}
        rebuilt = decode(group, parity_output, available)
        assert rebuilt.query_id == missing and rebuilt.group_id == "g"
        np.testing.assert_allclose(rebuilt.output, outputs[missing], rtol=1e-6, atol=1e-9)


def test_an_affine_deployed_model_needs_k_times_its_bias_in_the_parity_model() -> None:
    weights, bias, k = RNG.normal(size=(10, 64)), RNG.normal(size=10), 3
    queries = [x.reshape(64) for x in _images(k, dtype=np.float64)]
    outputs = [weights @ x + bias for x in queries]
    parity_output = weights @ encode(queries) + k * bias
    np.testing.assert_allclose(subtract(parity_output, outputs[1:]), outputs[0], atol=1e-9)
    # The deployed model itself is not a parity model here: its reconstruction is off by (k-1) b.
    off = subtract(weights @ encode(queries) + bias, outputs[1:]) - outputs[0]
    np.testing.assert_allclose(off, -(k - 1) * bias, atol=1e-9)


def test_a_reconstruction_is_marked_as_reconstructed() -> None:
    group = _group(2)
    rebuilt = decode(group, np.ones(10), {"q1": np.zeros(10)})
    assert isinstance(rebuilt, Reconstruction)
    assert rebuilt.reconstructed is True
    assert rebuilt.query_id == "q0"
    np.testing.assert_array_equal(rebuilt.output, np.ones(10))


# --- coding groups and refusals -------------------------------------------------------------------

def test_coding_groups_have_k_distinct_queries() -> None:
    assert _group(4).k == 4
    with pytest.raises(CodingError, match="k must be at least 2"):
        CodingGroup("g", ("only",))
    with pytest.raises(CodingError, match="repeat"):
        CodingGroup("g", ("a", "b", "a"))


@pytest.mark.parametrize(("available", "message"), [
    ({"q0": 0, "q1": 0, "q2": 0}, "exactly k - 1 = 2 .* got 3"),
    ({"q0": 0}, "exactly k - 1 = 2 .* got 1 .*missing: q1, q2"),
    ({"q0": 0, "other": 0}, "outside the group: other"),
])
def test_the_decoder_needs_exactly_the_other_k_minus_1_outputs(available: dict[str, int],
                                                               message: str) -> None:
    with pytest.raises(CodingError, match=message):
        _group(3).unavailable(available)


def test_encoder_and_decoder_refuse_mismatched_shapes() -> None:
    with pytest.raises(CodingError, match="differ in shape"):
        encode([np.zeros((1, 8, 8)), np.zeros((1, 8, 4))])
    with pytest.raises(CodingError, match="differ in shape"):
        decode(_group(2), np.zeros(10), {"q1": np.zeros(9)})
    with pytest.raises(CodingError, match="k >= 2"):
        encode([np.zeros((1, 8, 8))])
    with pytest.raises(CodingError, match="no input for q1"):
        encode_group(_group(2), {"q0": np.zeros((1, 8, 8))})
    with pytest.raises(ValueError, match="'xor' is not a valid EncoderKind"):
        encode(_images(2), "xor")
    assert issubclass(CodingError, ParityError) and issubclass(ParityError, ValueError)


# --- the concatenation encoder (§5.2.3) ---------------------------------------------------

@pytest.mark.parametrize(("k", "grid"), [(2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (6, (2, 3))])
def test_tile_grid(k: int, grid: tuple[int, int]) -> None:
    assert tile_grid(k) == grid


def test_downsampling_averages_blocks() -> None:
    image = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    np.testing.assert_allclose(downsample(image, 2, 2)[0], [[2.5, 4.5], [10.5, 12.5]])
    np.testing.assert_allclose(downsample(image, 1, 2)[0, 0], [0.5, 2.5])
    assert downsample(np.full((1, 8, 8), 0.75, dtype=np.float32), 2, 2).max() == 0.75


def test_concatenation_of_two_puts_them_side_by_side() -> None:
    first, second = _images(2)
    parity = encode([first, second], EncoderKind.CONCATENATION)
    assert parity.shape == (1, 8, 8) and parity.dtype == np.float32
    np.testing.assert_allclose(parity[..., :4], downsample(first, 1, 2), rtol=1e-6)
    np.testing.assert_allclose(parity[..., 4:], downsample(second, 1, 2), rtol=1e-6)


@pytest.mark.parametrize("k", [3, 4])
def test_concatenation_of_three_or_four_fills_a_two_by_two_grid(k: int) -> None:
    images = _images(k, 6)  # batches of six: tiled item by item
    parity = encode(images, EncoderKind.CONCATENATION)
    assert parity.shape == (6, 1, 8, 8)
    quadrants = [(slice(0, 4), slice(0, 4)), (slice(0, 4), slice(4, 8)),
                 (slice(4, 8), slice(0, 4)), (slice(4, 8), slice(4, 8))]
    for index, (rows, columns) in enumerate(quadrants):
        expected = downsample(images[index], 2, 2) if index < k else np.zeros((6, 1, 4, 4))
        np.testing.assert_allclose(parity[..., rows, columns], expected, rtol=1e-6)


def test_concatenation_follows_the_group_order_and_refuses_odd_sizes() -> None:
    group = CodingGroup("g", ("b", "a"))
    a, b = _images(2)
    parity = encode_group(group, {"a": a, "b": b}, EncoderKind.CONCATENATION)
    np.testing.assert_allclose(parity[..., :4], downsample(b, 1, 2), rtol=1e-6)
    with pytest.raises(CodingError, match="cannot be split into a 1 x 2 grid"):
        encode([np.zeros((1, 8, 7)), np.zeros((1, 8, 7))], EncoderKind.CONCATENATION)
    with pytest.raises(CodingError, match="at least 2 dimensions"):
        encode([np.zeros(8), np.zeros(8)], EncoderKind.CONCATENATION)


# --- accuracy measures ---------------------------------------------------------------------

def test_random_groups_use_each_sample_at_most_once() -> None:
    groups = random_groups(11, 3, np.random.default_rng(0))
    assert groups.shape == (3, 3)
    assert len(set(groups.ravel().tolist())) == 9


def test_degraded_accuracy_of_an_exact_parity_model_is_the_available_accuracy() -> None:
    weights = RNG.normal(size=(10, 64)).astype(np.float32)

    def linear(x: np.ndarray) -> np.ndarray:
        return x.reshape(len(x), 64) @ weights.T

    inputs = RNG.random((24, 1, 8, 8), dtype=np.float32)
    outputs = linear(inputs)
    labels = RNG.integers(0, 10, size=24)
    available = available_accuracy(outputs, labels)
    for k in (2, 3, 4):
        result = degraded_accuracy(linear, inputs, outputs, labels, k, "addition", groupings=3)
        assert result.reconstructions == 24 * 3
        assert result.accuracy == pytest.approx(available)


def test_a_useless_parity_model_scores_near_chance() -> None:
    inputs = RNG.random((400, 1, 8, 8), dtype=np.float32)
    labels = RNG.integers(0, 10, size=400)
    outputs = np.eye(10, dtype=np.float32)[labels] * 5.0  # a perfect deployed model

    def zeros(x: np.ndarray) -> np.ndarray:
        return np.zeros((len(x), 10), dtype=np.float32)

    result = degraded_accuracy(zeros, inputs, outputs, labels, 2, "addition")
    assert available_accuracy(outputs, labels) == 1.0
    assert result.accuracy < 0.3


def test_default_response_and_overall_accuracy() -> None:
    train = np.array([1, 3, 3, 2, 3])
    assert default_response(train) == 3
    assert default_accuracy(train, np.array([3, 1, 3, 0])) == 0.5
    assert overall_accuracy(0.9, 0.5, 0.1) == pytest.approx(0.86)
