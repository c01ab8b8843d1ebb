"""Example operators in torch: stateless MLP and CNN, a per-stream LSTM, an online learner.

Kept small on purpose (the repository's machines are 2-core CPUs); sizes come from each
operator's ``params`` in the graph spec. Every model is built under a forked RNG seeded from the
graph seed and the operator name, so every replica of an operator starts identical.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from stateful.api import ComputeResult, ModelInput, OperatorModel, StatefulModel
from stateful.errors import InvalidGraphRequestError, UnknownOperatorKindError
from stateful.graph import GraphSpec, OperatorSpec
from stateful.triton_operator import TritonOperator


def _flat(item: ModelInput, width: int, op: str) -> torch.Tensor:
    x = torch.cat([t.reshape(-1).to(torch.float32) for t in item.inputs])
    if x.numel() != width:
        raise InvalidGraphRequestError(f"{op}: expected {width} input values, got {x.numel()}")
    return x


def _stack(batch: Sequence[ModelInput], width: int, op: str) -> torch.Tensor:
    return torch.stack([_flat(item, width, op) for item in batch])


class MLP(OperatorModel):
    """Stateless perceptron: ``in_dim -> hidden (x layers) -> out_dim``."""

    def initialize(self, seed: int) -> None:
        p = self.params
        self.in_dim = int(p.get("in_dim", 16))
        hidden = int(p.get("hidden", 32))
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # CPU only: cheaper
            layers: list[nn.Module] = [nn.Linear(self.in_dim, hidden), nn.ReLU()]
            for _ in range(int(p.get("layers", 1)) - 1):
                layers += [nn.Linear(hidden, hidden), nn.ReLU()]
            layers.append(nn.Linear(hidden, int(p.get("out_dim", 16))))
            self.net = nn.Sequential(*layers)
        self.net.eval()

    @torch.no_grad()
    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        y = self.net(_stack(batch, self.in_dim, "mlp"))
        return ComputeResult(outputs=list(y))


class CNN(OperatorModel):
    """Stateless small convnet over ``channels x side x side`` inputs -> ``out_dim`` features."""

    def initialize(self, seed: int) -> None:
        p = self.params
        self.channels = int(p.get("channels", 1))
        self.side = int(p.get("side", 8))
        filters = int(p.get("filters", 8))
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # CPU only: cheaper
            self.net = nn.Sequential(
                nn.Conv2d(self.channels, filters, 3, padding=1), nn.ReLU(),
                nn.Conv2d(filters, filters, 3, padding=1), nn.ReLU(),
                nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                nn.Linear(filters * 4, int(p.get("out_dim", 16))))
        self.net.eval()

    @torch.no_grad()
    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        width = self.channels * self.side * self.side
        x = _stack(batch, width, "cnn").reshape(-1, self.channels, self.side, self.side)
        return ComputeResult(outputs=list(self.net(x)))


def _names_tensor(names: Sequence[str]) -> torch.Tensor:
    """Stream names as an int64 tensor of UTF-8 bytes (states hold tensors only)."""
    return torch.tensor(list("\n".join(names).encode()), dtype=torch.int64)


def _names(tensor: torch.Tensor) -> list[str]:
    raw = bytes(tensor.tolist()).decode()
    return raw.split("\n") if raw else []


class LSTMOperator(StatefulModel):
    """Stateful inference (§II-B): one LSTM hidden/cell state per request stream.

    Compute reads each stream's (h, c) and produces the new pair without writing it; the update
    stores it. Requests of one stream inside a batch run in order (the later one sees the
    earlier one's pending state). The state is three tensors: ``h`` and ``c`` (one row per
    stream) and ``streams`` (the row names), so retrieving it is two copies, not one per stream.
    """

    def initialize(self, seed: int) -> None:
        p = self.params
        self.in_dim = int(p.get("in_dim", 16))
        self.hidden = int(p.get("hidden", 16))
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # CPU only: cheaper
            self.cell = nn.LSTMCell(self.in_dim, self.hidden)
            self.head = nn.Linear(self.hidden, int(p.get("out_dim", self.hidden)))
        self.rows: dict[str, int] = {}
        self.h = torch.zeros(0, self.hidden)
        self.c = torch.zeros(0, self.hidden)

    def _row(self, table: torch.Tensor, stream: str) -> torch.Tensor:
        row = self.rows.get(stream)
        return table[row] if row is not None else torch.zeros(self.hidden)

    @torch.no_grad()
    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        x = _stack(batch, self.in_dim, "lstm")
        pending_h: dict[str, torch.Tensor] = {}
        pending_c: dict[str, torch.Tensor] = {}
        outputs: list[torch.Tensor | None] = [None] * len(batch)
        remaining = list(range(len(batch)))
        while remaining:  # one batched cell call per "wave" of distinct streams
            wave: list[int] = []
            streams: set[str] = set()
            for i in remaining:
                if batch[i].meta.stream not in streams:
                    streams.add(batch[i].meta.stream)
                    wave.append(i)
            taken = set(wave)
            remaining = [i for i in remaining if i not in taken]
            keys = [batch[i].meta.stream for i in wave]
            h0 = torch.stack([pending_h[k] if k in pending_h else self._row(self.h, k)
                              for k in keys])
            c0 = torch.stack([pending_c[k] if k in pending_c else self._row(self.c, k)
                              for k in keys])
            h1, c1 = self.cell(x[wave], (h0, c0))
            y = self.head(h1)
            for n, i in enumerate(wave):
                pending_h[keys[n]], pending_c[keys[n]] = h1[n], c1[n]
                outputs[i] = y[n]
        names = sorted(pending_h)
        update = {"h": torch.stack([pending_h[k] for k in names]),
                  "c": torch.stack([pending_c[k] for k in names])}
        return ComputeResult(outputs=[o for o in outputs if o is not None], update=update,
                             context=names)

    def update(self, result: ComputeResult) -> None:
        names: list[str] = result.context
        new = [k for k in names if k not in self.rows]
        if new:
            for k in new:
                self.rows[k] = len(self.rows)
            pad = torch.zeros(len(new), self.hidden)
            self.h = torch.cat([self.h, pad])
            self.c = torch.cat([self.c, pad])
        index = torch.tensor([self.rows[k] for k in names], dtype=torch.int64)
        self.h[index] = result.update["h"]
        self.c[index] = result.update["c"]

    def get_state(self) -> dict[str, torch.Tensor]:
        return {"h": self.h.clone(), "c": self.c.clone(), "streams": _names_tensor(list(self.rows))}

    def set_state(self, state: Mapping[str, torch.Tensor]) -> None:
        names = _names(state["streams"])
        self.rows = {k: i for i, k in enumerate(names)}
        self.h = state["h"].clone().reshape(len(names), self.hidden)
        self.c = state["c"].clone().reshape(len(names), self.hidden)


class OnlineClassifier(StatefulModel):
    """Online learning (§II-B): training requests update the parameters, which are the state.

    Compute returns class probabilities for every request (with the parameters as they were
    before this batch) and, for the batch's training requests, the gradient of their mean
    cross-entropy — parameters are read-only until ``update`` takes an SGD step.
    """

    def initialize(self, seed: int) -> None:
        p = self.params
        self.in_dim = int(p.get("in_dim", 16))
        self.lr = float(p.get("lr", 0.05))
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # CPU only: cheaper
            self.net = nn.Sequential(nn.Linear(self.in_dim, int(p.get("hidden", 32))), nn.Tanh(),
                                     nn.Linear(int(p.get("hidden", 32)), int(p.get("classes", 4))))

    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        x = _stack(batch, self.in_dim, "online_classifier")
        train = [i for i, item in enumerate(batch)
                 if item.meta.kind == "train" and item.meta.label is not None]
        params = list(self.net.parameters())
        with torch.enable_grad():
            logits = self.net(x)
            update: dict[str, torch.Tensor] = {}
            if train:
                labels = torch.tensor([batch[i].meta.label for i in train], dtype=torch.int64)
                loss = nn.functional.cross_entropy(logits[train], labels)
                grads = torch.autograd.grad(loss, params)
                names = [n for n, _ in self.net.named_parameters()]
                update = {n: g.detach() for n, g in zip(names, grads, strict=True)}
        probs = torch.softmax(logits.detach(), dim=1)
        return ComputeResult(outputs=list(probs), update=update)

    @torch.no_grad()
    def update(self, result: ComputeResult) -> None:
        for name, param in self.net.named_parameters():
            grad = result.update.get(name)
            if grad is not None:
                param.sub_(self.lr * grad)

    def get_state(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in self.net.state_dict().items()}

    def set_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict(dict(state))


OPERATOR_KINDS: dict[str, type[OperatorModel]] = {
    "mlp": MLP,
    "cnn": CNN,
    "lstm": LSTMOperator,
    "online_classifier": OnlineClassifier,
    "triton": TritonOperator,  # stateless, served by an Understudy app (needs the cluster)
}


def operator_seed(graph_seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{graph_seed}:{name}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def build_operator(graph: GraphSpec, spec: OperatorSpec,
                   kinds: Mapping[str, type[OperatorModel]] | None = None) -> OperatorModel:
    """Instantiate and initialize ``spec``'s model (same parameters on every replica)."""
    cls = (kinds or OPERATOR_KINDS).get(spec.kind)
    if cls is None:
        raise UnknownOperatorKindError(f"operator {spec.name!r}: unknown kind {spec.kind!r}")
    if cls.stateful != spec.stateful:
        raise UnknownOperatorKindError(
            f"operator {spec.name!r}: kind {spec.kind!r} is "
            f"{'stateful' if cls.stateful else 'stateless'} but the spec says otherwise")
    params: dict[str, Any] = dict(spec.params)
    model = cls(**params)
    model.initialize(operator_seed(graph.seed, spec.name))
    return model


def check_kinds(graph: GraphSpec) -> None:
    """Raise ``UnknownOperatorKindError`` unless every operator's kind is known and agrees."""
    for spec in graph.operators:
        cls = OPERATOR_KINDS.get(spec.kind)
        if cls is None or cls.stateful != spec.stateful:
            build_operator(graph, spec)
