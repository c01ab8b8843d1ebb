"""The Triton Python-backend model of every generated variant (copied as ``1/model.py``).

Triton's Python stub runs with an isolated interpreter that ignores ``PYTHONPATH``, so the
directories holding our packages and their dependencies arrive in ``UNDERSTUDY_PYTHONPATH`` (set
by the Triton wrapper) and are added as site directories before anything else is imported, in
front of the base interpreter's own: a different NumPy there (2.x in pyenv's site-packages) makes
the stub return empty output tensors.

The model hands its ``config.pbtxt`` parameters to :mod:`model_repo.loaders` (a generated
network's ``weights`` and ``network_spec``, or an imported ONNX or TorchScript file with its
``format``, ``input`` and ``output`` names). It serves through the per-server runtime when
``UNDERSTUDY_RUNTIME_SOCKET`` names one, and otherwise loads the model inside the stub.
"""

from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path
from typing import Any

_BASE_PATH = list(sys.path)
for _entry in os.environ.get("UNDERSTUDY_PYTHONPATH", "").split(os.pathsep):
    if _entry:
        site.addsitedir(_entry)
sys.path[:] = [p for p in sys.path if p not in _BASE_PATH] + _BASE_PATH

import numpy as np  # noqa: E402 - only importable once the site directories are in place
import triton_python_backend_utils as pb_utils  # noqa: E402

from model_repo.loaders import load_spec  # noqa: E402
from model_repo.runtime import (  # noqa: E402
    RUNTIME_SOCKET_ENV,
    InProcessRunner,
    RuntimeClient,
)


class TritonPythonModel:
    """One model instance: a runner (runtime worker or in-process) behind Triton's batching."""

    def initialize(self, args: dict[str, Any]) -> None:
        """Load the weights; raising here makes Triton report the load as failed."""
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"]
                      for key, value in config.get("parameters", {}).items()}
        model_dir = Path(args["model_repository"])
        load = load_spec(parameters, model_dir)
        self.input_name = load.input_name
        self.output_name = load.output_name
        socket_path = os.environ.get(RUNTIME_SOCKET_ENV)
        if socket_path:
            self.runner: Any = RuntimeClient(socket_path, args["model_name"], config=config,
                                             model_dir=model_dir)
        else:
            self.runner = InProcessRunner(load=load)

    def execute(self, requests: list[Any]) -> list[Any]:
        """Run all requests of a dynamic batch as one forward pass, then split the logits."""
        images = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy()
                  for r in requests]
        sizes = [batch.shape[0] for batch in images]
        try:
            outputs = self.runner.infer_outputs(np.concatenate(images, axis=0))
        except Exception as exc:  # noqa: BLE001 - report per request, keep the instance alive
            error = pb_utils.TritonError(f"inference failed: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        # The model's output, then the extra outputs (model_repo.early_exit), if any.
        names = [self.output_name] + [name for name, _ in self.runner.extras]
        responses = []
        start = 0
        for size in sizes:
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(array[start:start + size]))
                       for name, array in zip(names, outputs, strict=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += size
        return responses

    def finalize(self) -> None:
        """Release the worker so its memory is freed with the unload."""
        self.runner.close()
