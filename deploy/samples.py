"""Real inputs with their labels, for the clients of an imported family's apps.

An imported family with an evaluation set keeps a copy of it in the artifact store
(``STORE/<family>/evaluation.npz``, ``model_repo.imported``): the digits family's is its
held-out split. A client of one of its apps sends those inputs one at a time, in a seeded
order, and checks each answer's top-1 against the label; the records carry ``label``,
``predicted`` and ``correct``, and :func:`prediction_summary` counts them per variant. Apps of
a synthetic family have no labels: their clients send random images and check nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

EVALUATION_FILE = "evaluation.npz"
"""The store's copy of a family's evaluation set (``model_repo.imported.EVALUATION_FILE``)."""


class LabelledSamples:
    """An endless, seeded walk over an evaluation set: one input (batch of 1) and its label."""

    def __init__(self, inputs: np.ndarray, labels: np.ndarray, seed: int = 0) -> None:
        if len(inputs) == 0 or len(inputs) != len(labels):
            raise ValueError("need one label per input, and at least one")
        self.inputs = np.ascontiguousarray(inputs, dtype=np.float32)
        self.labels = np.asarray(labels, dtype=np.int64)
        self._order = np.random.default_rng(seed).permutation(len(self.inputs))
        self._at = 0

    @classmethod
    def from_store(cls, store: Path, family: str, seed: int = 0) -> LabelledSamples | None:
        """The family's evaluation set in ``store``; None when it has none (synthetic)."""
        path = store / family / EVALUATION_FILE
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as data:
            return cls(data["inputs"], data["labels"], seed)

    def __len__(self) -> int:
        return len(self.inputs)

    def next(self) -> tuple[np.ndarray, int]:
        """The next input (shape ``1 x item``) and its label."""
        index = int(self._order[self._at % len(self._order)])
        self._at += 1
        return self.inputs[index:index + 1], int(self.labels[index])


def check(output: np.ndarray, label: int) -> dict[str, Any]:
    """The fields a request record gets: ``label``, ``predicted`` (top-1) and ``correct``."""
    predicted = int(np.asarray(output).reshape(-1).argmax())
    return {"label": label, "predicted": predicted, "correct": predicted == label}


def prediction_summary(requests_dir: Path) -> dict[str, Any]:
    """Checked predictions in the clients' records (``*.jsonl``): overall and per variant.

    Only answered requests that carry a label count; ``top1`` is the share correct.
    """
    per_variant: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    apps = set()
    for path in sorted(requests_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "correct" not in record or not record.get("ok", True):
                continue
            apps.add(record.get("app_id"))
            counts = per_variant[str(record.get("variant"))]
            counts[0] += 1
            counts[1] += bool(record["correct"])
    checked = sum(c[0] for c in per_variant.values())
    correct = sum(c[1] for c in per_variant.values())
    return {
        "apps": len(apps), "predictions_checked": checked, "correct": correct,
        "top1": correct / checked if checked else None,
        "by_variant": {v: {"checked": c[0], "correct": c[1], "top1": c[1] / c[0]}
                       for v, c in sorted(per_variant.items())},
    }
