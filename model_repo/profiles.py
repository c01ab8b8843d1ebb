"""Model-variant profiles: built from torchvision's published metadata, loaded as policy families.

Three steps, each usable on its own:

* ``build_profiles(csv_path)`` turns ``shared/data/torchvision_classification.csv`` into one
  JSON-able document per family (pure: reads the CSV, returns dicts);
* ``write_profiles(docs, out_dir)`` writes them as ``<family>.json`` (deterministic bytes);
* ``load_families(profile_dir)`` reads the JSON files back into ``policies.model.Family`` values.

The estimates (memory, compute share, latency) are coarse rules of thumb from FLOPs and weight
size; the README's "Model-variant profiles" section states every rule. The profiler (issue 3)
replaces them with measured resident memory, load times and latencies.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies.errors import InvalidInputError
from policies.model import REFERENCE_SERVER_TYPE, Family, Variant
from policies.resources import MEMORY_MB, Resources

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of the profile document layout; bump it on an incompatible change."""

SOURCE_CSV_NAME = "torchvision_classification.csv"
SOURCE_TORCHVISION_VERSION = "0.29.2"
"""The torchvision release whose weights metadata the CSV reproduces (see shared/data/README)."""

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
"""Where the committed profile documents live (package data of ``model_repo``)."""

# --- memory estimate ----------------------------------------------------------------------
# memory_mb = file_size_mb + activation_mb, activation_mb = WORKSPACE_MB + MB_PER_GFLOP * gflops.
WORKSPACE_MB = 16.0
"""Fixed per-instance GPU workspace (CUDA/cuDNN scratch, I/O buffers), MB."""
ACTIVATION_MB_PER_GFLOP = 0.5
"""Batch-1 activation memory per GFLOP of one forward pass, MB (a coarse rule of thumb)."""
MEMORY_DECIMALS = 1

# --- compute and latency estimate on the reference GPU -------------------------------------
REFERENCE_GPU_NAME = "NVIDIA A2"
"""The FailLite testbed GPU; ``compute`` is measured in percent of one of these."""
REFERENCE_PEAK_GFLOPS = 4500.0
"""FP32 peak throughput of the reference GPU, GFLOP/s."""
REFERENCE_EFFICIENCY = 0.40
"""Share of the peak a batch-1 CNN/ViT forward pass is assumed to reach."""
REFERENCE_EFFECTIVE_GFLOPS = REFERENCE_PEAK_GFLOPS * REFERENCE_EFFICIENCY
"""Effective throughput, GFLOP/s (1800): the basis of compute share and latency."""
COMPUTE_PERCENT_OF_GPU = 100.0
"""``compute`` units in one whole reference GPU (a server's capacity is this x its speed)."""
COMPUTE_DECIMALS = 4
LATENCY_OVERHEAD_MS = 1.0
"""Fixed per-request latency (launch, copies) added to the FLOP time, ms."""
LATENCY_DECIMALS = 3
ACCURACY_DECIMALS = 6

_REQUIRED_COLUMNS = (
    "family", "model", "weights", "default", "acc1", "acc5",
    "params", "gflops", "file_size_mb", "crop_size",
)


class ProfileError(ValueError):
    """A profile source (CSV) or document (JSON) is missing or malformed."""


# --- document schema (what load_families accepts) -----------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceFields(_Strict):
    """The CSV row a variant was built from, as published by torchvision."""

    weights: str
    params: int = Field(gt=0)
    gflops: float = Field(gt=0)
    file_size_mb: float = Field(gt=0)
    crop_size: int = Field(gt=0)
    acc1: float = Field(gt=0, le=100)
    acc5: float = Field(gt=0, le=100)


class Measurement(_Strict):
    """What ``understudy models profile`` measured for one variant on real Triton."""

    host: str
    server_type: str
    artifact_scale: float = Field(gt=0)
    weights_mb: float = Field(gt=0)
    repeats: int = Field(ge=1)
    load_s: float = Field(ge=0)
    """Median wall time of Triton's load call."""
    load_s_runs: list[float]
    unload_s: float = Field(ge=0)
    """Median time from the unload call until the instance and its memory are gone."""
    latency_p50_ms: float = Field(ge=0)
    latency_p99_ms: float = Field(ge=0)
    latency_requests: int = Field(ge=1)
    resident_mb: float | None = Field(None, ge=0)
    """Private resident memory of the loaded model instance."""
    measured_on: str
    latency_ms_by_batch: dict[str, float] | None = None
    """p50 latency of one request of each batch size (``"1"``, ``"2"``, ...), where measured."""
    device_mb: float | None = Field(None, ge=0)
    """Memory the instance holds on its GPU (NVML), for a model placed on one."""
    device: str | None = None
    """Where the instance ran: ``cpu`` or a GPU's name (absent: cpu)."""
    overhead_ms: float | None = Field(None, ge=0)
    """p90 batch-1 latency of a model that computes nothing, with the variant's tensors, served
    the same way on the same Triton just before the variant was measured: the share of a
    request's latency that is the serving path's, not the model's (imports; absent: not
    measured)."""


