"""Training a parity model (ParM §4.3-4.4, parameters of §5.1).

The parity model F_P has the deployed model's architecture (the same layers and sizes, so the
same runtime) and its own weights. Each iteration draws a mini-batch of coding groups, k
samples each drawn at random from the training queries, encodes each group into a parity
query with the encoder the model will serve with (:func:`parity.coding.encode`, the very
function the gateway calls), and takes one Adam step on the mean-squared error between
F_P(P) and the decoder's target F(X_1) + ... + F(X_k), the sum of the deployed model's outputs
(no softmax: the target is not a distribution). Drawing fresh groups every step is the
augmentation of §4.4: the number of distinct groups grows as n^k, far beyond the n queries.

Like the paper, training runs until the parity model is accurate on a validation set: every
``validate_every`` steps the degraded-mode accuracy A_d of the validation queries is measured
and the best weights are kept; training stops after ``patience`` validations without
improvement or at ``steps``. The validation queries are taken from the training split, never
from the held-out one, which stays for :mod:`parity.evaluation`.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from model_repo.digits import VariantPlan, build
from parity.coding import EncoderKind, encode
from parity.evaluation import Predictor, degraded_accuracy

logger = logging.getLogger(__name__)


class TrainingSettings(BaseModel):
    """How long and how a parity model trains; §5.1's optimiser and regularisation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(8000, gt=0)
    """The most iterations (mini-batches of coding groups)."""
    batch_size: int = Field(64, gt=0)
    """Coding groups per iteration (§5.1: 32-64)."""
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-5, ge=0)
    """L2 regularisation (§5.1: 1e-5)."""
    validate_every: int = Field(500, gt=0)
    patience: int = Field(16, gt=0)
    """Validations without a better A_d before training stops. Generous: a narrow parity model
    can sit on a plateau for thousands of steps before its A_d climbs again."""
    validation_groupings: int = Field(10, gt=0)
    """Random groupings of the validation queries per validation (a steadier A_d)."""
    seed: int = 0


VARIANT_SETTINGS: dict[str, dict[str, int]] = {
    "digits_mlp_xs": {"steps": 40000, "patience": 40},
    "digits_mlp": {"steps": 12000},
    "digits_cnn": {"steps": 8000},
    "digits_cnn_xl": {"steps": 3000},
}
"""Per-variant budgets. The 6-unit MLP needs many more (cheap) steps and a longer patience:
its loss sits on plateaus for thousands of steps (hidden units stuck) before it drops again;
the wide CNN needs fewer, and each of its steps costs more."""


def default_settings(variant: str) -> TrainingSettings:
    """The settings a variant trains with unless told otherwise."""
    return TrainingSettings(**VARIANT_SETTINGS.get(variant, {}))


@dataclass
class TrainedParity:
    """A trained parity model (a torch module, in eval mode) and how its training went."""

    model: Any
    steps_run: int
    best_step: int
    validation_accuracy: float
    """A_d on the validation queries of the kept weights."""
    losses: list[float] = field(default_factory=list)
    """The mean training loss of each validation window, in order."""


def init_parity_weights(module: Any) -> None:
    """§5.1's initialisation: Xavier for convolutions, N(0, 0.01) for other weights, zero biases."""
    from torch import nn

    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.xavier_uniform_(layer.weight)
        elif isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, mean=0.0, std=0.01)
        else:
            continue
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def torch_predictor(module: Any) -> Predictor:
    """A torch module as a :data:`Predictor` (no gradients)."""
    import torch

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            result: np.ndarray = module(torch.from_numpy(np.ascontiguousarray(
                batch, dtype=np.float32))).numpy()
        return result

    return run


def train_parity(plan: VariantPlan, deployed: Predictor, x_fit: np.ndarray,
                 validation: tuple[np.ndarray, np.ndarray], k: int,
                 encoder: EncoderKind | str, settings: TrainingSettings) -> TrainedParity:
    """Train F_P for the deployed model ``deployed`` (architecture ``plan``) and coding ``k``.

    ``x_fit`` are the training queries; ``validation`` the (queries, labels) that decide when
    to stop and which weights to keep.
    """
    import torch

    kind = EncoderKind(encoder)
    x_val, y_val = validation
    # The deployed outputs are computed once, as labels are fixed (F does not change).
    fit_outputs, val_outputs = deployed(x_fit), deployed(x_val)
    torch.manual_seed(settings.seed)
    model = build(plan)
    init_parity_weights(model)
    optimiser = torch.optim.Adam(model.parameters(), lr=settings.learning_rate,
                                 weight_decay=settings.weight_decay)
    rng = np.random.default_rng(settings.seed)
    best = TrainedParity(model=None, steps_run=0, best_step=0, validation_accuracy=-1.0)
    best_state: dict[str, Any] = {}
    window: list[float] = []
    stale = 0
    model.train()
    for step in range(1, settings.steps + 1):
        members = rng.integers(len(x_fit), size=(settings.batch_size, k))
        parity = encode([x_fit[members[:, i]] for i in range(k)], kind)
        target = fit_outputs[members].sum(axis=1)
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(parity)),
                                            torch.from_numpy(target))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        window.append(float(loss.item()))
        best.steps_run = step
        if step % settings.validate_every and step != settings.steps:
            continue
        best.losses.append(float(np.mean(window)))
        window = []
        model.eval()
        measured = degraded_accuracy(torch_predictor(model), x_val, val_outputs, y_val, k, kind,
                                     groupings=settings.validation_groupings,
                                     seed=settings.seed).accuracy
        model.train()
        logger.debug("parity k=%d %s step %d: loss %.4f, validation A_d %.4f", k, kind, step,
                     best.losses[-1], measured)
        if measured > best.validation_accuracy:
            best.validation_accuracy, best.best_step, stale = measured, step, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            stale += 1
            if stale >= settings.patience:
                break
    model.load_state_dict(best_state)
    best.model = model.eval()
    return best
