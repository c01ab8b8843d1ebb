"""A user's model family: the manifest that lists its variants, read and checked.

A family manifest (YAML or JSON) names the family, its variants and, optionally, an evaluation
set and the family's input/output signature::

    family: digits
    max_batch_size: 8
    inputs:  [{name: image, data_type: FP32, dims: [1, 8, 8]}]   # optional for ONNX variants
    outputs: [{name: logits, data_type: FP32, dims: [10]}]
    evaluation: {path: eval.npz, inputs: inputs, labels: labels}  # optional
    variants:
      - {name: digits_mlp, model: mlp.onnx}                 # an ONNX file
      - {name: digits_cnn, model: cnn.pt}                   # a TorchScript file
      - {name: digits_big, model: big/, accuracy: 0.98}     # a Triton model directory

Paths are relative to the manifest's folder. A variant's ``accuracy`` (top-1, 0 to 1) is a
declared figure, used only when no evaluation set is given. Every error names the manifest
file and the field (``variants[2].model``), so a user can fix it without reading code.

Checked here, before anything is loaded on a Triton: the files exist, the format is known (from
``format`` or the file's suffix; a directory's ``config.pbtxt`` names its backend), every
variant has the same input and output signature (read from ONNX files and Triton configs,
declared in the manifest for TorchScript, which records none), the models the per-server
runtime wraps have one FP32 input and one FP32 output, and the evaluation set matches the input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model_repo.early_exit import EXTRA_OUTPUTS
from understudy.wire.artifacts import TensorSpec
from understudy.wire.bounds import check_name

VariantFormat = Literal["onnx", "torchscript", "triton"]
ONNX_SUFFIXES = (".onnx",)
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".torchscript", ".ts")
WRAPPED_BACKENDS = {"onnxruntime": "onnx", "pytorch": "torchscript", "libtorch": "torchscript"}
"""Triton backends whose one model file the per-server runtime can serve (wrapped)."""
WRAPPED_PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}
AS_IS_BACKENDS = ("python", "tensorrt", "openvino", "tensorflow", "fil", "dali")
"""Triton backends whose directories are served as they are, by a Triton that has them."""
WRAPPED_FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}
"""Triton's default model file name, per format, in a version folder."""

_ONNX_TYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
               10: "FP16", 11: "FP64"}


class ManifestError(ValueError):
    """A family manifest is unreadable or wrong; the message names the file and the field."""

    def __init__(self, path: Path, field: str, message: str) -> None:
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")
        self.path = path
        self.field = field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvaluationEntry(_Strict):
    """Where the evaluation set is: an ``.npz`` file and its two arrays' keys."""

    path: str = Field(min_length=1)
    inputs: str = "inputs"
    labels: str = "labels"


class VariantEntry(_Strict):
    """One variant as the manifest lists it."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    format: VariantFormat | None = None
    accuracy: float | None = Field(None, gt=0, le=1)
    """Declared top-1 accuracy, 0 to 1 (recorded as ``declared``)."""


class FamilyManifestDocument(_Strict):
    """The whole manifest file."""

    family: str = Field(min_length=1)
    max_batch_size: int = Field(8, ge=1, le=1024)
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    evaluation: EvaluationEntry | None = None
    variants: tuple[VariantEntry, ...] = Field(min_length=1)


@dataclass(frozen=True)
class ImportVariant:
    """A variant resolved on disk: what to wrap or copy, and its signature."""

    name: str
    format: VariantFormat
    path: Path
    """The model file (onnx, torchscript) or the Triton model directory (triton)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    declared_accuracy: float | None
    backend: str | None = None
    """The backend a ``triton`` directory needs."""


@dataclass(frozen=True)
class EvaluationSet:
    """The evaluation set's file and keys (arrays are loaded when measuring)."""

    path: Path
    inputs_key: str
    labels_key: str
    count: int


@dataclass(frozen=True)
class ImportFamily:
    """A checked family manifest."""

    manifest_path: Path
    family: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    variants: tuple[ImportVariant, ...]
    evaluation: EvaluationSet | None


