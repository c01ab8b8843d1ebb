"""Ready-made services modelled on HAMS's SP and OL (§VI-A, Fig. 8-9), and request makers.

``sp`` (stock prediction): tweets -> ``embed`` (MLP) -> ``sentiment`` (LSTM, stateful); prices
-> ``features`` (CNN); ``sentiment`` + ``features`` -> ``stock`` (LSTM, stateful, joins both)
-> ``predict`` (MLP) -> reply. Two stateful operators fed by stateless ones, one downstream of
the other, so the backup of ``stock`` must wait for ``sentiment``'s states (Algorithm 2).

``ol`` (online learning): frames -> ``camera`` (CNN) -> ``tracker`` (LSTM per stream, stateful)
-> ``classifier`` (online learner, stateful; training requests carry a label and update it)
-> ``tagger`` (MLP) -> reply. As in OL(V), a stateful model feeds the online-learned one.

``sp_graph(features_app=APP)`` serves ``features`` from a registered Understudy app (a Triton
image model, ``kind="triton"``, see ``stateful/triton_operator.py``) instead of the in-process CNN.

``scale`` multiplies hidden sizes and ``depth`` sets the hidden layers of the last stateless
operator (the benchmark uses bigger models than the tests; HAMS's condition for a small
overhead is that the work after a stateful model outlasts its state transfer, §VI-B).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from stateful.core.frontend import ClientRequest
from stateful.graph import FRONTEND, GraphSpec, OperatorSpec
from stateful.tensors import to_payload

SERVICES = ("sp", "ol")


def sp_graph(batch_size: int = 16, *, scale: int = 1, depth: int = 1, side: int = 8,
             seed: int = 0, features_app: str | None = None) -> GraphSpec:
    h = 16 * scale
    features = OperatorSpec(name="features", kind="cnn", stateful=False,
                            params={"channels": 1, "side": side, "filters": 4 * scale,
                                    "out_dim": h})
    if features_app is not None:
        features = OperatorSpec(name="features", kind="triton", stateful=False,
                                params={"app_id": features_app, "channels": 1, "side": side,
                                        "out_dim": h})
    return GraphSpec(
        name="sp", batch_size=batch_size, seed=seed,
        operators=(
            OperatorSpec(name="embed", kind="mlp", stateful=False,
                         params={"in_dim": 16, "hidden": 2 * h, "out_dim": h}),
            OperatorSpec(name="sentiment", kind="lstm", stateful=True,
                         params={"in_dim": h, "hidden": h, "out_dim": h}),
            features,
            OperatorSpec(name="stock", kind="lstm", stateful=True,
                         params={"in_dim": 2 * h, "hidden": h, "out_dim": h}),
            OperatorSpec(name="predict", kind="mlp", stateful=False,
                         params={"in_dim": h, "hidden": 4 * h, "out_dim": 4, "layers": depth}),
        ),
        edges=((FRONTEND, "embed"), ("embed", "sentiment"), (FRONTEND, "features"),
               ("features", "stock"), ("sentiment", "stock"), ("stock", "predict"),
               ("predict", FRONTEND)),
    )


def ol_graph(batch_size: int = 16, *, scale: int = 1, depth: int = 1, side: int = 8,
             seed: int = 0) -> GraphSpec:
    h = 16 * scale
    return GraphSpec(
        name="ol", batch_size=batch_size, seed=seed,
        operators=(
            OperatorSpec(name="camera", kind="cnn", stateful=False,
                         params={"channels": 1, "side": side, "filters": 4 * scale, "out_dim": h}),
            OperatorSpec(name="tracker", kind="lstm", stateful=True,
                         params={"in_dim": h, "hidden": h, "out_dim": h}),
            OperatorSpec(name="classifier", kind="online_classifier", stateful=True,
                         params={"in_dim": h, "hidden": 4 * h, "classes": 4, "lr": 0.05}),
            OperatorSpec(name="tagger", kind="mlp", stateful=False,
                         params={"in_dim": 4, "hidden": 4 * h, "out_dim": 4, "layers": depth}),
        ),
        edges=((FRONTEND, "camera"), ("camera", "tracker"), ("tracker", "classifier"),
               ("classifier", "tagger"), ("tagger", FRONTEND)),
    )


def service_graph(name: str, batch_size: int = 16, *, scale: int = 1, depth: int = 1,
                  side: int = 8, seed: int = 0) -> GraphSpec:
    if name == "sp":
        return sp_graph(batch_size, scale=scale, depth=depth, side=side, seed=seed)
    if name == "ol":
        return ol_graph(batch_size, scale=scale, depth=depth, side=side, seed=seed)
    raise ValueError(f"unknown service {name!r}; known: {SERVICES}")


def request_maker(name: str, *, seed: int = 0, streams: int = 8, side: int = 8,
                  train_share: float = 0.5) -> Callable[[int], ClientRequest]:
    """Deterministic request ``i`` of a service (inputs, stream, kind and label).

    ``side`` must match the graph's (the CNN input is a ``side`` x ``side`` image).
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def make(i: int) -> ClientRequest:
        stream = f"s{i % streams}"
        if name == "sp":
            return ClientRequest(stream=stream, inputs={
                "embed": to_payload(torch.randn(16, generator=gen)),
                "features": to_payload(torch.randn(side * side, generator=gen))})
        if name == "ol":
            train = rng.random() < train_share
            image = to_payload(torch.randn(side * side, generator=gen))
            return ClientRequest(stream=stream, kind="train" if train else "infer",
                                 label=rng.randrange(4) if train else None,
                                 inputs={"camera": image})
        raise ValueError(f"unknown service {name!r}; known: {SERVICES}")

    return make
