"""Load one model for serving: a generated network, an ONNX file or a TorchScript file.

The per-server runtime (``model_repo.runtime``) forks a worker per model; the worker calls
:func:`load_model` with what the model's ``config.pbtxt`` says (:func:`load_spec`) and then
answers each batch with :meth:`LoadedModel.infer`. Every format takes one float32 array and
returns one float32 array, which is what the Python model and the native backend pass.

``config.pbtxt`` parameters read here: ``format`` (``synthetic``, default; ``onnx``;
``torchscript``), ``weights`` (the file, relative to the model directory), ``network_spec``
(synthetic only), ``input`` / ``output`` (tensor names, default ``image`` / ``logits``),
``input_dims`` (JSON list, one item's shape, for the warm-up), ``threads`` and ``device``
(``cpu``, or ``cuda:N`` for a model placed on a GPU), ``extra_outputs`` (comma-separated
reserved names, ``exit_index`` and ``exec_us``, answered after the model's output:
``model_repo.early_exit``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_repo.early_exit import (
    EXEC_TIME_OUTPUT,
    EXIT_OUTPUT,
    NUMPY_TYPES,
    extra_output_type,
    is_staged,
    run_staged,
)
from model_repo.network import NetworkSpec, meta_network

IMPORTED_FORMATS = ("onnx", "torchscript")
DEFAULT_INPUT = "image"
DEFAULT_OUTPUT = "logits"


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how to run it."""

    weights: Path
    format: str = "synthetic"
    spec: NetworkSpec | None = None
    threads: int = 1
    input_name: str = DEFAULT_INPUT
    output_name: str = DEFAULT_OUTPUT
    input_dims: tuple[int, ...] = ()
    device: str = "cpu"
    extra_outputs: tuple[str, ...] = ()
    """Reserved outputs answered after the model's own (``model_repo.early_exit``)."""


@dataclass
class LoadReport:
    """What a worker reports once its model is ready."""

    pid: int
    read_s: float
    build_s: float
    warmup_s: float


def load_spec(parameters: dict[str, str], model_dir: Path) -> LoadSpec:
    """The load of a model whose ``config.pbtxt`` has these parameters (string values)."""
    fmt = parameters.get("format", "synthetic")
    if fmt not in ("synthetic", *IMPORTED_FORMATS):
        raise ValueError(f"unknown model format {fmt!r} in the model's parameters")
    required = ("weights", "network_spec") if fmt == "synthetic" else ("weights",)
    for key in required:
        if key not in parameters:
            raise ValueError(f"the model's config has no {key!r} parameter")
    spec = (NetworkSpec.from_dict(json.loads(parameters["network_spec"]))
            if fmt == "synthetic" else None)
    dims = tuple(int(d) for d in json.loads(parameters.get("input_dims", "[]")))
    extras = tuple(name.strip() for name in parameters.get("extra_outputs", "").split(",")
                   if name.strip())
    for name in extras:
        extra_output_type(name)  # ValueError for an unknown name
    if extras and fmt == "synthetic":
        raise ValueError("extra outputs are served for imported models only")
    if spec is not None and not dims:
        dims = (3, spec.image_side, spec.image_side)
    return LoadSpec(weights=(model_dir / parameters["weights"]).resolve(), format=fmt,
                    spec=spec, threads=int(parameters.get("threads", "1")),
                    input_name=parameters.get("input", DEFAULT_INPUT),
                    output_name=parameters.get("output", DEFAULT_OUTPUT),
                    input_dims=dims, device=parameters.get("device", "cpu"),
                    extra_outputs=extras)


class LoadedModel:
    """A model ready to serve: float32 array in, float32 array out (and the extra outputs)."""

    def __init__(self, run: Any, device: str, extra_outputs: tuple[str, ...] = (),
                 staged: Any = None) -> None:
        self._run = run
        self._staged = staged
        self.device = device
        self.extra_outputs = extra_outputs

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """The model's output for a batch (float32, batch dimension first)."""
        return self.infer_outputs(batch)[0]

    def infer_outputs(self, batch: np.ndarray) -> list[np.ndarray]:
        """The model's output, then each extra output (N x 1 of its type), for a batch."""
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        n = batch.shape[0]
        if self._staged is not None:
            result = self._staged(batch)
            primary, exits, exec_us = result.logits, result.exits, result.exec_us
        else:
            started = time.perf_counter()
            primary = self._run(batch)
            elapsed_us = (time.perf_counter() - started) * 1e6
            exits = np.zeros(n, dtype=np.int32)
            exec_us = np.full(n, elapsed_us, dtype=np.float32)
        values = {EXIT_OUTPUT: exits, EXEC_TIME_OUTPUT: exec_us}
        return [np.ascontiguousarray(primary, dtype=np.float32)] + [
            np.ascontiguousarray(values[name], dtype=NUMPY_TYPES[extra_output_type(name)])
            .reshape(n, 1) for name in self.extra_outputs]


