"""Tensor <-> ``Payload`` (raw little-endian bytes; base64 only inside JSON). No pickle."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from stateful.errors import WireFormatError
from stateful.messages import Payload

if TYPE_CHECKING:
    import torch

_LITTLE = sys.byteorder == "little"


def to_payload(tensor: torch.Tensor) -> Payload:
    """Encode a float32 or int64 CPU tensor (other floats are cast to float32)."""
    import torch

    t = tensor.detach()
    if t.dtype == torch.int64:
        dtype = "int64"
    else:
        dtype = "float32"
        t = t.to(torch.float32)
    t = t.contiguous().cpu()
    data = t.numpy().tobytes() if _LITTLE else t.numpy().byteswap().tobytes()
    return Payload(dtype=dtype, shape=tuple(t.shape), data=data)


def from_payload(payload: Payload) -> torch.Tensor:
    """Decode a payload into a fresh, writable tensor."""
    import numpy as np
    import torch

    np_dtype = np.dtype("<f4") if payload.dtype == "float32" else np.dtype("<i8")
    count = 1
    for dim in payload.shape:
        count *= dim
    if count * np_dtype.itemsize != len(payload.data):
        raise WireFormatError(f"payload of shape {payload.shape} {payload.dtype} carries "
                              f"{len(payload.data)} bytes")
    array = np.frombuffer(payload.data, dtype=np_dtype).reshape(payload.shape)
    return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=True))


def encode_state(state: Mapping[str, torch.Tensor]) -> dict[str, Payload]:
    return {name: to_payload(t) for name, t in state.items()}


def decode_state(state: Mapping[str, Payload]) -> dict[str, torch.Tensor]:
    return {name: from_payload(p) for name, p in state.items()}
