"""The real family that ships with the project: digit classifiers trained on scikit-learn's digits.

scikit-learn ships the UCI handwritten digits (1797 images of 8 x 8 pixels, 10 classes) inside
the package, so nothing is downloaded. :func:`train_digits` trains four variants of clearly
different size, latency and accuracy, from a tiny MLP to a wide CNN, on a fixed 75 % split,
measures each one's top-1 on the held-out 25 %, exports each to ONNX and TorchScript, and writes
a family manifest (``digits.yaml``) that ``understudy models import`` takes: the first three
variants as ONNX files, the widest as TorchScript (both formats are served by the per-server
runtime), with the held-out split as the evaluation set (``evaluation.npz``).

Inputs are float32 ``N x 1 x 8 x 8`` with pixel values scaled to 0..1 (the data set's 0..16
divided by 16); the output is ``N x 10`` logits; tensors are named ``image`` and ``logits``, as
the generated families' are, so the SDK and the gateway send them unchanged.

Training is seeded and single-threaded, so a machine gets the same weights every time; the
result is cached in its output folder, keyed by this file's contents and torch's version
(``understudy models build`` trains only the first time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

FAMILY = "digits"
MANIFEST_NAME = "digits.yaml"
EVALUATION_NAME = "evaluation.npz"
STAMP_NAME = "training.json"
SEED = 0
HELD_OUT = 0.25
MAX_BATCH_SIZE = 8
INPUT_NAME = "image"
OUTPUT_NAME = "logits"
PIXEL_SCALE = 16.0


@dataclass(frozen=True)
class VariantPlan:
    """How one variant is built and trained."""

    name: str
    kind: str
    """``mlp`` or ``cnn``."""
    widths: tuple[int, ...]
    """Hidden widths (mlp) or conv channels then the dense width (cnn)."""
    epochs: int
    learning_rate: float
    export: str
    """The format the family manifest lists it as: ``onnx`` or ``torchscript``."""


VARIANTS = (
    VariantPlan("digits_mlp_xs", "mlp", (6,), 60, 0.01, "onnx"),
    VariantPlan("digits_mlp", "mlp", (128, 128), 40, 0.002, "onnx"),
    VariantPlan("digits_cnn", "cnn", (16, 32, 64), 25, 0.002, "onnx"),
    VariantPlan("digits_cnn_xl", "cnn", (32, 64, 128, 256), 15, 0.002, "torchscript"),
)


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed train / held-out split: inputs N x 1 x 8 x 8 float32 in 0..1, int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (data.images / PIXEL_SCALE).astype(np.float32)[:, None, :, :]
    labels = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=HELD_OUT, random_state=SEED, stratify=labels)
    return x_train, y_train, x_test, y_test


def build(plan: VariantPlan) -> Any:
    """The untrained torch module of a variant."""
    from torch import nn

    layers: list[nn.Module] = []
    if plan.kind == "mlp":
        layers.append(nn.Flatten())
        width = 64
        for hidden in plan.widths:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)
    *channels, dense = plan.widths
    previous = 1
    for index, out in enumerate(channels):
        layers += [nn.Conv2d(previous, out, 3, padding=1), nn.ReLU()]
        if index == len(channels) - 1:
            layers.append(nn.MaxPool2d(2))
        previous = out
    layers += [nn.Flatten(), nn.Linear(previous * 16, dense), nn.ReLU(), nn.Linear(dense, 10)]
    return nn.Sequential(*layers)


def train(plan: VariantPlan, x: np.ndarray, y: np.ndarray) -> Any:
    """Train one variant (Adam, cross-entropy, mini-batches of 64, seeded)."""
    import torch

    torch.manual_seed(SEED)
    model = build(plan)
    optimiser = torch.optim.Adam(model.parameters(), lr=plan.learning_rate)
    loss = torch.nn.CrossEntropyLoss()
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    order = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(plan.epochs):
        for batch in torch.randperm(len(inputs), generator=order).split(64):
            optimiser.zero_grad()
            loss(model(inputs[batch]), labels[batch]).backward()
            optimiser.step()
    return model.eval()


def top1(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of a torch module on a set."""
    import torch

    with torch.inference_mode():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def export(model: Any, out_dir: Path, name: str) -> tuple[Path, Path]:
    """Write ``<name>.onnx`` (batch dimension dynamic) and ``<name>.pt`` (TorchScript)."""
    import torch

    example = torch.zeros(1, 1, 8, 8)
    onnx_path, script_path = out_dir / f"{name}.onnx", out_dir / f"{name}.pt"
    with warnings.catch_warnings():
        # The TorchScript-based exporter is deprecated in favour of one that needs onnxscript;
        # these plain feed-forward networks export the same with either.
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(onnx_path), input_names=[INPUT_NAME],
                          output_names=[OUTPUT_NAME], dynamo=False,
                          dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}})
        torch.jit.trace(model, example).save(str(script_path))
    return onnx_path, script_path


