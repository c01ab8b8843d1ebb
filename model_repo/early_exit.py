"""Serving a dynamic (early-exit) model: the extra outputs, and each request's own time.

A model served by the per-server runtime answers one FP32 vector per item (``logits``). Two
more outputs, by these reserved names, may follow it when the model's manifest lists them:

- ``exit_index`` (INT32, one per item): the exit the item left at, 0-based; given by a staged
  model (:func:`is_staged`), 0 for any other model.
- ``exec_us`` (FP32, one per item): the item's own execution time in the runtime worker, in
  microseconds, from the start of its batch's forward pass to the moment its answer was known.
  For a staged model that is the end of the stage it left at; for any other model, the whole
  forward pass. A batch's time is its slowest member's (Orloj's model of a batch).

A *staged* model (a TorchScript :class:`~model_repo.early_exit_net.EarlyExitNet`) exposes
``num_exits`` and ``stage(index, x) -> (features, logits, leave)``; :func:`run_staged` runs the
stages in turn on the members still inside, so a member that left computes no later block,
and stamps each member's time when it leaves. It runs the same ``stage`` the model's own
``forward`` chains, so the answers are the model's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EXIT_OUTPUT = "exit_index"
EXEC_TIME_OUTPUT = "exec_us"
EXTRA_OUTPUTS = {EXIT_OUTPUT: "INT32", EXEC_TIME_OUTPUT: "FP32"}
"""The reserved extra outputs and their Triton data types (each one value per item)."""
NUMPY_TYPES = {"INT32": np.int32, "FP32": np.float32}


@dataclass
class StagedResult:
    """What one batch through a staged model gave."""

    logits: np.ndarray
    exits: np.ndarray
    """int32, one per item."""
    exec_us: np.ndarray
    """float32, one per item: its time from the batch's start to its exit."""
    stage_items: list[int] = field(default_factory=list)
    """How many items each stage that ran computed (a stage nobody reached is absent)."""


def is_staged(module: Any) -> bool:
    """Whether a loaded (TorchScript) module is an early-exit model the runtime can stage."""
    return hasattr(module, "stage") and isinstance(getattr(module, "num_exits", None), int)


def run_staged(module: Any, batch: Any,
               clock: Callable[[], float] = time.perf_counter) -> StagedResult:
    """Run ``batch`` (a torch tensor) stage by stage; each member stops at its exit."""
    import torch

    started = clock()
    n = int(batch.shape[0])
    logits: Any = None
    exits = np.full(n, module.num_exits - 1, dtype=np.int32)
    exec_us = np.zeros(n, dtype=np.float32)
    members = torch.arange(n)
    features = batch
    stage_items = []
    with torch.inference_mode():
        for index in range(module.num_exits):
            if members.shape[0] == 0:
                break
            stage_items.append(int(members.shape[0]))
            features, out, leave = module.stage(index, features)
            left_at = (clock() - started) * 1e6
            if logits is None:
                logits = torch.zeros((n, out.shape[1]), dtype=torch.float32)
            leave_here = leave.cpu()
            leaving = members[leave_here]
            logits[leaving] = out[leave].float().cpu()
            exits[leaving.numpy()] = index
            exec_us[leaving.numpy()] = left_at
            features = features[torch.logical_not(leave)]
            members = members[torch.logical_not(leave_here)]
    result = logits.numpy() if logits is not None else np.zeros((0, 0), dtype=np.float32)
    return StagedResult(logits=result, exits=exits, exec_us=exec_us, stage_items=stage_items)


def extra_output_type(name: str) -> str:
    """The Triton data type of a reserved extra output; ValueError for any other name."""
    try:
        return EXTRA_OUTPUTS[name]
    except KeyError:
        raise ValueError(f"unknown extra output {name!r} (the runtime produces "
                         f"{', '.join(sorted(EXTRA_OUTPUTS))})") from None
