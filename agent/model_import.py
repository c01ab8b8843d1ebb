"""``understudy models import``: a user's family checked, stored, profiled and evaluated.

Steps: the family manifest is checked (``model_repo.family_manifest``: every error names the
file and the field); its variants are written into the artifact store
(``model_repo.imported``); each one is profiled on a real Triton as the profiler profiles the
generated ones (load and unload times, resident memory, p50/p99 latency of batch 1 and the p50
of larger batches), and just before it the serving path's own latency, with a probe that
computes nothing (``agent.overhead_probe``); its top-1 accuracy is measured by sending the
evaluation set through that Triton, or its declared figure is recorded as declared; the
family's profile document is then written beside its variants, where the controller, the
testbed and the simulator find it.

An import whose artifacts and evaluation set are unchanged since the last one, and whose
profile exists with the serving path measured, is skipped (``force`` redoes it): ``understudy
models build`` relies on that to keep ``make demo``'s set-up short after the first time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.overhead_probe import OverheadProbe, write_probe
from agent.profiler import (
    ProfileSettings,
    fit_load_time,
    link_model,
    measure_with_retry,
    profiling_server,
    tensor_names,
)
from agent.triton import TritonServer
from model_repo.artifacts import StoreEntry, find_variant
from model_repo.family_manifest import ImportFamily, load_family_manifest
from model_repo.imported import (
    EVALUATION_FILE,
    VariantResult,
    existing_manifest,
    family_document,
    source_sha256,
    write_family,
    write_profile,
)
from model_repo.profiles import STORE_PROFILE_FILE, LoadTimeFit, load_family_document

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportOutcome:
    """What an import did."""

    family: str
    profile: Path
    results: tuple[VariantResult, ...]
    skipped: bool
    """True when the store was already up to date (nothing measured)."""


def up_to_date(store: Path, family: ImportFamily) -> bool:
    """Whether the store already holds this family, profiled, with the same artifacts."""
    profile = store / family.family / STORE_PROFILE_FILE
    try:
        doc = load_family_document(profile)
    except (OSError, ValueError):
        return False
    if {v.name for v in doc.variants} != {v.name for v in family.variants}:
        return False
    if any(v.measured is None or v.measured.overhead_ms is None for v in doc.variants):
        return False  # profiled before the serving path was measured: compute reads high
    if family.evaluation is not None and not (store / family.family / EVALUATION_FILE).exists():
        return False
    for variant in family.variants:
        stored = existing_manifest(store, family.family, variant.name)
        if stored is None or stored.format != variant.format or \
                stored.weights_sha256 != source_sha256(variant):
            return False
    return True


def evaluate_top1(server: TritonServer, model: str, entry: StoreEntry, inputs: np.ndarray,
                  labels: np.ndarray) -> float:
    """Top-1 accuracy of a loaded model on an evaluation set, through Triton."""
    names = tensor_names(entry.manifest)
    step = entry.manifest.max_batch_size
    correct = 0
    for start in range(0, len(inputs), step):
        outputs = server.infer(model, inputs[start:start + step].astype(np.float32), *names)
        predicted = np.asarray(outputs).reshape(len(outputs), -1).argmax(axis=1)
        correct += int((predicted == labels[start:start + step]).sum())
    return correct / len(inputs)


def import_family(manifest_path: Path, store: Path, work_dir: Path,
                  settings: ProfileSettings | None = None, force: bool = False,
                  device: str = "auto",
                  progress: Callable[[VariantResult], None] | None = None) -> ImportOutcome:
    """Check, store, profile and evaluate a family; see the module's docstring.

    Raises ``ManifestError`` (a bad manifest), ``ArtifactError`` or ``TritonError``.
    """
    family = load_family_manifest(manifest_path)
    profile = store / family.family / STORE_PROFILE_FILE
    if not force and up_to_date(store, family):
        logger.info("family %s is up to date in %s", family.family, store)
        return ImportOutcome(family.family, profile, (), skipped=True)
    write_family(store, family)
    entries = [find_variant(store, v.name) for v in family.variants]
    settings = settings or ProfileSettings()
    evaluation = None
    if family.evaluation is not None:
        with np.load(store / family.family / EVALUATION_FILE, allow_pickle=False) as data:
            evaluation = (data["inputs"], data["labels"])
    results = _profile(family, entries, work_dir, settings, device, evaluation, progress)
    fit = None
    if len(results) >= 2:
        intercept, slope, r2 = fit_load_time([(r.measurement.weights_mb, r.measurement.load_s)
                                              for r in results])
        fit = LoadTimeFit(intercept_s=intercept, slope_s_per_mb=slope, r2=r2,
                          variants=len(results), artifact_scale=1.0,
                          server_type=settings.server_type)
    write_profile(store, family_document(family.family, results,
                                         str(family.manifest_path), fit))
    return ImportOutcome(family.family, profile, tuple(results), skipped=False)


def _profile(family: ImportFamily, entries: list[StoreEntry], work_dir: Path,
             settings: ProfileSettings, device: str,
             evaluation: tuple[np.ndarray, np.ndarray] | None,
             progress: Callable[[VariantResult], None] | None) -> list[VariantResult]:
    server = profiling_server(work_dir, device)
    declared = {v.name: v.declared_accuracy for v in family.variants}
    results: list[VariantResult] = []
    probe: OverheadProbe | None = None
    server.start()
    try:
        probe_entry = write_probe(work_dir / "probe", entries[0].manifest)
        if probe_entry is not None:
            probe = OverheadProbe(server, probe_entry, settings, device=server.config.device)
        for entry in entries:
            model = link_model(server.config.model_repository, entry, server.model_backend,
                               device=server.config.device)
            overhead = probe.measure() if probe is not None else None
            measurement = measure_with_retry(server, model, entry, settings)
            measurement = measurement.model_copy(update={"overhead_ms": (
                round(overhead, 4) if overhead is not None else None)})
            top1 = None
            if evaluation is not None:
                server.load(model)
                try:
                    top1 = evaluate_top1(server, model, entry, *evaluation)
                finally:
                    server.unload(model)
            result = VariantResult(manifest=entry.manifest, measurement=measurement, top1=top1,
                                   declared_top1=declared[entry.variant])
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        if probe is not None:
            probe.close()
        server.stop()
    return results
