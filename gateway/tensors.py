"""Just enough of KServe v2's tensor encodings to code queries and answer with a rebuilt output.

The gateway forwards bodies as bytes; only apps it codes (parity models, the baselines' default
response) need their tensors. Read here: an infer request's numeric inputs and what outputs it
asks for, from HTTP (JSON, or JSON plus the binary tensor extension) or a gRPC
``ModelInferRequest``; a reply's numeric outputs. Written here: the parity query (over HTTP, in
the binary extension) and an answer made of outputs the gateway computed (in the request's
protocol, binary where the request asked for binary), with a response parameter saying where
the answer came from.

Anything else (compressed bodies, ``BYTES`` tensors, the classification extension, shared
memory) is *not codable*: :class:`NotCodable` is raised and the request goes its usual way,
unprotected.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16), "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64), "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64)}
"""Triton's numeric types (little-endian on the wire, as numpy's on the machines we run on)."""
TRITON_TYPES = {dtype: name for name, dtype in DTYPES.items()}
GRPC_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                 "INT32": "int_contents", "INT64": "int64_contents",
                 "UINT8": "uint_contents", "UINT16": "uint_contents",
                 "UINT32": "uint_contents", "UINT64": "uint64_contents",
                 "FP32": "fp32_contents", "FP64": "fp64_contents"}
"""Field of ``InferTensorContents`` holding each type (FP16 has none: raw bytes only)."""
ANSWER_PARAMETER = "understudy_answer"
"""Response parameter naming where an answer came from when it is not the model's own."""
GROUP_PARAMETER = "understudy_coding_group"
_FORBIDDEN_PARAMETERS = ("shared_memory_region", "classification")


class NotCodable(ValueError):
    """A request or reply whose tensors the gateway does not read (it passes through)."""


