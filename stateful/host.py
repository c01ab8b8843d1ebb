"""Runs one node's model effects: build, compute, update, retrieve, load — plus noise injection.

Both runtimes use it: the simulator calls it inline, a replica process from its worker threads
(see the executor contract in ``stateful.core.effects``). Non-determinism injection (HAMS §II-C,
S2) perturbs every output and every pending state update with fresh seeded noise on each
execution, so a re-execution after a failover differs from the first one the way GPU float
reductions do, while a run stays reproducible from its seed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence

import torch

from stateful.api import ComputeResult, ModelInput, OperatorModel, StatefulModel
from stateful.core.effects import BatchItem
from stateful.errors import UnexpectedMessageError
from stateful.graph import GraphSpec
from stateful.messages import NoiseSpec, Payload
from stateful.operators import build_operator
from stateful.tensors import decode_state, encode_state, from_payload, to_payload

logger = logging.getLogger(__name__)


class Noise:
    """Seeded multiplicative perturbation: ``t + scale * (|t| + 1e-3) * N(0, 1)``."""

    def __init__(self, spec: NoiseSpec, node: str) -> None:
        digest = hashlib.blake2b(f"{spec.seed}:{node}".encode(), digest_size=8).digest()
        self.scale = spec.scale
        self.gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)

    def perturb(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        noise = torch.randn(t.shape, generator=self.gen, dtype=t.dtype)
        return t + self.scale * (t.abs() + 1e-3) * noise


class ModelHost:
    """The model of whichever operator the node currently serves."""

    def __init__(self, graph: GraphSpec, node: str, noise: NoiseSpec | None = None) -> None:
        self.graph = graph
        self.node = node
        self.noise = Noise(noise, node) if noise is not None else None
        self.op: str | None = None
        self.model: OperatorModel | None = None
        self.pending: dict[int, ComputeResult] = {}

    def load(self, op: str, tensors: Mapping[str, Payload] | None) -> None:
        """Build ``op``'s model (if another or none is loaded) and set or reset its state."""
        if self.op != op or self.model is None or tensors is None:
            self.model = build_operator(self.graph, self.graph.operator(op))
            self.op = op
        self.pending.clear()
        if tensors is not None:
            self._stateful().set_state(decode_state(tensors))

    def _stateful(self) -> StatefulModel:
        if not isinstance(self.model, StatefulModel):
            raise UnexpectedMessageError(f"{self.node}: {self.op} is not a stateful operator")
        return self.model

    def compute(self, batch_no: int, items: Sequence[BatchItem]) -> list[Payload]:
        if self.model is None:
            raise UnexpectedMessageError(f"{self.node}: compute before any model was loaded")
        batch = [ModelInput(meta=i.meta, inputs=tuple(from_payload(p) for p in i.inputs))
                 for i in items]
        result = self.model.compute(batch)
        if self.noise is not None:
            result.outputs = [self.noise.perturb(t) for t in result.outputs]
            result.update = {k: self.noise.perturb(v) for k, v in result.update.items()}
        if self.model.stateful:
            self.pending[batch_no] = result
        return [to_payload(t) for t in result.outputs]

    def update(self, batch_no: int) -> None:
        result = self.pending.pop(batch_no, None)
        if result is None:
            raise UnexpectedMessageError(
                f"{self.node}: update of batch {batch_no} without its compute")
        self._stateful().update(result)

    def retrieve(self) -> dict[str, Payload]:
        return encode_state(self._stateful().get_state())
