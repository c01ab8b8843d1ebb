"""What each request looked like from the client: stamps for client-observed outage.

A record is written for every request, answered or not: when it was sent and when it ended
(wall clock, seconds since the epoch, so records of several processes line up with the
failures a testbed records), which server and variant answered, and how many attempts it took.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestRecord:
    """One request as the client experienced it."""

    sent_at: float
    """When the caller handed the request to the client (``time.time()``)."""
    done_at: float
    """When the answer (or the error) came back."""
    ok: bool
    attempts: int
    server_id: str | None = None
    """The server that answered (None: none did)."""
    variant: str | None = None
    accuracy: float | None = None
    error: str = ""
    """Why there was no answer (empty when ``ok``)."""
    app_id: str = ""
    resends: int = 0
    """Attempts sent again after the first: cancelled by a move, or after a failure."""
    moved: int = 0
    """Attempts cancelled in flight because the app moved away from their server."""
    protocol: str = ""
    """``http`` or ``grpc``."""
    reason: str = ""
    """The error's label (``SdkError.reason``); empty when ``ok``."""

    @property
    def latency_s(self) -> float:
        """End to end, resends included."""
        return self.done_at - self.sent_at


@dataclass
class InferResult:
    """The output tensors of one request, and its record."""

    outputs: dict[str, np.ndarray]
    record: RequestRecord
    model_name: str = ""
    """The Triton model that answered (``<app_id>__<variant>``)."""

    def as_numpy(self, name: str) -> np.ndarray:
        """One output by name (KeyError when the model has no such output)."""
        return self.outputs[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the model's metadata describes it."""

    name: str
    datatype: str
    """Triton's type name: ``FP32``, ``INT64``, ``BOOL``, ``BYTES``..."""
    shape: tuple[int, ...]
    """-1 for a dimension of any size (the batch dimension of a batching model)."""

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy type of this tensor (``object`` for BYTES)."""
        from tritonclient.utils import triton_to_np_dtype

        return np.dtype(triton_to_np_dtype(self.datatype))

    def zeros(self, any_size: int = 1) -> np.ndarray:
        """An array of this tensor's shape and type, ``any_size`` for each -1 dimension."""
        shape = tuple(any_size if d < 0 else d for d in self.shape)
        if self.datatype == "BYTES":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=self.dtype)


@dataclass(frozen=True)
class ModelMetadata:
    """The model serving an app, as its replica describes it."""

    name: str
    """The Triton model (``<app_id>__<variant>``)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    versions: tuple[str, ...] = ()
    platform: str = ""
    server_id: str = ""
    variant: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The metadata as Triton sent it."""

    def input(self, name: str) -> TensorSpec:
        """An input by name (KeyError when there is none)."""
        return _named(self.inputs, name)

    def output(self, name: str) -> TensorSpec:
        """An output by name (KeyError when there is none)."""
        return _named(self.outputs, name)


def _named(specs: tuple[TensorSpec, ...], name: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(name)
