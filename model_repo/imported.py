"""A user's family in the artifact store: its variants' directories and its profile document.

``understudy models import`` (``agent.model_import``) checks the family manifest
(``model_repo.family_manifest``), then writes here, per variant::

    STORE/<family>/<variant>/manifest.json   format, tensors, sha256 of the one artifact file
    STORE/<family>/<variant>/model.onnx      (or model.pt; or model.tar: a Triton directory)
    STORE/<family>/<variant>/config.pbtxt    to serve it with the Python backend, as a reference
    STORE/<family>/<variant>/1/model.py      the wrapper (the runtime runs ONNX/TorchScript)

and, for the family, ``STORE/<family>/evaluation.npz`` (a copy of the evaluation set) and,
once every variant is profiled, ``STORE/<family>/profile.json``: the same document as a packaged
profile (``model_repo.profiles``), with ``origin: imported`` and each variant's accuracy marked
``measured`` or ``declared``. The controller, the testbed and the simulator read the store's
profiles next to the packaged ones.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_repo.artifacts import (
    MANIFEST_FILE,
    MODEL_SOURCE,
    file_sha256,
    render_model_config,
    write_index,
)
from model_repo.family_manifest import WRAPPED_FILES, ImportFamily, ImportVariant
from model_repo.profiles import (
    LATENCY_OVERHEAD_MS,
    SCHEMA_VERSION,
    STORE_PROFILE_FILE,
    LoadTimeFit,
    Measurement,
    dump_document,
)
from understudy.wire.artifacts import Manifest

logger = logging.getLogger(__name__)

TRITON_ARCHIVE = "model.tar"
EVALUATION_FILE = "evaluation.npz"
MEASURED_TOP1_DECIMALS = 6


@dataclass(frozen=True)
class VariantResult:
    """What the import measured for one variant."""

    manifest: Manifest
    measurement: Measurement
    top1: float | None
    """Measured top-1 on the evaluation set (0 to 1); None when declared."""
    declared_top1: float | None = None


def artifact_name(variant: ImportVariant) -> str:
    """The artifact file of a variant in the store."""
    return TRITON_ARCHIVE if variant.format == "triton" else WRAPPED_FILES[variant.format]


def pack_directory(directory: Path, out: Path) -> None:
    """Tar a Triton model directory with fixed metadata, so the same files give the same bytes."""
    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(out, "w") as archive:
        for path in sorted(directory.rglob("*")):
            if "__pycache__" in path.parts or path.is_symlink():
                continue
            archive.add(path, arcname=str(path.relative_to(directory)), recursive=False,
                        filter=clean)


def unpack_triton_directory(archive: Path, target: Path, model_name: str) -> None:
    """Unpack a packed Triton directory into ``target``, its config renamed to ``model_name``."""
    with tarfile.open(archive) as packed:
        packed.extractall(target, filter="data")
    config = target / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    renamed, count = re.subn(r'(?m)^(\s*name\s*:\s*)"[^"]*"', rf'\1"{model_name}"', text,
                             count=1)
    config.write_text(renamed if count else f'name: "{model_name}"\n{text}', encoding="utf-8")


def existing_manifest(store: Path, family: str, variant: str) -> Manifest | None:
    """The manifest the store holds for a variant, if any."""
    try:
        return Manifest.model_validate_json(
            (store / family / variant / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def source_sha256(variant: ImportVariant) -> str:
    """The sha256 of the artifact a variant would have in the store."""
    if variant.format != "triton":
        return file_sha256(variant.path)
    with tempfile.TemporaryDirectory() as scratch:
        packed = Path(scratch) / TRITON_ARCHIVE
        pack_directory(variant.path, packed)
        return file_sha256(packed)


def write_variant(store: Path, family: ImportFamily, variant: ImportVariant) -> Manifest:
    """Write one variant's directory into the store (atomically); its manifest."""
    target = store / family.family / variant.name
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{variant.name}.", dir=target.parent))
    try:
        name = artifact_name(variant)
        if variant.format == "triton":
            pack_directory(variant.path, work / name)
        else:
            shutil.copyfile(variant.path, work / name)
        size_mb = max((work / name).stat().st_size / 1e6, 1e-6)
        manifest = Manifest(
            family=family.family, variant=variant.name, profiled_size_mb=round(size_mb, 6),
            scale=1.0, weights_mb=round(size_mb, 6), weights_sha256=file_sha256(work / name),
            max_batch_size=family.max_batch_size, format=variant.format, weights_file=name,
            inputs=variant.inputs, outputs=variant.outputs, backend=variant.backend)
        if variant.format != "triton":
            (work / "1").mkdir()
            shutil.copyfile(MODEL_SOURCE, work / "1" / "model.py")
            (work / "config.pbtxt").write_text(
                render_model_config(variant.name, manifest, name), encoding="utf-8")
        (work / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2) + "\n",
                                          encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return manifest


