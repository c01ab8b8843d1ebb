"""The artifact store: one Triton model directory per family variant, with seeded torch weights.

Layout of a store (``understudy models build --out STORE``)::

    STORE/index.json                       what is in the store (families, variants, scale)
    STORE/<family>/<variant>/config.pbtxt  Triton config (name = the variant)
    STORE/<family>/<variant>/1/model.py    copy of model_repo/triton_model.py
    STORE/<family>/<variant>/weights.pt    torch state_dict, size = profiled size x scale
    STORE/<family>/<variant>/manifest.json spec, size and sha256 of the weights

The weight file of a variant follows its profiled size (``size_mb`` from the torchvision table)
times ``scale``: the default scale makes the demo families (about 5.9 GB at scale 1) fit in about
2 GB. Accuracy figures come from the profile table, not from these weights, which are random.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_repo.network import NetworkSpec, initial_state, seed_for, spec_for_size
from policies.model import Family
from understudy.wire.artifacts import STORE_SCHEMA_VERSION, Manifest, TensorSpec
from understudy.wire.bounds import check_name

logger = logging.getLogger(__name__)

DEFAULT_SCALE = 0.35
"""Artifact scale: the demo families' 5.87 GB of torchvision weights become about 2.05 GB."""
DEFAULT_MAX_BATCH = 8
MODEL_SOURCE = Path(__file__).resolve().parent / "triton_model.py"
WEIGHTS_FILE = "weights.pt"
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.json"


class ArtifactError(ValueError):
    """The artifact store is missing, inconsistent, or lacks a requested variant."""


@dataclass(frozen=True)
class StoreEntry:
    """A variant as found in a store."""

    family: str
    variant: str
    directory: Path
    manifest: Manifest


def _instance_group(device: str) -> str:
    """One instance on the CPU, or on GPU ``N`` for ``device`` ``cuda:N``."""
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {index} ] }} ]\n"
    return "instance_group [ { kind: KIND_CPU count: 1 } ]\n"


LOAD_PRIORITY = "load_priority"
"""Config parameter: ``urgent`` (the load ends an outage) or ``routine`` (a warm backup, an
upgrade, a fail-back). The runtime raises only urgent loads above inference."""


def _load_priority(urgent: bool) -> str:
    return _parameter(LOAD_PRIORITY, "urgent" if urgent else "routine")


def _parameter(key: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'parameters {{ key: "{key}" value: {{ string_value: "{escaped}" }} }}\n'


def _tensors(kind: str, tensors: Sequence[TensorSpec]) -> str:
    items = ", ".join(f'{{ name: "{t.name}" data_type: TYPE_{t.data_type} '
                      f'dims: [ {", ".join(str(d) for d in t.dims)} ] }}' for t in tensors)
    return f"{kind} [ {items} ]\n"


def render_config(model_name: str, spec: NetworkSpec, weights: str,
                  max_batch_size: int = DEFAULT_MAX_BATCH, backend: str = "python",
                  device: str = "cpu", urgent: bool = True) -> str:
    """The ``config.pbtxt`` of one generated model (complete: Triton's auto-complete is off).

    ``backend`` is ``python`` (``1/model.py``) or ``understudy`` (the native backend,
    ``model_repo.native_backend``); both read the same parameters. ``device`` is ``cpu`` or
    ``cuda:N`` (the instance is placed on that GPU: ``KIND_GPU``). ``urgent``: whether the load
    ends an outage (``load_priority``, read by the runtime: only such loads outrank inference).
    """
    side = spec.image_side
    return (
        f'name: "{model_name}"\n'
        f'backend: "{backend}"\n'
        f"max_batch_size: {max_batch_size}\n"
        f'input [ {{ name: "image" data_type: TYPE_FP32 dims: [ 3, {side}, {side} ] }} ]\n'
        f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {spec.num_classes} ] }} ]\n'
        + _instance_group(device)
        + "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
        + _parameter("weights", weights)
        + _parameter("network_spec", json.dumps(spec.to_dict(), sort_keys=True))
        + (_parameter("device", device) if device != "cpu" else "")
        + _load_priority(urgent)
    )