def read_document(path: Path) -> dict[str, Any]:
    """The manifest's raw mapping (YAML for ``.yaml``/``.yml``, else JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(path, "", f"cannot read the manifest: {exc.strerror or exc}") from exc
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - YAML and JSON parsers raise their own types
        raise ManifestError(path, "", f"not valid {path.suffix.lstrip('.') or 'JSON'}: "
                            f"{exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(path, "", "the manifest must be a mapping with 'family' and "
                            "'variants'")
    return raw


def field_name(location: tuple[int | str, ...]) -> str:
    """``("variants", 2, "model")`` -> ``variants[2].model``."""
    out = ""
    for part in location:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_family_manifest(path: str | Path) -> ImportFamily:
    """Read and check a family manifest; ManifestError naming the file and field if wrong."""
    path = Path(path)
    raw = read_document(path)
    try:
        doc = FamilyManifestDocument.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ManifestError(path, field_name(tuple(first["loc"])), first["msg"]) from exc
    _check_names(path, doc)
    base = path.resolve().parent
    variants = tuple(_resolve_variant(path, base, index, entry, doc)
                     for index, entry in enumerate(doc.variants))
    inputs, outputs = _family_signature(path, doc, variants)
    evaluation = (_check_evaluation(path, base, doc.evaluation, inputs)
                  if doc.evaluation is not None else None)
    if evaluation is None:
        undeclared = [i for i, v in enumerate(variants) if v.declared_accuracy is None]
        if undeclared:
            raise ManifestError(path, f"variants[{undeclared[0]}].accuracy",
                                "required when the manifest gives no evaluation set")
    return ImportFamily(manifest_path=path, family=doc.family,
                        max_batch_size=doc.max_batch_size, inputs=inputs, outputs=outputs,
                        variants=variants, evaluation=evaluation)


def _check_names(path: Path, doc: FamilyManifestDocument) -> None:
    try:
        check_name(doc.family, "family")
    except ValueError as exc:
        raise ManifestError(path, "family", str(exc)) from exc
    seen: dict[str, int] = {}
    for index, entry in enumerate(doc.variants):
        try:
            check_name(entry.name, "variant name")
        except ValueError as exc:
            raise ManifestError(path, f"variants[{index}].name", str(exc)) from exc
        if entry.name in seen:
            raise ManifestError(path, f"variants[{index}].name",
                                f"{entry.name!r} is also variants[{seen[entry.name]}]")
        seen[entry.name] = index


def _resolve_variant(path: Path, base: Path, index: int, entry: VariantEntry,
                     doc: FamilyManifestDocument) -> ImportVariant:
    where = f"variants[{index}]"
    target = (base / entry.model).resolve()
    if not target.exists():
        raise ManifestError(path, f"{where}.model", f"no such file or directory: {target}")
    backend: str | None = None
    if target.is_dir():
        fmt, target, backend = _resolve_directory(path, f"{where}.model", target, entry.format)
    else:
        fmt = entry.format or _format_of_suffix(path, f"{where}.model", target)
        if fmt == "triton":
            raise ManifestError(path, f"{where}.format",
                                "'triton' needs a Triton model directory, not a file")
    inputs, outputs = _signature(path, where, fmt, target, doc)
    if fmt in ("onnx", "torchscript"):
        _check_wrappable(path, where, inputs, outputs)
    return ImportVariant(name=entry.name, format=fmt, path=target, inputs=inputs,
                         outputs=outputs, declared_accuracy=entry.accuracy, backend=backend)


def _format_of_suffix(path: Path, field: str, target: Path) -> VariantFormat:
    suffix = target.suffix.lower()
    if suffix in ONNX_SUFFIXES:
        return "onnx"
    if suffix in TORCHSCRIPT_SUFFIXES:
        return "torchscript"
    raise ManifestError(path, field, f"cannot tell the format of {target.name!r} (ONNX: "
                        f"{', '.join(ONNX_SUFFIXES)}; TorchScript: "
                        f"{', '.join(TORCHSCRIPT_SUFFIXES)}); set 'format'")


def _resolve_directory(path: Path, field: str, directory: Path, declared: str | None,
                       ) -> tuple[VariantFormat, Path, str | None]:
    """A Triton model directory: wrapped (its model file) or served as it is."""
    config_path = directory / "config.pbtxt"
    if not config_path.is_file():
        raise ManifestError(path, field, f"{directory} is a directory without config.pbtxt "
                            "(a Triton model directory needs one)")
    config = parse_pbtxt_config(config_path.read_text(encoding="utf-8", errors="replace"))
    backend = config.get("backend") or WRAPPED_PLATFORMS.get(config.get("platform", ""), "")
    if not backend:
        raise ManifestError(path, field, f"{config_path} names no backend or platform")
    if backend in WRAPPED_BACKENDS and declared != "triton":
        fmt: VariantFormat = WRAPPED_BACKENDS[backend]  # type: ignore[assignment]
        default = config.get("default_model_filename") or WRAPPED_FILES[fmt]
        versions = sorted((p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()),
                          key=lambda p: int(p.name))
        model_file = next((v / default for v in reversed(versions) if (v / default).is_file()),
                          None)
        if model_file is None:
            raise ManifestError(path, field, f"{directory} has no version folder holding "
                                f"{default!r} (backend {backend!r})")
        return fmt, model_file, None
    if backend not in AS_IS_BACKENDS and backend not in WRAPPED_BACKENDS:
        known = sorted({*WRAPPED_BACKENDS, *AS_IS_BACKENDS})
        raise ManifestError(path, field, f"unknown backend {backend!r} in {config_path} "
                            f"(known: {', '.join(known)})")
    return "triton", directory, backend


Signature = tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]


def _signature(path: Path, where: str, fmt: VariantFormat, target: Path,
               doc: FamilyManifestDocument) -> Signature:
    if fmt == "onnx":
        return onnx_signature(path, f"{where}.model", target)
    if fmt == "triton":
        config = parse_pbtxt_config((target / "config.pbtxt").read_text(encoding="utf-8",
                                                                         errors="replace"))
        return tuple(config.get("input", ())), tuple(config.get("output", ()))
    if doc.inputs is None or doc.outputs is None:
        raise ManifestError(path, "inputs" if doc.inputs is None else "outputs",
                            f"required: {where} is TorchScript, which records no signature")
    return doc.inputs, doc.outputs


def _check_wrappable(path: Path, where: str, inputs: tuple[TensorSpec, ...],
                     outputs: tuple[TensorSpec, ...]) -> None:
    """The per-server runtime serves one FP32 tensor in and one FP32 tensor out.

    The output may be followed by the runtime's reserved extra outputs (``exit_index`` INT32,
    ``exec_us`` FP32, dims [1]: ``model_repo.early_exit``).
    """
    for kind, tensors in (("inputs", inputs), ("outputs", outputs[:1])):
        if len(tensors) != 1 or tensors[0].data_type != "FP32":
            shown = ", ".join(f"{t.name}:{t.data_type}" for t in tensors) or "none"
            raise ManifestError(path, f"{where}.model", f"the runtime serves models with one "
                                f"FP32 {kind[:-1]}; this one has {shown}")
    for extra in outputs[1:]:
        if EXTRA_OUTPUTS.get(extra.name) != extra.data_type or list(extra.dims) != [1]:
            known = ", ".join(f"{name} {kind} [1]" for name, kind in EXTRA_OUTPUTS.items())
            raise ManifestError(path, f"{where}.model", f"output {extra.name} "
                                f"({extra.data_type} {list(extra.dims)}) is not one the runtime "
                                f"adds after the model's (it adds {known})")
    if len(outputs[0].dims) != 1:
        raise ManifestError(path, f"{where}.model", f"the runtime serves one vector per item "
                            f"(N x K); output {outputs[0].name} has dims {list(outputs[0].dims)}")


def _family_signature(path: Path, doc: FamilyManifestDocument,
                      variants: tuple[ImportVariant, ...],
                      ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The one signature every variant shares (declared, else the first variant's)."""
    for kind in ("inputs", "outputs"):
        declared = getattr(doc, kind)
        reference = declared if declared is not None else getattr(variants[0], kind)
        origin = kind if declared is not None else f"variants[0] ({variants[0].name})"
        for index, variant in enumerate(variants):
            mine = getattr(variant, kind)
            if not _same_signature(mine, reference):
                raise ManifestError(
                    path, f"variants[{index}].model",
                    f"{kind} of {variant.name} ({_show(mine)}) differ from {origin} "
                    f"({_show(reference)}); every variant of a family takes the same tensors")
    inputs = doc.inputs if doc.inputs is not None else variants[0].inputs
    outputs = doc.outputs if doc.outputs is not None else variants[0].outputs
    return tuple(inputs), tuple(outputs)