def write_family(store: Path, family: ImportFamily) -> list[Manifest]:
    """Write every variant (and the evaluation set) of ``family`` into ``store``."""
    store.mkdir(parents=True, exist_ok=True)
    manifests = [write_variant(store, family, variant) for variant in family.variants]
    if family.evaluation is not None:
        import numpy as np

        with np.load(family.evaluation.path, allow_pickle=False) as data:
            inputs = data[family.evaluation.inputs_key]
            labels = data[family.evaluation.labels_key]
        buffer = io.BytesIO()
        np.savez_compressed(buffer, inputs=inputs, labels=labels)
        (store / family.family / EVALUATION_FILE).write_bytes(buffer.getvalue())
    write_index(store)
    return manifests


def compute_ms(measurement: Measurement) -> float:
    """A variant's compute time per batch-1 request: its p50 beyond the serving path's share."""
    overhead = measurement.overhead_ms
    if overhead is None:
        overhead = LATENCY_OVERHEAD_MS
    return max(0.0, measurement.latency_p50_ms - overhead)


def family_document(family: str, results: Sequence[VariantResult], manifest_path: str,
                    fit: LoadTimeFit | None = None) -> dict[str, Any]:
    """The profile document of an imported family (``model_repo.profiles`` schema).

    ``accuracy`` is top-1 relative to the family's best (as the packaged profiles normalise
    it), ``top1_pct`` the absolute figure. Memory is what the loaded instance holds (its
    private resident memory, plus its GPU memory where it runs on one), never less than its
    artifact. Compute follows the packaged profiles' rule read backwards: there, batch-1
    latency is a fixed overhead plus the compute time, and ``compute_per_rps`` (percent of one
    device per request/s) is that compute time in ms / 10; here the measured p50 gives the
    latency and the overhead is the serving path's, measured on the same Triton with a probe
    that computes nothing (``Measurement.overhead_ms``, its p90), so ``compute_per_rps`` =
    (p50 - overhead) / 10, never below 0. A measurement without it (an older profile) falls
    back to the packaged profiles' ``LATENCY_OVERHEAD_MS``.
    """
    top1 = {r.manifest.variant: (r.top1 if r.top1 is not None else r.declared_top1)
            for r in results}
    if any(value is None or value <= 0 for value in top1.values()):
        raise ValueError("every variant needs a measured or declared top-1 above 0")
    best = max(value for value in top1.values() if value is not None)
    variants = []
    for result in results:
        m = result.measurement
        value = top1[result.manifest.variant]
        assert value is not None  # noqa: S101 - checked above
        memory = max(m.resident_mb or 0.0, m.weights_mb) + (m.device_mb or 0.0)
        latency = round(m.latency_p50_ms, 3)
        variants.append({
            "name": result.manifest.variant,
            "accuracy": round(value / best, MEASURED_TOP1_DECIMALS),
            "top1_pct": round(100.0 * value, 4),
            "accuracy_source": "measured" if result.top1 is not None else "declared",
            "format": result.manifest.format,
            "memory_mb": round(max(memory, 0.1), 2),
            "compute_per_rps": round(compute_ms(m) / 10.0, 6),
            "latency_ms": {"reference": latency, m.server_type: latency},
            "load_time_s": round(m.load_s, 4),
            "size_mb": result.manifest.weights_mb,
            "measured": m.model_dump(),
        })
    variants.sort(key=lambda v: (v["memory_mb"], v["name"]))
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "family": family, "origin": "imported",
        "source": {"manifest": manifest_path},
        "variants": variants,
    }
    if fit is not None:
        doc["load_time_fit"] = fit.model_dump()
    return doc


def write_profile(store: Path, doc: dict[str, Any]) -> Path:
    """Write an imported family's profile document into the store (atomically)."""
    path: Path = store / str(doc["family"]) / STORE_PROFILE_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(dump_document(doc), encoding="utf-8")
    os.replace(partial, path)
    return path