def cache_key() -> str:
    """Changes when this training code or torch changes."""
    import torch

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def _cached(out_dir: Path, key: str) -> dict[str, Any] | None:
    try:
        stamp = json.loads((out_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = [out_dir / MANIFEST_NAME, out_dir / EVALUATION_NAME]
    files += [out_dir / f"{v.name}.{ext}" for v in VARIANTS for ext in ("onnx", "pt")]
    if stamp.get("key") == key and all(path.is_file() for path in files):
        return dict(stamp)
    return None


def train_digits(out_dir: Path, force: bool = False) -> dict[str, Any]:
    """Train, evaluate and export every variant into ``out_dir`` (cached); the training record.

    The record (``training.json``) holds each variant's held-out top-1, parameter count and
    training time.
    """
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key()
    cached = None if force else _cached(out_dir, key)
    if cached is not None:
        logger.info("digits family already trained in %s", out_dir)
        return cached
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights on every machine, whatever its cores
    try:
        x_train, y_train, x_test, y_test = load_split()
        np.savez_compressed(out_dir / EVALUATION_NAME, inputs=x_test, labels=y_test)
        record: dict[str, Any] = {"key": key, "family": FAMILY, "held_out": len(y_test),
                                  "trained": len(y_train), "variants": {}}
        for plan in VARIANTS:
            started = time.perf_counter()
            model = train(plan, x_train, y_train)
            export(model, out_dir, plan.name)
            record["variants"][plan.name] = {
                "top1": top1(model, x_test, y_test), "format": plan.export,
                "parameters": sum(p.numel() for p in model.parameters()),
                "train_s": round(time.perf_counter() - started, 2)}
            logger.info("trained %s: top-1 %.4f", plan.name,
                        record["variants"][plan.name]["top1"])
    finally:
        torch.set_num_threads(threads)
    (out_dir / MANIFEST_NAME).write_text(family_manifest(), encoding="utf-8")
    (out_dir / STAMP_NAME).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
    return record


def family_manifest() -> str:
    """The ``digits.yaml`` that ``understudy models import`` takes."""
    lines = [
        f"# The {FAMILY} family, written by `understudy models train-digits`.",
        f"family: {FAMILY}",
        f"max_batch_size: {MAX_BATCH_SIZE}",
        f"inputs: [{{name: {INPUT_NAME}, data_type: FP32, dims: [1, 8, 8]}}]",
        f"outputs: [{{name: {OUTPUT_NAME}, data_type: FP32, dims: [10]}}]",
        f"evaluation: {{path: {EVALUATION_NAME}, inputs: inputs, labels: labels}}",
        "variants:",
    ]
    suffix = {"onnx": "onnx", "torchscript": "pt"}
    lines += [f"  - {{name: {v.name}, model: {v.name}.{suffix[v.export]}}}" for v in VARIANTS]
    return "\n".join(lines) + "\n"