class LoadTimeFit(_Strict):
    """Least-squares fit ``load_s = intercept_s + slope_s_per_mb * weights_mb`` over a run."""

    intercept_s: float
    slope_s_per_mb: float
    r2: float
    variants: int = Field(ge=2)
    artifact_scale: float = Field(gt=0)
    server_type: str


AccuracySource = Literal["published", "measured", "declared"]
"""Where a variant's top-1 comes from: a published table (torchvision), measured on the user's
evaluation set through Triton, or declared in the family manifest."""
FamilyOrigin = Literal["synthetic", "imported"]
"""``synthetic``: served by generated networks with seeded weights (their accuracy is the
published one of the real model they stand for); ``imported``: the user's own models."""


class VariantProfile(_Strict):
    """One variant's profile as stored in a family document."""

    name: str = Field(min_length=1)
    accuracy: float = Field(gt=0, le=1)
    top1_pct: float | None = None
    accuracy_source: AccuracySource = "published"
    format: str | None = None
    """The artifact's format for an imported variant (``onnx``, ``torchscript``, ``triton``)."""
    memory_mb: float = Field(gt=0)
    activation_mb: float | None = Field(None, ge=0)
    compute_per_rps: float = Field(ge=0)
    latency_ms: dict[str, float]
    load_time_s: float | None = Field(None, ge=0)
    size_mb: float | None = Field(None, ge=0)
    source: SourceFields | None = None
    measured: Measurement | None = None


class FamilyDocument(_Strict):
    """A whole ``<family>.json`` document."""

    schema_version: int
    family: str = Field(min_length=1)
    origin: FamilyOrigin = "synthetic"
    source: dict[str, str] = Field(default_factory=dict)
    reference_gpu: dict[str, float | str] = Field(default_factory=dict)
    variants: list[VariantProfile] = Field(min_length=1)
    load_time_fit: LoadTimeFit | None = None


# --- build ---------------------------------------------------------------------------------


def reference_gpu_document() -> dict[str, float | str]:
    """The estimation constants, recorded in every document next to the figures they produced."""
    return {
        "name": REFERENCE_GPU_NAME,
        "peak_fp32_gflops": REFERENCE_PEAK_GFLOPS,
        "efficiency": REFERENCE_EFFICIENCY,
        "effective_gflops": REFERENCE_EFFECTIVE_GFLOPS,
        "compute_unit": "percent of one reference GPU per request/s",
        "latency_overhead_ms": LATENCY_OVERHEAD_MS,
        "workspace_mb": WORKSPACE_MB,
        "activation_mb_per_gflop": ACTIVATION_MB_PER_GFLOP,
    }


def estimate_activation_mb(gflops: float) -> float:
    """Per-instance GPU memory beyond the weights: fixed workspace plus batch-1 activations."""
    return WORKSPACE_MB + ACTIVATION_MB_PER_GFLOP * gflops


def estimate_memory_mb(file_size_mb: float, gflops: float) -> float:
    """GPU memory of one loaded instance, MB: weights plus activations, to 0.1 MB."""
    return round(file_size_mb + estimate_activation_mb(gflops), MEMORY_DECIMALS)


def estimate_compute_per_rps(gflops: float) -> float:
    """Percent of one reference GPU consumed per request/s of load."""
    return round(COMPUTE_PERCENT_OF_GPU * gflops / REFERENCE_EFFECTIVE_GFLOPS, COMPUTE_DECIMALS)


def estimate_latency_ms(gflops: float) -> float:
    """Batch-1 latency on the reference GPU: fixed overhead plus FLOPs at effective speed."""
    gflop_per_ms = REFERENCE_EFFECTIVE_GFLOPS / 1000.0
    return round(LATENCY_OVERHEAD_MS + gflops / gflop_per_ms, LATENCY_DECIMALS)


def _parse_row(row: Mapping[str, str], line: int) -> dict[str, Any]:
    try:
        return {
            "family": _non_empty(row["family"]),
            "model": _non_empty(row["model"]),
            "weights": _non_empty(row["weights"]),
            "default": int(row["default"]),
            "acc1": float(row["acc1"]),
            "acc5": float(row["acc5"]),
            "params": int(row["params"]),
            "gflops": float(row["gflops"]),
            "file_size_mb": float(row["file_size_mb"]),
            "crop_size": int(row["crop_size"]),
        }
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"line {line}: {exc}") from exc