@dataclass
class Query:
    """One infer request's numeric inputs and what its client wants back."""

    protocol: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None = None
    """Output names asked for (None: every output)."""
    binary_outputs: frozenset[str] = frozenset()
    """Outputs to answer in the binary extension (HTTP)."""
    all_binary: bool = False
    """The request's ``binary_data_output`` parameter (HTTP)."""
    request_id: str = ""
    binary_inputs: bool = False
    """Whether the request sent its inputs in the binary extension (HTTP)."""
    input_types: dict[str, str] = field(default_factory=dict)

    def signature(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """Names, types and shapes of the inputs: queries coded together share it."""
        return tuple(sorted((n, a.dtype.str, a.shape) for n, a in self.inputs.items()))


# --- HTTP ---------------------------------------------------------------------------------

def _split(body: bytes | bytearray, header_length: int | None
           ) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(bytes(body) if isinstance(body, bytearray) else body)
    end = len(view) if header_length is None else header_length
    if end > len(view) or end < 0:
        raise NotCodable("binary header length beyond the body")
    try:
        doc = json.loads(view[:end].tobytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotCodable(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise NotCodable("not a JSON object")
    return doc, view[end:]


def _array(tensor: Mapping[str, Any], blob: memoryview | None) -> np.ndarray:
    datatype = str(tensor.get("datatype", ""))
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise NotCodable(f"tensor type {datatype or '?'} is not numeric")
    shape = tuple(int(d) for d in tensor.get("shape", ()))
    if blob is not None:
        array = np.frombuffer(blob, dtype=dtype)
    else:
        array = np.asarray(tensor.get("data", ()), dtype=dtype).ravel()
    if array.size != math.prod(shape):
        raise NotCodable(f"tensor {tensor.get('name')!r}: {array.size} values for shape "
                         f"{list(shape)}")
    return array.reshape(shape)


def _tensors(items: Any, rest: memoryview) -> tuple[dict[str, np.ndarray], bool]:
    if not isinstance(items, list) or not items:
        raise NotCodable("no tensors")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    binary = False
    for item in items:
        if not isinstance(item, dict) or "name" not in item:
            raise NotCodable("malformed tensor")
        parameters = item.get("parameters") or {}
        if any(p in parameters for p in _FORBIDDEN_PARAMETERS):
            raise NotCodable("shared memory or classification")
        size = parameters.get("binary_data_size")
        blob = None
        if size is not None:
            binary = True
            blob = rest[offset:offset + int(size)]
            offset += int(size)
        arrays[str(item["name"])] = _array(item, blob)
    return arrays, binary


def read_http_request(body: bytes | bytearray, header_length: int | None) -> Query:
    """The inputs and wanted outputs of an HTTP infer body (NotCodable if not numeric)."""
    doc, rest = _split(body, header_length)
    inputs, binary = _tensors(doc.get("inputs"), rest)
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict) or any(p in parameters for p in _FORBIDDEN_PARAMETERS):
        raise NotCodable("unsupported request parameters")
    outputs = None
    binary_outputs: set[str] = set()
    if doc.get("outputs") is not None:
        names = []
        for item in doc["outputs"]:
            out_parameters = item.get("parameters") or {}
            if any(p in out_parameters for p in _FORBIDDEN_PARAMETERS):
                raise NotCodable("shared memory or classification output")
            names.append(str(item["name"]))
            if out_parameters.get("binary_data"):
                binary_outputs.add(str(item["name"]))
        outputs = tuple(names)
    return Query("http", inputs, outputs, frozenset(binary_outputs),
                 bool(parameters.get("binary_data_output")), str(doc.get("id", "")), binary,
                 {n: TRITON_TYPES[a.dtype] for n, a in inputs.items()})


def read_http_reply(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The numeric outputs of Triton's HTTP infer reply."""
    doc, rest = _split(body, header_length)
    outputs, _ = _tensors(doc.get("outputs"), rest)
    return outputs


def _http_body(doc: dict[str, Any], tensors: list[dict[str, Any]],
               arrays: Sequence[np.ndarray], binary: Sequence[bool], key: str
               ) -> tuple[bytes, int | None]:
    blobs = []
    for tensor, array, as_binary in zip(tensors, arrays, binary, strict=True):
        if as_binary:
            data = np.ascontiguousarray(array).tobytes()
            tensor.setdefault("parameters", {})["binary_data_size"] = len(data)
            blobs.append(data)
        else:
            tensor["data"] = array.ravel().tolist()
    doc[key] = tensors
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return b"".join((header, *blobs)), len(header)


def http_request(inputs: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """An HTTP infer body carrying ``inputs`` (a parity query), every output asked for.

    The gateway's own query: inputs and outputs in the binary extension, whatever the clients
    whose queries it codes used.
    """
    tensors = [{"name": n, "shape": list(a.shape), "datatype": TRITON_TYPES[a.dtype]}
               for n, a in inputs.items()]
    doc: dict[str, Any] = {"parameters": {"binary_data_output": True}}
    body, header_length = _http_body(doc, tensors, list(inputs.values()),
                                     [True] * len(tensors), "inputs")
    assert header_length is not None  # noqa: S101 - binary inputs
    return body, header_length


def http_answer(query: Query, outputs: Mapping[str, np.ndarray], model_name: str,
                source: str, group_id: str = "") -> tuple[bytes, int | None]:
    """An HTTP infer reply with ``outputs``, binary where the query asked for binary."""
    names = [n for n in (query.outputs or tuple(outputs)) if n in outputs]
    tensors = [{"name": n, "datatype": TRITON_TYPES[outputs[n].dtype],
                "shape": list(outputs[n].shape)} for n in names]
    parameters = {ANSWER_PARAMETER: source}
    if group_id:
        parameters[GROUP_PARAMETER] = group_id
    doc: dict[str, Any] = {"model_name": model_name, "model_version": "1"}
    if query.request_id:
        doc["id"] = query.request_id
    doc["parameters"] = parameters
    binary = [query.all_binary or n in query.binary_outputs for n in names]
    return _http_body(doc, tensors, [outputs[n] for n in names], binary, "outputs")


# --- gRPC ---------------------------------------------------------------------------------

def _pb() -> Any:
    from tritonclient.grpc import service_pb2

    return service_pb2


def _grpc_array(tensor: Any, raw: bytes | None) -> np.ndarray:
    dtype = DTYPES.get(tensor.datatype)
    if dtype is None:
        raise NotCodable(f"tensor type {tensor.datatype or '?'} is not numeric")
    shape = tuple(int(d) for d in tensor.shape)
    if raw is not None:
        array = np.frombuffer(raw, dtype=dtype)
    else:
        name = GRPC_CONTENTS.get(tensor.datatype)
        if name is None:
            raise NotCodable(f"{tensor.datatype} without raw contents")
        array = np.asarray(getattr(tensor.contents, name), dtype=dtype)
    if array.size != math.prod(shape):
        raise NotCodable(f"tensor {tensor.name!r}: {array.size} values for shape {list(shape)}")
    return array.reshape(shape)


def _grpc_forbidden(parameters: Any) -> bool:
    return any(p in parameters for p in _FORBIDDEN_PARAMETERS)


def read_grpc_request(message: bytes | bytearray) -> Query:
    """The inputs and wanted outputs of a serialized ``ModelInferRequest``."""
    pb = _pb()
    try:
        request = pb.ModelInferRequest.FromString(bytes(message))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise NotCodable(f"not a ModelInferRequest: {exc}") from None
    if not request.inputs or _grpc_forbidden(request.parameters):
        raise NotCodable("no inputs, or unsupported parameters")
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise NotCodable("raw contents do not match the inputs")
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        if _grpc_forbidden(tensor.parameters):
            raise NotCodable("shared memory input")
        inputs[tensor.name] = _grpc_array(tensor, raw[index] if raw else None)
    outputs = None
    if request.outputs:
        if any(_grpc_forbidden(o.parameters) for o in request.outputs):
            raise NotCodable("shared memory or classification output")
        outputs = tuple(o.name for o in request.outputs)
    return Query("grpc", inputs, outputs, request_id=request.id,
                 input_types={n: TRITON_TYPES[a.dtype] for n, a in inputs.items()})


def read_grpc_reply(message: bytes) -> dict[str, np.ndarray]:
    """The numeric outputs of a serialized ``ModelInferResponse``."""
    pb = _pb()
    try:
        reply = pb.ModelInferResponse.FromString(bytes(message))
    except Exception as exc:  # noqa: BLE001
        raise NotCodable(f"not a ModelInferResponse: {exc}") from None
    raw = list(reply.raw_output_contents)
    if not reply.outputs or (raw and len(raw) != len(reply.outputs)):
        raise NotCodable("no outputs, or raw contents that do not match them")
    return {t.name: _grpc_array(t, raw[i] if raw else None)
            for i, t in enumerate(reply.outputs)}


def grpc_answer(query: Query, outputs: Mapping[str, np.ndarray], model_name: str,
                source: str, group_id: str = "") -> bytes:
    """A serialized ``ModelInferResponse`` with ``outputs`` and where the answer came from."""
    pb = _pb()
    reply = pb.ModelInferResponse(model_name=model_name, model_version="1",
                                  id=query.request_id)
    reply.parameters[ANSWER_PARAMETER].string_param = source
    if group_id:
        reply.parameters[GROUP_PARAMETER].string_param = group_id
    for name in (n for n in (query.outputs or tuple(outputs)) if n in outputs):
        array = outputs[name]
        tensor = reply.outputs.add()
        tensor.name, tensor.datatype = name, TRITON_TYPES[array.dtype]
        tensor.shape.extend(array.shape)
        reply.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return bytes(reply.SerializeToString())


# --- either protocol ----------------------------------------------------------------------

def header_length_of(headers: Mapping[str, str] | Sequence[tuple[str, str]]) -> int | None:
    """The binary extension's JSON header length from request or reply headers."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in items:
        if name.lower() == "inference-header-content-length":
            if not value.isdigit():
                raise NotCodable("malformed Inference-Header-Content-Length")
            return int(value)
        if name.lower() == "content-encoding" and value.lower() not in ("", "identity"):
            raise NotCodable(f"compressed ({value})")
    return None


def read_request(protocol: str, body: bytes | bytearray,
                 headers: Sequence[tuple[str, str]]) -> Query:
    """A request's :class:`Query`, either protocol."""
    if protocol == "grpc":
        return read_grpc_request(body)
    return read_http_request(body, header_length_of(headers))


def read_reply(protocol: str, body: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """A successful reply's outputs, either protocol."""
    if protocol == "grpc":
        return read_grpc_reply(body)
    return read_http_reply(body, header_length_of(headers))
