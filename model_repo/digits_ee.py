"""A dynamic family: early-exit classifiers of scikit-learn's digits (``digits_ee``).

Each variant is an :class:`~model_repo.early_exit_net.EarlyExitNet`: wide convolution blocks at
the digits' 8 x 8 resolution, an exit head after each. A request leaves at the first exit whose
softmax confidence reaches that exit's threshold, so its execution time depends on the input:
an easy digit pays one block, a hard one all of them. The thresholds are calibrated on a
validation split carved out of the training set so that the exit mix is spread (a target
fraction of requests per exit, ``VariantPlan.exit_mix``); accuracy and the exit mix are then
measured on the held-out split the ``digits`` family uses.

:func:`train_early_exit` trains every variant (all exits jointly, the sum of their
cross-entropies), calibrates it, exports it as TorchScript (``torch.jit.script``: the exits are
data-dependent control flow) and writes a family manifest (``digits_ee.yaml``) that
``understudy models import`` takes, with the evaluation set. Served by the per-server runtime,
a variant answers three outputs per request: ``logits`` (10 FP32, as the digits family),
``exit_index`` (INT32, the exit taken, 0-based) and ``exec_us`` (FP32, the runtime's measure of
the request's own execution time, ``model_repo.early_exit``). The record (``training.json``)
holds, per variant, the thresholds, the held-out top-1 overall and per exit, and the exit mix.

Training is seeded and single-threaded; the result is cached in its output folder, keyed by
this file's and the network's sources and torch's version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from model_repo.digits import EVALUATION_NAME, INPUT_NAME, OUTPUT_NAME, SEED, load_split
from model_repo.early_exit import EXEC_TIME_OUTPUT, EXIT_OUTPUT

logger = logging.getLogger(__name__)

FAMILY = "digits_ee"
MANIFEST_NAME = "digits_ee.yaml"
STAMP_NAME = "training.json"
MAX_BATCH_SIZE = 8
VALIDATION = 0.2
"""Share of the training split kept aside to calibrate the exit thresholds."""
BATCH = 64


@dataclass(frozen=True)
class VariantPlan:
    """How one early-exit variant is built, trained and calibrated."""

    name: str
    channels: int
    stages: int
    convs: int
    """Convolutions per block."""
    epochs: int
    learning_rate: float
    exit_mix: tuple[float, ...]
    """Target share of the validation requests leaving at each exit (sums to 1)."""


VARIANTS = (
    # High variance: four blocks, most requests leave after the first, a tail runs all four.
    VariantPlan("digits_ee", 160, 4, 2, 4, 0.002, (0.55, 0.2, 0.1, 0.15)),
    # Lower variance: three narrower blocks, the requests spread more evenly over the exits.
    VariantPlan("digits_ee_s", 96, 3, 2, 3, 0.002, (0.4, 0.35, 0.25)),
)


def build(plan: VariantPlan) -> Any:
    """The untrained network of a variant."""
    from model_repo.early_exit_net import EarlyExitNet

    return EarlyExitNet(plan.channels, plan.stages, plan.convs)


def train(plan: VariantPlan, x: np.ndarray, y: np.ndarray) -> Any:
    """Train every exit jointly (Adam, the sum of the exits' cross-entropies, seeded)."""
    import torch

    torch.manual_seed(SEED)
    model = build(plan)
    optimiser = torch.optim.Adam(model.parameters(), lr=plan.learning_rate)
    loss = torch.nn.CrossEntropyLoss()
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    order = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(plan.epochs):
        for batch in torch.randperm(len(inputs), generator=order).split(BATCH):
            optimiser.zero_grad()
            outputs = model.all_exits(inputs[batch])
            sum(loss(out, labels[batch]) for out in outputs).backward()
            optimiser.step()
    return model.eval()


def exit_probabilities(model: Any, x: np.ndarray) -> list[np.ndarray]:
    """Every exit's softmax probabilities (N x 10 each) for ``x``."""
    import torch

    with torch.inference_mode():
        return [torch.softmax(out, dim=1).numpy() for out in model.all_exits(torch.from_numpy(x))]


def calibrate(probabilities: list[np.ndarray], mix: tuple[float, ...]) -> list[float]:
    """Thresholds so that about ``mix[i]`` of these inputs leave at exit ``i``.

    At each exit, the inputs still inside are ranked by confidence (their largest class
    probability); the threshold is the confidence of the one that makes the wanted share of
    them leave: ``mix[i] / sum(mix[i:])`` of those remaining. The last exit takes everyone
    (threshold 0).
    """
    if len(mix) != len(probabilities) or abs(sum(mix) - 1.0) > 1e-6:
        raise ValueError("one share per exit, summing to 1")
    inside = np.ones(len(probabilities[0]), dtype=bool)
    thresholds = []
    for index, probs in enumerate(probabilities[:-1]):
        confidence = probs.max(axis=1)
        remaining = confidence[inside]
        share = mix[index] / sum(mix[index:])
        leaving = int(round(share * len(remaining)))
        if leaving <= 0 or len(remaining) == 0:
            threshold = 1.0 + 1e-6  # nobody leaves here
        else:
            threshold = float(np.sort(remaining)[::-1][leaving - 1])
        thresholds.append(threshold)
        inside &= confidence < threshold
    return [*thresholds, 0.0]


def evaluate(model: Any, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Held-out figures: top-1 with the exits, each exit's own top-1, the exit mix."""
    import torch

    with torch.inference_mode():
        logits, exits = model(torch.from_numpy(x))
    predicted, exits = logits.argmax(dim=1).numpy(), exits.numpy()
    per_exit = [float((p.argmax(axis=1) == y).mean()) for p in exit_probabilities(model, x)]
    taken = [exits == i for i in range(len(per_exit))]
    return {
        "top1": float((predicted == y).mean()),
        "top1_per_exit_head": [round(v, 4) for v in per_exit],
        "exit_fractions": [round(float(mask.mean()), 4) for mask in taken],
        "top1_of_leavers": [round(float((predicted[m] == y[m]).mean()), 4) if m.any() else None
                            for m in taken],
    }


def export(model: Any, out_dir: Path, name: str) -> Path:
    """Write ``<name>.pt``: the scripted network (data-dependent exits kept)."""
    import torch

    path = out_dir / f"{name}.pt"
    with warnings.catch_warnings():
        # TorchScript is deprecated in favour of torch.export, which does not keep
        # data-dependent control flow; the per-server runtime loads TorchScript.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(model).save(str(path))
    return path


def cache_key() -> str:
    """Changes when this training code, the network or torch changes."""
    import torch

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((Path(__file__).parent / "early_exit_net.py").read_bytes())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def _cached(out_dir: Path, key: str) -> dict[str, Any] | None:
    try:
        stamp = json.loads((out_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = [out_dir / MANIFEST_NAME, out_dir / EVALUATION_NAME]
    files += [out_dir / f"{v.name}.pt" for v in VARIANTS]
    if stamp.get("key") == key and all(path.is_file() for path in files):
        return dict(stamp)
    return None


def _validation_split(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    from sklearn.model_selection import train_test_split

    fit_x, val_x, fit_y, val_y = train_test_split(x, y, test_size=VALIDATION, random_state=SEED,
                                                  stratify=y)
    return fit_x, fit_y, val_x, val_y


def train_early_exit(out_dir: Path, force: bool = False,
                     epochs: int | None = None) -> dict[str, Any]:
    """Train, calibrate, evaluate and export every variant into ``out_dir`` (cached).

    ``epochs`` replaces every variant's own (the cache tells them apart): tests that need the
    family's structure (its exits, their times) rather than its best accuracy train it
    shorter. Returns the training record (``training.json``).
    """
    import torch

    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be at least 1, not {epochs}")
    plans = VARIANTS if epochs is None else tuple(
        replace(plan, epochs=epochs) for plan in VARIANTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key() + ("" if epochs is None else f"-epochs{epochs}")
    cached = None if force else _cached(out_dir, key)
    if cached is not None:
        logger.info("%s family already trained in %s", FAMILY, out_dir)
        return cached
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights on every machine, whatever its cores
    try:
        x_train, y_train, x_test, y_test = load_split()
        fit_x, fit_y, val_x, val_y = _validation_split(x_train, y_train)
        np.savez_compressed(out_dir / EVALUATION_NAME, inputs=x_test, labels=y_test)
        record: dict[str, Any] = {"key": key, "family": FAMILY, "dynamic": "early_exit",
                                  "held_out": len(y_test), "trained": len(fit_y),
                                  "validation": len(val_y), "variants": {}}
        for plan in plans:
            started = time.perf_counter()
            model = train(plan, fit_x, fit_y)
            thresholds = calibrate(exit_probabilities(model, val_x), plan.exit_mix)
            model.set_thresholds(thresholds)
            export(model, out_dir, plan.name)
            record["variants"][plan.name] = {
                **evaluate(model, x_test, y_test), "format": "torchscript",
                "exits": plan.stages, "target_exit_mix": list(plan.exit_mix),
                "thresholds": [round(t, 6) for t in thresholds],
                "parameters": sum(p.numel() for p in model.parameters()),
                "train_s": round(time.perf_counter() - started, 2)}
            logger.info("trained %s: top-1 %.4f, exits %s", plan.name,
                        record["variants"][plan.name]["top1"],
                        record["variants"][plan.name]["exit_fractions"])
    finally:
        torch.set_num_threads(threads)
    (out_dir / MANIFEST_NAME).write_text(family_manifest(record), encoding="utf-8")
    (out_dir / STAMP_NAME).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
    return record


def family_manifest(record: dict[str, Any] | None = None) -> str:
    """The ``digits_ee.yaml`` that ``understudy models import`` takes.

    With the training ``record``, its header says, per variant, the thresholds and the exit
    mix and top-1 measured on the held-out split (the manifest's schema has no field for them:
    the ``exit_index`` and ``exec_us`` outputs are what mark a variant as dynamic).
    """
    lines = [
        f"# The {FAMILY} family (early exits: a dynamic model), written by",
        "# `understudy models train-early-exit`.",
    ]
    for name, variant in (record or {}).get("variants", {}).items():
        lines.append(f"# {name}: thresholds {variant['thresholds']}, held-out exit mix "
                     f"{variant['exit_fractions']}, top-1 {variant['top1']:.4f}")
    lines += [
        f"family: {FAMILY}",
        f"max_batch_size: {MAX_BATCH_SIZE}",
        f"inputs: [{{name: {INPUT_NAME}, data_type: FP32, dims: [1, 8, 8]}}]",
        f"outputs: [{{name: {OUTPUT_NAME}, data_type: FP32, dims: [10]}},",
        f"          {{name: {EXIT_OUTPUT}, data_type: INT32, dims: [1]}},",
        f"          {{name: {EXEC_TIME_OUTPUT}, data_type: FP32, dims: [1]}}]",
        f"evaluation: {{path: {EVALUATION_NAME}, inputs: inputs, labels: labels}}",
        "variants:",
    ]
    lines += [f"  - {{name: {v.name}, model: {v.name}.pt}}" for v in VARIANTS]
    return "\n".join(lines) + "\n"