def load_model(load: LoadSpec) -> tuple[LoadedModel, LoadReport]:
    """Read, build and warm up one model (one warm-up inference of batch 1)."""
    started = time.perf_counter()
    staged = None
    if load.format == "onnx":
        run, read_done = _onnx(load)
    elif load.format == "torchscript":
        run, read_done, staged = _torchscript(load)
    else:
        run, read_done = _synthetic(load)
    built = time.perf_counter()
    model = LoadedModel(run, load.device, load.extra_outputs, staged)
    warm = tuple(1 if d < 0 else d for d in load.input_dims)
    model.infer(np.zeros((1, *warm), dtype=np.float32))
    warmed = time.perf_counter()
    # No memory figure here: reading smaps_rollup costs ~3 ms, on every load's critical path;
    # the agent asks the runtime for it once the load has been answered (op "stats").
    return model, LoadReport(pid=os.getpid(), read_s=read_done - started,
                             build_s=built - read_done, warmup_s=warmed - built)


def _synthetic(load: LoadSpec) -> tuple[Any, float]:
    import torch

    assert load.spec is not None  # noqa: S101 - load_spec sets it for this format
    torch.set_num_threads(max(1, load.threads))
    # mmap: the weights stay file-backed pages (shared page cache, not private memory) and
    # are not copied on the load path.
    state = torch.load(load.weights, map_location="cpu", weights_only=True, mmap=True)
    read_done = time.perf_counter()
    module = meta_network(load.spec)
    module.load_state_dict(state, assign=True)
    if load.device != "cpu":
        module = module.to(load.device)  # a model placed on a GPU (KIND_GPU)
    return _torch_runner(module, load.device), read_done


def _torchscript(load: LoadSpec) -> tuple[Any, float, Any]:
    """The runner, when the read ended, and a staged runner for an early-exit model (or None)."""
    import torch

    torch.set_num_threads(max(1, load.threads))
    module = torch.jit.load(str(load.weights), map_location=load.device).eval()
    read_done = time.perf_counter()
    staged = None
    if is_staged(module):
        def staged(batch: np.ndarray) -> Any:
            return run_staged(module, torch.from_numpy(batch).to(load.device))
    return _torch_runner(module, load.device), read_done, staged


def _torch_runner(module: Any, device: str) -> Any:
    import torch

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            tensor = torch.from_numpy(batch)
            if device != "cpu":
                tensor = tensor.to(device, non_blocking=True)
            out = module(tensor)
            if isinstance(out, (tuple, list)):
                out = out[0]
            result: np.ndarray = out.float().cpu().numpy()
            return result

    return run


def _onnx(load: LoadSpec) -> tuple[Any, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, load.threads)
    options.inter_op_num_threads = 1
    providers: list[Any] = ["CPUExecutionProvider"]
    if load.device.startswith("cuda"):
        index = int(load.device.partition(":")[2] or 0)
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("the model is placed on a GPU but this onnxruntime has no "
                               "CUDAExecutionProvider (pip install onnxruntime-gpu)")
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    session = ort.InferenceSession(str(load.weights), options, providers=providers)
    read_done = time.perf_counter()
    names = {i.name for i in session.get_inputs()}
    if load.input_name not in names:
        raise ValueError(f"the ONNX model has no input {load.input_name!r} "
                         f"(it has {', '.join(sorted(names))})")
    outputs = [load.output_name]
    feed = load.input_name

    def run(batch: np.ndarray) -> np.ndarray:
        result: np.ndarray = session.run(outputs, {feed: batch})[0]
        return result

    return run, read_done


def preload_frameworks(scratch: Path) -> list[str]:
    """Load one tiny TorchScript and one tiny ONNX model in the runtime, before it forks.

    A forked worker then pays no import and no first-load set-up (TorchScript's first load
    costs about 25 ms on top of later ones, onnxruntime's import and first session some more),
    as a native framework backend of Triton pays them once per server. Sessions use one
    thread, so no thread pool exists when the runtime forks. Returns the frameworks prepared.
    """
    import torch

    found = []
    example = torch.zeros(1, 2)
    script = scratch / "warmup.ts"
    torch.jit.trace(torch.nn.Linear(2, 2).eval(), example).save(str(script))
    model, _ = load_model(LoadSpec(weights=script, format="torchscript", input_dims=(2,)))
    found.append("torchscript")
    try:
        import onnxruntime  # noqa: F401
        from onnx import TensorProto, helper, save
    except ImportError:
        return found
    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["logits"])], "warmup",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
         str(scratch / "warmup.onnx"))
    model, _ = load_model(LoadSpec(weights=scratch / "warmup.onnx", format="onnx",
                                   input_dims=(2,)))
    del model
    found.append("onnxruntime")
    return found
