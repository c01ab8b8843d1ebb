"""numpy arrays to Triton's tensors and back, for tritonclient's HTTP and gRPC modules.

Any tensor Triton takes: the type comes from the array (``float32`` is FP32, ``bool`` BOOL,
``object``, ``str`` and ``bytes`` arrays are BYTES), the shape is the array's. Outputs come
back as numpy arrays by name: those asked for, or every output the model has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from understudy.sdk.errors import InferenceError
from understudy.sdk.records import ModelMetadata, TensorSpec


def triton_dtype(array: np.ndarray) -> str:
    """Triton's type name for an array (InferenceError when Triton has none)."""
    from tritonclient.utils import np_to_triton_dtype

    if array.dtype.kind in "OSU":
        return "BYTES"
    name = np_to_triton_dtype(array.dtype)
    if name is None:
        raise InferenceError(f"arrays of {array.dtype} have no Triton type")
    return str(name)


def encode(module: Any, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
           binary: bool) -> tuple[list[Any], list[Any] | None]:
    """Triton tensors for the arrays ``inputs`` and the output names ``outputs``.

    ``module`` is ``tritonclient.http`` or ``tritonclient.grpc``, whose ``InferInput`` and
    ``InferRequestedOutput`` are made.
    """
    if not inputs:
        raise InferenceError("a request needs at least one input tensor")
    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        if array.dtype.kind == "U":
            array = np.char.encode(array, "utf-8")
        if array.dtype.kind == "S":
            array = array.astype(object)
        array = np.ascontiguousarray(array)
        tensor = module.InferInput(name, list(array.shape), triton_dtype(array))
        if binary:
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    if outputs is None:
        return tensors, None
    if binary:
        return tensors, [module.InferRequestedOutput(n, binary_data=True) for n in outputs]
    return tensors, [module.InferRequestedOutput(n) for n in outputs]


def decode_http(result: Any) -> tuple[str, dict[str, np.ndarray]]:
    """The model name and output arrays of a ``tritonclient.http`` result."""
    response = result.get_response()
    names = [o["name"] for o in response.get("outputs") or ()]
    return str(response.get("model_name", "")), {n: result.as_numpy(n) for n in names}


def decode_grpc(result: Any) -> tuple[str, dict[str, np.ndarray]]:
    """The model name and output arrays of a ``tritonclient.grpc`` result."""
    response = result.get_response()
    names = [o.name for o in response.outputs]
    return str(response.model_name), {n: result.as_numpy(n) for n in names}


def metadata_of(doc: Mapping[str, Any], server_id: str = "", variant: str = "") -> ModelMetadata:
    """Model metadata from Triton's JSON.

    HTTP's, or gRPC's message as JSON, whose 64-bit integers are strings.
    """

    def specs(items: Any) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(str(t["name"]), str(t["datatype"]),
                                tuple(int(d) for d in t.get("shape") or ()))
                     for t in items or ())

    return ModelMetadata(name=str(doc.get("name", "")), inputs=specs(doc.get("inputs")),
                         outputs=specs(doc.get("outputs")),
                         versions=tuple(str(v) for v in doc.get("versions") or ()),
                         platform=str(doc.get("platform", "")), server_id=server_id,
                         variant=variant, raw=dict(doc))
