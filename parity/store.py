"""Parity models into the artifact store, where the controller places them from.

The trained parity models of a family (``<out>/<name>.json`` and its files, written by
``parity.artifacts``) are written into the store as one more family, ``<family>-parity``,
through the same import path as ``understudy models import``: a family manifest is written
beside them (``<out>/<family>-parity.yaml``, each parity model with its validation A_d as its
declared accuracy) and every variant gets its store directory (manifest, artifact, Triton
configuration), so agents fetch and load a parity model as they do any variant. No profile is
measured: the controller reserves for a parity model what its deployed variant takes (the same
architecture, §4.3), and never offers it as a variant of an app.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from parity.artifacts import ParityMetadata, read_metadata
from parity.errors import ParityTrainingError

logger = logging.getLogger(__name__)

MAX_BATCH_SIZE = 8


def store_family(family: str) -> str:
    """The store family the parity models of ``family`` are imported as."""
    return f"{family}-parity"


def trained(out_dir: Path) -> list[ParityMetadata]:
    """Every parity model trained into ``out_dir`` (its metadata), by name."""
    found = [read_metadata(path) for path in sorted(out_dir.glob("*_parity_k*.json"))]
    return [m for m in found if m is not None]


def write_manifest(out_dir: Path, models: Sequence[ParityMetadata]) -> Path:
    """The family manifest of ``models`` (one family), beside their files; its path."""
    if not models:
        raise ParityTrainingError(f"no parity models to import from {out_dir}")
    families = {m.family for m in models}
    if len(families) != 1:
        raise ParityTrainingError(f"parity models of several families: {sorted(families)}")
    first = models[0]
    dims = ", ".join(map(str, first.input_dims))
    out_dims = ", ".join(map(str, first.output_dims))
    lines = [f"# Parity models of the {first.family} family, written by "
             "`understudy parity train --store`.",
             f"family: {store_family(first.family)}",
             f"max_batch_size: {MAX_BATCH_SIZE}",
             f"inputs: [{{name: {first.input_name}, data_type: FP32, dims: [{dims}]}}]",
             f"outputs: [{{name: {first.output_name}, data_type: FP32, dims: [{out_dims}]}}]",
             "variants:"]
    lines += [f"  - {{name: {m.name}, model: {m.files[m.format]}, "
              f"accuracy: {max(m.training.validation_degraded_acc, 0.01):.4f}}}"
              for m in sorted(models, key=lambda m: m.name)]
    path = out_dir / f"{store_family(first.family)}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def import_parity_models(out_dir: Path, store: Path,
                         names: Sequence[str] | None = None) -> list[str]:
    """Write the parity models trained in ``out_dir`` (those in ``names``) into ``store``.

    Returns the variant names now in the store.
    """
    from model_repo.family_manifest import load_family_manifest
    from model_repo.imported import write_family

    models = [m for m in trained(out_dir) if names is None or m.name in names]
    manifest = write_manifest(out_dir, models)
    written = write_family(store, load_family_manifest(manifest))
    logger.info("parity models in %s: %s", store, ", ".join(m.variant for m in written))
    return [m.variant for m in written]
