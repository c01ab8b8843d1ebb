"""Parity models as artifacts: trained for a deployed variant, exported, described, cached.

:func:`train_parity_model` trains the parity model of one deployed variant of the digits family
for one k and one encoder and writes, as ``model_repo.digits`` writes the variants themselves,
``<name>.onnx`` and ``<name>.pt`` (TorchScript, same tensor names ``image`` / ``logits``) and
``<name>.json``, the :class:`ParityMetadata` (k, the encoder, the deployed variant, the format
to serve it as, how training went). ``<name>`` is ``<variant>_parity_k<k>``, with ``_concat``
for the concatenation encoder.

The deployed model is read from the digits family's own exported file (the one its manifest
lists, through the runtime's loaders), so the parity model learns the outputs of what is
served. The result is cached: a parity model whose inputs (this package's code, the digits
training code and torch's version, the deployed file's bytes, k, the encoder, the settings)
have not changed is not trained again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from model_repo import digits
from parity.coding import EncoderKind
from parity.errors import ParityTrainingError
from parity.evaluation import Predictor
from parity.training import TrainingSettings, default_settings, train_parity

logger = logging.getLogger(__name__)

FAMILIES = (digits.FAMILY,)
"""Families with parity models: those whose training data ship with the project."""
KS = (2, 3, 4)
VALIDATION_FRACTION = 0.1
"""The part of the training split kept aside to decide when a parity model is trained."""
_SOURCES = ("coding.py", "evaluation.py", "training.py", "artifacts.py")
_SUFFIX = {"onnx": "onnx", "torchscript": "pt"}


class TrainingRecord(BaseModel):
    """How a parity model's training went."""

    model_config = ConfigDict(extra="forbid")

    settings: TrainingSettings
    steps_run: int
    best_step: int
    validation_degraded_acc: float
    """A_d on the validation queries (taken from the training split) of the kept weights."""
    fit_queries: int
    validation_queries: int
    train_s: float


class ParityMetadata(BaseModel):
    """What a parity model is for and how to serve it (``<name>.json`` beside its files)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    deployed_variant: str
    k: int
    encoder: EncoderKind
    decoder: Literal["subtraction"] = "subtraction"
    loss: Literal["mse"] = "mse"
    architecture: str
    """The deployed variant's architecture, which the parity model shares (§4.3)."""
    format: Literal["onnx", "torchscript"]
    """The format to serve it in: the deployed variant's, as the family manifest lists it."""
    files: dict[str, str]
    """Format -> file name, relative to the metadata's folder."""
    input_name: str
    output_name: str
    input_dims: list[int]
    output_dims: list[int]
    training: TrainingRecord
    key: str
    """The cache key of the inputs it was trained from."""

    def model_path(self, folder: Path) -> Path:
        """The file to serve, in ``folder`` (where the metadata lies)."""
        return folder / self.files[self.format]


def parity_name(variant: str, k: int, encoder: EncoderKind | str) -> str:
    """The artifact name of a parity model: ``<variant>_parity_k<k>[_concat]``."""
    suffix = "_concat" if EncoderKind(encoder) is EncoderKind.CONCATENATION else ""
    return f"{variant}_parity_k{k}{suffix}"


def variant_plan(family: str, variant: str) -> digits.VariantPlan:
    """The deployed variant's plan; a :class:`ParityTrainingError` naming the known ones."""
    if family not in FAMILIES:
        raise ParityTrainingError(
            f"no parity training for family {family!r}: parity models need the family's "
            f"training data and architecture, which only {', '.join(FAMILIES)} ships")
    plans = {plan.name: plan for plan in digits.VARIANTS}
    if variant not in plans:
        raise ParityTrainingError(f"unknown variant {variant!r} of family {family!r}; known: "
                                  f"{', '.join(plans)}")
    return plans[variant]


def load_predictor(path: Path, fmt: str) -> Predictor:
    """An exported model (ONNX or TorchScript) as the per-server runtime loads it."""
    from model_repo.loaders import LoadSpec, load_model

    model, _ = load_model(LoadSpec(weights=path, format=fmt, input_dims=digits_input_dims()))
    return model.infer


def digits_input_dims() -> tuple[int, int, int]:
    """One digits query's shape (channel, height, width)."""
    return (1, 8, 8)


