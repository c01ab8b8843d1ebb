"""The coding algebra of parity models (ParM §4.2, §5.2.3): encoders and the subtraction decoder.

A *coding group* is k queries sent to the k instances of a deployed model F. The encoder turns
them into one *parity query* P for the parity model F_P; when one of the k predictions is
unavailable (its server failed, or it is late), the decoder rebuilds an approximation of it
from F_P(P) and the k - 1 predictions that did arrive::

    addition encoder       P = X_1 + ... + X_k                       (§4.2)
    concatenation encoder  P = the k images, each downsampled, tiled into one image  (§5.2.3)
    subtraction decoder    F(X_j) ~= F_P(P) - sum over i != j of F(X_i)

The parity model is trained so that F_P(P) ~= F(X_1) + ... + F(X_k) (:func:`decoder_target`),
which is what makes the subtraction give back F(X_j). For a *linear* F and the addition encoder
F itself is such a parity model and the reconstruction is exact; for a neural network it is
learned and approximate.

Everything here is a pure function over numpy arrays, with no model, clock or socket: the
gateway calls :func:`encode_group` when a group's k queries are known and :func:`decode` when
one prediction is missing; training calls :func:`encode` on batches. A query may carry leading
dimensions (a batch, channels): the addition encoder sums element-wise over the whole array,
the concatenation encoder tiles over the last two (height, width), so the i-th items of k
batches are encoded together, as §4.1 encodes the i-th queries of k query batches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

import numpy as np

from parity.errors import CodingError


class EncoderKind(StrEnum):
    """Which encoder builds the parity query; the decoder is the subtraction one for both."""

    ADDITION = "addition"
    """The generic encoder of §4.2: the element-wise sum of the k queries."""
    CONCATENATION = "concatenation"
    """The image-specific encoder of §5.2.3: the k images, downsampled, tiled into one."""


@dataclass(frozen=True)
class CodingGroup:
    """The k queries encoded into one parity query (ParM's "coding group", a storage "stripe").

    ``query_ids`` are in encoding order: the concatenation encoder puts the i-th query in the
    i-th tile (the addition encoder does not depend on the order).
    """

    group_id: str
    query_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.query_ids) < 2:
            raise CodingError(f"coding group {self.group_id!r}: k must be at least 2, got "
                              f"{len(self.query_ids)} queries")
        if len(set(self.query_ids)) != len(self.query_ids):
            raise CodingError(f"coding group {self.group_id!r}: query ids repeat: "
                              f"{', '.join(self.query_ids)}")

    @property
    def k(self) -> int:
        """How many queries the group codes together."""
        return len(self.query_ids)

    def unavailable(self, available: Mapping[str, object]) -> str:
        """The one query of the group that ``available`` lacks (the one to reconstruct)."""
        unknown = sorted(set(available) - set(self.query_ids))
        if unknown:
            raise CodingError(f"coding group {self.group_id!r}: outputs of queries outside the "
                              f"group: {', '.join(unknown)}")
        missing = [query for query in self.query_ids if query not in available]
        if len(missing) != 1:
            raise CodingError(
                f"coding group {self.group_id!r}: the subtraction decoder needs the outputs of "
                f"exactly k - 1 = {self.k - 1} queries, got {self.k - len(missing)} "
                f"(missing: {', '.join(missing) or 'none'})")
        return missing[0]


@dataclass(frozen=True)
class Reconstruction:
    """A prediction rebuilt by the decoder instead of answered by the deployed model.

    ``reconstructed`` is always True: whoever answers the query with ``output`` must say so
    (the gateway marks the response), because it is an approximation of F(X).
    """

    query_id: str
    group_id: str
    output: np.ndarray = field(repr=False)
    reconstructed: Literal[True] = True


def _arrays(values: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    arrays = [np.asarray(value) for value in values]
    if len(arrays) < 1:
        raise CodingError(f"no {what} given")
    shapes = {array.shape for array in arrays}
    if len(shapes) != 1:
        raise CodingError(f"{what} differ in shape: {sorted(shapes)}; every {what[:-1]} of a "
                          "coding group must be normalised to one shape first")
    return arrays


def _sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    dtype = np.result_type(*arrays)
    total = np.zeros(arrays[0].shape, dtype=dtype)
    for array in arrays:
        total += array
    return total


def tile_grid(k: int) -> tuple[int, int]:
    """(rows, columns) of the concatenation encoder's grid for ``k`` images.

    Two images go side by side (each keeps its height and loses half its width), three or four
    into a 2 x 2 grid (each halved both ways; with three, the last tile stays zero), as in
    §5.2.3's Figure 9; beyond that the smallest near-square grid.
    """
    if k < 2:
        raise CodingError(f"the concatenation encoder needs k >= 2, got {k}")
    columns = math.ceil(math.sqrt(k))
    return math.ceil(k / columns), columns


def downsample(image: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """Shrink the last two axes by ``rows`` (height) and ``columns`` (width), averaging blocks.

    Block averaging is area resampling: a downsampled pixel is the mean of the pixels it
    covers, so a pixel's intensity keeps its scale.
    """
    *lead, height, width = image.shape
    if height % rows or width % columns:
        raise CodingError(f"an image of {height} x {width} cannot be split into a {rows} x "
                          f"{columns} grid (height and width must divide evenly)")
    blocks = image.reshape(*lead, height // rows, rows, width // columns, columns)
    result: np.ndarray = blocks.mean(axis=(-3, -1), dtype=np.result_type(image, np.float32))
    return result


def concatenate(queries: Sequence[np.ndarray]) -> np.ndarray:
    """The concatenation encoder: each image downsampled, then tiled into one of the same size."""
    arrays = _arrays(queries, "queries")
    if arrays[0].ndim < 2:
        raise CodingError(f"the concatenation encoder takes images (at least 2 dimensions), "
                          f"got shape {arrays[0].shape}")
    rows, columns = tile_grid(len(arrays))
    *_, height, width = arrays[0].shape
    tile_h, tile_w = height // rows, width // columns
    parity = np.zeros(arrays[0].shape, dtype=np.result_type(arrays[0], np.float32))
    for index, array in enumerate(arrays):
        row, column = divmod(index, columns)
        parity[..., row * tile_h:(row + 1) * tile_h, column * tile_w:(column + 1) * tile_w] = \
            downsample(array, rows, columns)
    return parity


def encode(queries: Sequence[np.ndarray],
           kind: EncoderKind | str = EncoderKind.ADDITION) -> np.ndarray:
    """The parity query of k queries (in group order), by the ``kind`` encoder."""
    kind = EncoderKind(kind)
    arrays = _arrays(queries, "queries")
    if len(arrays) < 2:
        raise CodingError(f"a parity query codes k >= 2 queries, got {len(arrays)}")
    if kind is EncoderKind.CONCATENATION:
        return concatenate(arrays)
    return _sum(arrays)


def encode_group(group: CodingGroup, queries: Mapping[str, np.ndarray],
                 kind: EncoderKind | str = EncoderKind.ADDITION) -> np.ndarray:
    """The parity query of ``group``, from its queries by id."""
    missing = [query for query in group.query_ids if query not in queries]
    if missing:
        raise CodingError(f"coding group {group.group_id!r}: no input for "
                          f"{', '.join(missing)}")
    return encode([queries[query] for query in group.query_ids], kind)


def decoder_target(outputs: Sequence[np.ndarray]) -> np.ndarray:
    """What the parity model should answer for the group: the sum of the k deployed outputs.

    This is the training label of §4.4 (F(X_1) + ... + F(X_k)), whichever encoder made P.
    """
    return _sum(_arrays(outputs, "outputs"))


def subtract(parity_output: np.ndarray, available: Sequence[np.ndarray]) -> np.ndarray:
    """The subtraction decoder: F_P(P) minus the k - 1 outputs that arrived."""
    parity = np.asarray(parity_output)
    if not available:
        raise CodingError("the subtraction decoder needs the k - 1 available outputs")
    arrays = _arrays([parity, *available], "outputs")
    rebuilt: np.ndarray = arrays[0] - _sum(arrays[1:])
    return rebuilt


def decode(group: CodingGroup, parity_output: np.ndarray,
           available: Mapping[str, np.ndarray]) -> Reconstruction:
    """Rebuild the one missing prediction of ``group`` from F_P(P) and the k - 1 it has."""
    missing = group.unavailable(available)
    output = subtract(parity_output, [available[q] for q in group.query_ids if q != missing])
    return Reconstruction(query_id=missing, group_id=group.group_id, output=output)