def _same_signature(a: tuple[TensorSpec, ...], b: tuple[TensorSpec, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.name != y.name or x.data_type != y.data_type or len(x.dims) != len(y.dims):
            return False
        # -1 (any size) matches every size.
        if any(p != q and -1 not in (p, q) for p, q in zip(x.dims, y.dims, strict=True)):
            return False
    return True


def _show(tensors: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{t.name} {t.data_type} {list(t.dims)}" for t in tensors) or "none"


def _check_evaluation(path: Path, base: Path, entry: EvaluationEntry,
                      inputs: tuple[TensorSpec, ...]) -> EvaluationSet:
    import numpy as np

    target = (base / entry.path).resolve()
    if not target.is_file():
        raise ManifestError(path, "evaluation.path", f"no such file: {target}")
    try:
        with np.load(target, allow_pickle=False) as data:
            keys = set(data.files)
            for field in ("inputs", "labels"):
                key = getattr(entry, field)
                if key not in keys:
                    raise ManifestError(path, f"evaluation.{field}",
                                        f"{target.name} has no array {key!r} (it has "
                                        f"{', '.join(sorted(keys)) or 'none'})")
            x_shape = data[entry.inputs].shape
            y_shape = data[entry.labels].shape
    except (OSError, ValueError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(path, "evaluation.path", f"cannot read {target} as .npz: "
                            f"{exc}") from exc
    if len(inputs) != 1:
        raise ManifestError(path, "evaluation", "an evaluation set needs a model with one input")
    dims = inputs[0].dims
    item = tuple(x_shape[1:])
    if len(item) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, item, strict=True)):
        raise ManifestError(path, "evaluation.inputs", f"items of shape {list(item)} do not "
                            f"match input {inputs[0].name} {list(dims)}")
    if len(y_shape) != 1 or y_shape[0] != x_shape[0] or x_shape[0] == 0:
        raise ManifestError(path, "evaluation.labels", f"need one label per input: "
                            f"{x_shape[0]} inputs, labels of shape {list(y_shape)}")
    return EvaluationSet(path=target, inputs_key=entry.inputs, labels_key=entry.labels,
                         count=int(x_shape[0]))


def onnx_signature(path: Path, field: str, model: Path,
                   ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """An ONNX file's graph inputs and outputs, the first (batch) dimension dropped."""
    try:
        import onnx
    except ImportError as exc:
        raise ManifestError(path, field, "reading ONNX models needs the 'onnx' package "
                            "(pip install 'understudy-edge[server]')") from exc
    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others
        raise ManifestError(path, field, f"{model} is not a readable ONNX model: {exc}") from exc
    initializers = {i.name for i in graph.initializer}

    def spec(value: Any) -> TensorSpec:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return TensorSpec(name=value.name, data_type=_ONNX_TYPES.get(tensor.elem_type,
                                                                      f"ONNX_{tensor.elem_type}"),
                          dims=tuple(dims[1:]))

    return (tuple(spec(v) for v in graph.input if v.name not in initializers),
            tuple(spec(v) for v in graph.output))


def _top_level_blocks(text: str, key: str) -> list[str]:
    """Bodies of every top-level ``key [ {..}, {..} ]`` or ``key { .. }`` of a pbtxt."""
    bodies: list[str] = []
    depth = 0
    index = 0
    while index < len(text):
        char = text[index]
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif depth == 0 and text.startswith(key, index) and \
                (index == 0 or not (text[index - 1].isalnum() or text[index - 1] == "_")):
            rest = text[index + len(key):].lstrip(" \t\n:")
            if rest[:1] in ("[", "{"):
                start = len(text) - len(rest)
                end = _matching(text, start)
                inner = text[start + 1:end]
                bodies += _braces(inner) if text[start] == "[" else [inner]
                index = end + 1
                continue
        index += 1
    return bodies


def _matching(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (the end of the text if none)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "[{":
            depth += 1
        elif text[index] in "]}":
            depth -= 1
            if depth == 0:
                return index
    return len(text)


def _braces(text: str) -> list[str]:
    """The bodies of the ``{ .. }`` items of a list."""
    items = []
    index = text.find("{")
    while index >= 0:
        end = _matching(text, index)
        items.append(text[index + 1:end])
        index = text.find("{", end)
    return items


def parse_pbtxt_config(text: str) -> dict[str, Any]:
    """The few fields of a ``config.pbtxt`` the import needs (not a full protobuf parser).

    Top-level ``backend``, ``platform``, ``default_model_filename``, ``max_batch_size`` and
    the ``input``/``output`` tensors (name, data_type, dims).
    """
    text = re.sub(r"#[^\n]*", "", text)
    config: dict[str, Any] = {}
    for key in ("backend", "platform", "default_model_filename"):
        match = re.search(rf'(?:^|[\s}}\]]){key}\s*:\s*"([^"]*)"', text)
        if match:
            config[key] = match.group(1)
    match = re.search(r"(?:^|\s)max_batch_size\s*:\s*(\d+)", text)
    if match:
        config["max_batch_size"] = int(match.group(1))
    for kind in ("input", "output"):
        tensors = []
        for block in _top_level_blocks(text, kind):
            name = re.search(r'name\s*:\s*"([^"]*)"', block)
            data_type = re.search(r"data_type\s*:\s*TYPE_(\w+)", block)
            dims = re.search(r"dims\s*:\s*\[([^\]]*)\]", block)
            if name is None:
                continue
            tensors.append(TensorSpec(
                name=name.group(1), data_type=data_type.group(1) if data_type else "FP32",
                dims=tuple(int(d) for d in dims.group(1).replace(",", " ").split())
                if dims else ()))
        if tensors:
            config[kind] = tensors
    return config
