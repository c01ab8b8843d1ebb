"""Accuracy with and without reconstruction (ParM §5.1's metrics), over any predictor.

- A_a, *available*: the deployed model's top-1 (the answer when its prediction arrives);
- A_d, *degraded*: the top-1 of the decoder's reconstructions. As in §5.1, the samples are
  placed at random into groups of k and encoded; for each parity query every one of its k
  predictions is made unavailable in turn and rebuilt from F_P(P) and the other k - 1, and the
  reconstruction's argmax is compared with the true label;
- the *default response*: what a server without redundancy answers when the prediction is
  unavailable (Clipper's default prediction); here the most common class of the training split.

The models are plain callables (a batch in, a batch of outputs out), so the same code measures
a torch module during training and an exported artifact through the runtime's loaders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from parity.coding import EncoderKind, encode, subtract

Predictor = Callable[[np.ndarray], np.ndarray]
"""A model: a float32 batch (batch dimension first) in, its outputs (one row per item) out."""


@dataclass(frozen=True)
class DegradedAccuracy:
    """A_d of one parity model on one set."""

    k: int
    encoder: EncoderKind
    accuracy: float
    reconstructions: int
    """How many reconstructions were scored (groups x k x groupings)."""
    groupings: int


def random_groups(count: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` samples placed at random into groups of ``k`` (G x k indices; the rest left)."""
    order = rng.permutation(count)
    groups = count // k
    return order[: groups * k].reshape(groups, k)


def degraded_accuracy(parity: Predictor, inputs: np.ndarray, deployed_outputs: np.ndarray,
                      labels: np.ndarray, k: int, encoder: EncoderKind | str,
                      groupings: int = 1, seed: int = 0) -> DegradedAccuracy:
    """A_d: the top-1 of every reconstruction, over ``groupings`` random groupings of the set."""
    kind = EncoderKind(encoder)
    rng = np.random.default_rng(seed)
    correct = total = 0
    for _ in range(groupings):
        groups = random_groups(len(inputs), k, rng)
        # The i-th items of k batches are encoded together (§4.1): one batch of parity queries.
        parity_outputs = parity(encode([inputs[groups[:, i]] for i in range(k)], kind))
        outputs = deployed_outputs[groups]
        for missing in range(k):
            available = [outputs[:, i] for i in range(k) if i != missing]
            rebuilt = subtract(parity_outputs, available)
            correct += int((rebuilt.argmax(axis=1) == labels[groups[:, missing]]).sum())
            total += len(groups)
    return DegradedAccuracy(k=k, encoder=kind, accuracy=correct / total if total else 0.0,
                            reconstructions=total, groupings=groupings)


def available_accuracy(deployed_outputs: np.ndarray, labels: np.ndarray) -> float:
    """A_a: the deployed model's top-1."""
    return float((deployed_outputs.argmax(axis=1) == labels).mean())


def default_response(train_labels: np.ndarray) -> int:
    """The fixed answer of a server without redundancy: the training split's most common class."""
    classes, counts = np.unique(train_labels, return_counts=True)
    return int(classes[counts.argmax()])


def default_accuracy(train_labels: np.ndarray, labels: np.ndarray) -> float:
    """The top-1 of answering :func:`default_response` to every query."""
    return float((labels == default_response(train_labels)).mean())


def overall_accuracy(available: float, degraded: float, unavailable_fraction: float) -> float:
    """A_o = (1 - f) A_a + f A_d (§5.1, eq. 1)."""
    return (1.0 - unavailable_fraction) * available + unavailable_fraction * degraded