def render_model_config(model_name: str, manifest: Manifest, weights: str,
                        backend: str = "python", device: str = "cpu",
                        urgent: bool = True) -> str:
    """The ``config.pbtxt`` of any wrapped variant: generated, ONNX or TorchScript.

    An imported model keeps its own tensor names and shapes; the runtime serves it with
    onnxruntime or torch (``model_repo.loaders``). A ``triton`` directory has its own config
    (``model_repo.imported.unpack_triton_directory``), not this one.
    """
    if manifest.format == "synthetic":
        return render_config(model_name, manifest.network, weights, manifest.max_batch_size,
                             backend, device, urgent)
    if manifest.format == "triton":
        raise ArtifactError(f"{manifest.variant} is a Triton model directory served as it is; "
                            "it has its own config")
    (source,), (target, *extras) = manifest.inputs, manifest.outputs
    return (
        f'name: "{model_name}"\n'
        f'backend: "{backend}"\n'
        f"max_batch_size: {manifest.max_batch_size}\n"
        + _tensors("input", manifest.inputs) + _tensors("output", manifest.outputs)
        + _instance_group(device)
        + "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
        + _parameter("format", manifest.format) + _parameter("weights", weights)
        + _parameter("input", source.name) + _parameter("output", target.name)
        + _parameter("input_dims", json.dumps(list(source.dims)))
        + (_parameter("extra_outputs", ",".join(e.name for e in extras)) if extras else "")
        + (_parameter("device", device) if device != "cpu" else "")
        + _load_priority(urgent)
    )


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_variant(store: Path, family: str, variant: str, size_mb: float, scale: float,
                  image_side: int = 224, max_batch_size: int = DEFAULT_MAX_BATCH) -> Manifest:
    """Write one variant's directory (atomically: a half-written variant is never visible)."""
    import torch

    spec = spec_for_size(size_mb * scale, seed=seed_for(f"{family}/{variant}"),
                         image_side=image_side)
    target = store / family / variant
    work = Path(tempfile.mkdtemp(prefix=f".{variant}.", dir=store))
    try:
        (work / "1").mkdir()
        shutil.copyfile(MODEL_SOURCE, work / "1" / "model.py")
        (work / "config.pbtxt").write_text(
            render_config(variant, spec, WEIGHTS_FILE, max_batch_size), encoding="utf-8")
        torch.save(initial_state(spec), work / WEIGHTS_FILE)
        weights_path = work / WEIGHTS_FILE
        manifest = Manifest(
            family=family, variant=variant, profiled_size_mb=size_mb, scale=scale,
            weights_mb=round(weights_path.stat().st_size / 1e6, 3),
            weights_sha256=file_sha256(weights_path), spec=spec.to_dict(),
            max_batch_size=max_batch_size)
        (work / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2) + "\n",
                                          encoding="utf-8")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return manifest


def build_store(store: Path, families: Iterable[Family], scale: float = DEFAULT_SCALE,
                variants: Sequence[str] | None = None, image_side: int = 224,
                rebuild: bool = False) -> list[Manifest]:
    """Write every variant of ``families`` (or only ``variants``) into ``store``.

    A variant whose manifest already matches (same size and scale) is kept unless ``rebuild``.
    """
    if scale <= 0:
        raise ArtifactError(f"scale must be positive, got {scale}")
    store.mkdir(parents=True, exist_ok=True)
    wanted = set(variants) if variants is not None else None
    manifests: list[Manifest] = []
    for family in families:
        for variant in family.variants:
            if wanted is not None and variant.name not in wanted:
                continue
            if variant.size_mb is None:
                raise ArtifactError(f"variant {variant.name} has no profiled size_mb")
            existing = _existing_manifest(store / family.name / variant.name)
            if (not rebuild and existing is not None and existing.scale == scale
                    and existing.profiled_size_mb == variant.size_mb
                    and existing.spec.get("image_side") == image_side):
                # Weights are expensive and stable; the code is cheap and may have changed.
                shutil.copyfile(MODEL_SOURCE, store / family.name / variant.name / "1" /
                                "model.py")
                manifests.append(existing)
                continue
            logger.info("building %s/%s (%.1f MB x %.3f)", family.name, variant.name,
                        variant.size_mb, scale)
            manifests.append(build_variant(store, family.name, variant.name, variant.size_mb,
                                           scale, image_side))
    _write_index(store)
    return manifests


def _existing_manifest(directory: Path) -> Manifest | None:
    try:
        manifest = Manifest.model_validate_json((directory / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return manifest if (directory / manifest.weights_file).exists() else None


def write_index(store: Path) -> None:
    """Rewrite ``index.json`` from what the store holds."""
    _write_index(store)


def _write_index(store: Path) -> None:
    entries = list_store(store)
    index: dict[str, Any] = {
        "schema_version": STORE_SCHEMA_VERSION,
        "variants": {e.variant: {"family": e.family, "weights_mb": e.manifest.weights_mb,
                                 "scale": e.manifest.scale, "format": e.manifest.format}
                     for e in entries},
        "total_mb": round(sum(e.manifest.weights_mb for e in entries), 1),
    }
    tmp = store / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, store / INDEX_FILE)


def list_store(store: Path) -> list[StoreEntry]:
    """Every complete variant in ``store``, sorted by family then weight size."""
    entries = []
    for manifest_path in sorted(store.glob(f"*/*/{MANIFEST_FILE}")):
        manifest = _existing_manifest(manifest_path.parent)
        if manifest is not None:
            entries.append(StoreEntry(manifest.family, manifest.variant, manifest_path.parent,
                                      manifest))
    return sorted(entries, key=lambda e: (e.family, e.manifest.weights_mb))


def find_variant(store: Path, variant: str) -> StoreEntry:
    """The store entry of ``variant``; ArtifactError when the store does not hold it.

    ``variant`` is a name, never a pattern: one that is not a valid variant name (``*``,
    ``..``, a ``/``) is unknown, and the error does not name the store's directory (the
    controller's API hands it to whoever asked).
    """
    try:
        check_name(variant, "variant")
    except ValueError as exc:
        raise ArtifactError(f"unknown variant: {exc}") from exc
    for family_dir in sorted(store.iterdir()) if store.is_dir() else ():
        directory = family_dir / variant
        manifest = _existing_manifest(directory) if directory.is_dir() else None
        if manifest is not None:
            return StoreEntry(manifest.family, variant, directory, manifest)
    raise ArtifactError(f"unknown variant {variant!r}: not in the artifact store")