def _non_empty(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("empty name field")
    return value


def read_default_rows(csv_path: str | Path) -> list[dict[str, Any]]:
    """The rows of the CSV marked ``default == 1``: exactly one per model, checked."""
    path = Path(csv_path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in _REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ProfileError(f"{path}: missing columns {missing}")
            rows = [_parse_row(row, line) for line, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise ProfileError(f"cannot read profile source {path}: {exc}") from exc
    defaults: dict[str, dict[str, Any]] = {}
    family_of: dict[str, str] = {}
    for row in rows:
        model = row["model"]
        if family_of.setdefault(model, row["family"]) != row["family"]:
            raise ProfileError(f"{path}: model {model!r} appears in two families")
        if row["default"] == 1:
            if model in defaults:
                raise ProfileError(f"{path}: model {model!r} has more than one default row")
            defaults[model] = row
    no_default = sorted(set(family_of) - set(defaults))
    if no_default:
        raise ProfileError(f"{path}: models without a default row: {no_default}")
    return list(defaults.values())


def _variant_document(row: Mapping[str, Any], best_acc1: float) -> dict[str, Any]:
    gflops = row["gflops"]
    return {
        "name": row["model"],
        "accuracy": round(row["acc1"] / best_acc1, ACCURACY_DECIMALS),
        "top1_pct": row["acc1"],
        "memory_mb": estimate_memory_mb(row["file_size_mb"], gflops),
        "activation_mb": round(estimate_activation_mb(gflops), 4),
        "compute_per_rps": estimate_compute_per_rps(gflops),
        "latency_ms": {REFERENCE_SERVER_TYPE: estimate_latency_ms(gflops)},
        "load_time_s": None,
        "size_mb": row["file_size_mb"],
        "source": {key: row[key] for key in (
            "weights", "params", "gflops", "file_size_mb", "crop_size", "acc1", "acc5")},
    }


def build_profiles(csv_path: str | Path) -> dict[str, dict[str, Any]]:
    """Build one profile document per family from the torchvision metadata CSV.

    Args:
        csv_path: ``torchvision_classification.csv`` (layout in shared/data/README.md).

    Returns:
        Family name -> JSON-able document, families in name order, each document's variants
        sorted by ``memory_mb`` (then name).

    Raises:
        ProfileError: the CSV is missing, lacks a column, has a bad value, or a model has no
            (or more than one) default row.
    """
    by_family: dict[str, list[dict[str, Any]]] = {}
    for row in read_default_rows(csv_path):
        by_family.setdefault(row["family"], []).append(row)
    docs: dict[str, dict[str, Any]] = {}
    for family in sorted(by_family):
        rows = by_family[family]
        best_acc1 = max(row["acc1"] for row in rows)
        variants = [_variant_document(row, best_acc1) for row in rows]
        variants.sort(key=lambda v: (v["memory_mb"], v["name"]))
        docs[family] = {
            "schema_version": SCHEMA_VERSION,
            "family": family,
            "source": {"csv": SOURCE_CSV_NAME, "torchvision": SOURCE_TORCHVISION_VERSION},
            "reference_gpu": reference_gpu_document(),
            "variants": variants,
        }
    return docs


def dump_document(doc: Mapping[str, Any]) -> str:
    """The exact text a document is stored as: sorted keys, indent 2, trailing newline."""
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def write_profiles(docs: Mapping[str, Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write each document to ``out_dir/<family>.json``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for family in sorted(docs):
        path = out / f"{family}.json"
        path.write_text(dump_document(docs[family]), encoding="utf-8")
        written.append(path)
    logger.info("wrote %d profile documents to %s", len(written), out)
    return written


# --- measurements ----------------------------------------------------------------------------

MEASURED_KEYS = ("measured",)
FAMILY_MEASURED_KEYS = ("load_time_fit",)


def apply_measurement(doc: dict[str, Any], variant: str, measurement: Measurement) -> None:
    """Record a measurement in a family document (in place).

    Besides the ``measured`` block, the variant's ``load_time_s`` becomes the measured median
    and ``latency_ms[<server type>]`` the measured p50, so policies on servers of that type use
    real figures; the reference-GPU estimate stays beside them.
    """
    entry = next((v for v in doc["variants"] if v["name"] == variant), None)
    if entry is None:
        raise ProfileError(f"family {doc['family']!r} has no variant {variant!r}")
    entry["measured"] = measurement.model_dump()
    entry["load_time_s"] = round(measurement.load_s, 4)
    entry["latency_ms"] = {**entry["latency_ms"],
                           measurement.server_type: round(measurement.latency_p50_ms, 3)}


def strip_measurements(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` as ``build_profiles`` makes it, i.e. without measured figures."""
    stripped = {k: v for k, v in doc.items() if k not in FAMILY_MEASURED_KEYS}
    variants = []
    for variant in doc["variants"]:
        measured = variant.get("measured")
        clean = {k: v for k, v in variant.items() if k not in MEASURED_KEYS}
        if measured is not None:
            clean["load_time_s"] = None
            clean["latency_ms"] = {k: v for k, v in variant["latency_ms"].items()
                                   if k != measured["server_type"]}
        variants.append(clean)
    stripped["variants"] = variants
    return stripped


def merge_measurements(fresh: Mapping[str, dict[str, Any]],
                       existing_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Carry measured figures from documents in ``existing_dir`` into freshly built ones.

    Rebuilding from the CSV must not throw away a profiling run; a variant that no longer
    exists simply loses its measurement.
    """
    merged = {family: json.loads(json.dumps(doc)) for family, doc in fresh.items()}
    directory = Path(existing_dir)
    for family, doc in merged.items():
        path = directory / f"{family}.json"
        if not path.exists():
            continue
        old = json.loads(path.read_text(encoding="utf-8"))
        for key in FAMILY_MEASURED_KEYS:
            if old.get(key) is not None:
                doc[key] = old[key]
        for variant in old.get("variants", []):
            if variant.get("measured") and any(v["name"] == variant["name"]
                                               for v in doc["variants"]):
                apply_measurement(doc, variant["name"],
                                  Measurement.model_validate(variant["measured"]))
    return merged


# --- load ----------------------------------------------------------------------------------


STORE_PROFILE_FILE = "profile.json"
"""An imported family's profile document in an artifact store: ``STORE/<family>/profile.json``."""


def load_family_document(path: str | Path) -> FamilyDocument:
    """Read and validate one ``<family>.json`` (or a store's ``<family>/profile.json``).

    Its ``family`` must match the file name (the folder's, for a store's profile).
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {path} is not valid JSON: {exc}") from exc
    try:
        doc = FamilyDocument.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(f"profile {path} is malformed: {exc}") from exc
    if doc.schema_version != SCHEMA_VERSION:
        raise ProfileError(
            f"profile {path}: schema_version {doc.schema_version}, expected {SCHEMA_VERSION}")
    expected = path.parent.name if path.name == STORE_PROFILE_FILE else path.stem
    if doc.family != expected:
        raise ProfileError(f"profile {path} describes family {doc.family!r}, not {expected!r}")
    return doc


def load_family_documents(profile_dir: str | Path | None = None,
                          stores: Sequence[str | Path] = ()) -> dict[str, FamilyDocument]:
    """Every ``*.json`` document in ``profile_dir`` (default: the packaged profiles), by family.

    The imported families of each artifact store in ``stores`` (``<family>/profile.json``,
    written by ``understudy models import``) are added; a store's family may not take the
    name of a packaged one.
    """
    directory = PROFILE_DIR if profile_dir is None else Path(profile_dir)
    if not directory.is_dir():
        raise ProfileError(f"profile directory {directory} does not exist")
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise ProfileError(f"profile directory {directory} holds no *.json profile")
    docs = {path.stem: load_family_document(path) for path in paths}
    for store in stores:
        for path in sorted(Path(store).glob(f"*/{STORE_PROFILE_FILE}")):
            doc = load_family_document(path)
            if doc.family in docs and docs[doc.family].origin != "imported":
                raise ProfileError(f"{path}: family {doc.family!r} is also a packaged family")
            docs[doc.family] = doc
    return docs


def family_from_document(doc: FamilyDocument) -> Family:
    """The policy data model's ``Family`` for one validated document."""
    try:
        variants = tuple(
            Variant(
                name=v.name,
                family=doc.family,
                accuracy=v.accuracy,
                base_demand=Resources({MEMORY_MB: v.memory_mb}),
                compute_per_rps=v.compute_per_rps,
                latency_ms=dict(v.latency_ms),
                load_time_s=v.load_time_s,
                top1_pct=v.top1_pct,
                size_mb=v.size_mb,
            )
            for v in doc.variants
        )
        return Family(name=doc.family, variants=variants)
    except InvalidInputError as exc:
        raise ProfileError(f"profile of family {doc.family!r}: {exc}") from exc


def load_families(profile_dir: str | Path | None = None,
                  stores: Sequence[str | Path] = ()) -> dict[str, Family]:
    """All families in ``profile_dir`` (default: the packaged profiles) as policy values.

    With ``stores``, the families imported into those artifact stores too.

    Raises:
        ProfileError: the directory is missing or empty, or a file is unreadable, not JSON,
            does not match the schema, or describes an invalid family.
    """
    docs = load_family_documents(profile_dir, stores)
    return {name: family_from_document(doc) for name, doc in docs.items()}