def deployed_path(digits_dir: Path, plan: digits.VariantPlan) -> Path:
    """The deployed variant's file, in the format its family manifest lists."""
    return digits_dir / f"{plan.name}.{_SUFFIX[plan.export]}"


def fit_validation_split(x: np.ndarray, y: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fit queries, validation queries, validation labels) from the training split, seeded."""
    from sklearn.model_selection import train_test_split

    x_fit, x_val, _, y_val = train_test_split(x, y, test_size=VALIDATION_FRACTION,
                                              random_state=digits.SEED, stratify=y)
    return x_fit, x_val, y_val


def cache_key(deployed: Path, k: int, encoder: EncoderKind, settings: TrainingSettings) -> str:
    """Changes when anything a parity model is trained from changes."""
    digest = hashlib.sha256(digits.cache_key().encode())
    package = Path(__file__).resolve().parent
    for source in _SOURCES:
        digest.update((package / source).read_bytes())
    digest.update(hashlib.sha256(deployed.read_bytes()).digest())
    digest.update(json.dumps({"k": k, "encoder": encoder.value,
                              "settings": settings.model_dump()}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def read_metadata(path: Path) -> ParityMetadata | None:
    """The metadata at ``path``, or None when it is missing or unreadable."""
    try:
        return ParityMetadata.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError):
        return None


def _cached(out_dir: Path, name: str, key: str) -> ParityMetadata | None:
    metadata = read_metadata(out_dir / f"{name}.json")
    if metadata is None or metadata.key != key:
        return None
    if not all((out_dir / file).is_file() for file in metadata.files.values()):
        return None
    return metadata


def train_parity_model(variant: str, k: int, encoder: EncoderKind | str = EncoderKind.ADDITION,
                       *, family: str = digits.FAMILY, digits_dir: Path, out_dir: Path,
                       settings: TrainingSettings | None = None,
                       force: bool = False) -> ParityMetadata:
    """Train (or find cached), export and describe the parity model of ``variant`` for ``k``.

    The digits family is trained first into ``digits_dir`` if it is not there (cached too).
    """
    import torch

    plan = variant_plan(family, variant)
    if k not in KS:
        raise ParityTrainingError(f"k must be one of {', '.join(map(str, KS))}, got {k}")
    kind = EncoderKind(encoder)
    settings = settings or default_settings(variant)
    digits.train_digits(digits_dir)
    deployed = deployed_path(digits_dir, plan)
    name = parity_name(variant, k, kind)
    key = cache_key(deployed, k, kind, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    cached = None if force else _cached(out_dir, name, key)
    if cached is not None:
        logger.info("parity model %s already trained in %s", name, out_dir)
        return cached
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights on every machine, as the digits training
    try:
        started = time.perf_counter()
        x_train, y_train, _, _ = digits.load_split()
        x_fit, x_val, y_val = fit_validation_split(x_train, y_train)
        trained = train_parity(plan, load_predictor(deployed, plan.export), x_fit,
                               (x_val, y_val), k, kind, settings)
        train_s = time.perf_counter() - started
        onnx_path, script_path = digits.export(trained.model, out_dir, name)
    finally:
        torch.set_num_threads(threads)
    metadata = ParityMetadata(
        name=name, family=family, deployed_variant=variant, k=k, encoder=kind,
        architecture=f"{plan.kind} {list(plan.widths)}", format=plan.export,
        files={"onnx": onnx_path.name, "torchscript": script_path.name},
        input_name=digits.INPUT_NAME, output_name=digits.OUTPUT_NAME,
        input_dims=list(digits_input_dims()), output_dims=[10],
        training=TrainingRecord(settings=settings, steps_run=trained.steps_run,
                                best_step=trained.best_step,
                                validation_degraded_acc=round(trained.validation_accuracy, 4),
                                fit_queries=len(x_fit), validation_queries=len(x_val),
                                train_s=round(train_s, 2)),
        key=key)
    (out_dir / f"{name}.json").write_text(metadata.model_dump_json(indent=2) + "\n",
                                          encoding="utf-8")
    logger.info("trained parity model %s (k=%d, %s) in %.1f s: validation A_d %.4f", name, k,
                kind, train_s, trained.validation_accuracy)
    return metadata
