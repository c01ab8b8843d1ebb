"""The model API for graph operators (HAMS §II-B, §V), with compute and update separated.

A stateful operator's processing of a batch has a read-only *compute* phase and an *update*
phase (§II-B): an LSTM computes its gates reading only the hidden state, then writes the new
cell and hidden state; an online learner computes loss and gradients reading only its
parameters, then applies them. NSPB retrieves the state *during* the next batch's compute phase
and never during an update (§IV-B), so the API keeps the two apart:

- ``initialize(seed)``: build the model's parameters deterministically (primary, backup and
  standby of one operator must start identical);
- ``compute(batch) -> ComputeResult``: must not modify the state; returns one output per request
  and the *pending update* as tensors (HAMS passes an event object to ``run()`` instead; an
  explicit value keeps the phases apart without threads, and lets the runtime perturb updates to
  emulate GPU non-determinism);
- ``update(result)``: apply the pending update;
- ``get_state()``: a complete copy of the state (all tensors, never views that ``update`` mutates
  in place); ``set_state(state)``: overwrite it completely (promotion, rejoin, rollback).

Stateless operators implement ``initialize`` and ``compute`` only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from stateful.messages import RequestMeta

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ModelInput:
    """One request of a batch: its metadata and one input tensor per active predecessor."""

    meta: RequestMeta
    inputs: tuple[torch.Tensor, ...]


@dataclass
class ComputeResult:
    outputs: list[torch.Tensor]
    update: dict[str, torch.Tensor] = field(default_factory=dict)
    """Pending state changes (float tensors are perturbed by non-determinism injection)."""
    context: Any = None
    """Anything else ``update`` needs that is not a tensor (e.g. which streams changed)."""


class OperatorModel(ABC):
    """Base of every operator model; ``params`` come from the graph spec."""

    stateful: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abstractmethod
    def initialize(self, seed: int) -> None:
        """Build parameters deterministically from ``seed``."""

    @abstractmethod
    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        """Read-only forward (and, for training requests, gradient) computation."""


class StatefulModel(OperatorModel):
    stateful: ClassVar[bool] = True

    @abstractmethod
    def update(self, result: ComputeResult) -> None:
        """Apply ``result.update`` to the state."""

    @abstractmethod
    def get_state(self) -> dict[str, torch.Tensor]:
        """A complete copy of the state."""

    @abstractmethod
    def set_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the whole state."""
