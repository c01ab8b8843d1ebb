"""``understudy parity train``: parity models (ParM) for a deployed variant (``docs/parity.md``).

``train`` trains, for each k asked, the parity model of one deployed variant of the digits
family and exports it beside its metadata; a parity model whose inputs have not changed is
not trained again (``--force`` trains it anyway). With ``--store`` they are then written into
that artifact store, where the controller places them from.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_OUT = Path("runs/parity")
DEFAULT_DIGITS_DIR = Path("runs/digits")
KS = (2, 3, 4)
ENCODERS = ("addition", "concatenation")


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``parity`` actions and options to its command parser."""
    actions = parser.add_subparsers(dest="parity_command", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train", help="train the parity models of a deployed variant (one per k), export them "
                      "to ONNX and TorchScript with their metadata")
    train.add_argument("--family", default="digits",
                       help="the deployed model's family (default digits, the only one with "
                            "training data)")
    train.add_argument("--variant", required=True,
                       help="the deployed variant the parity models protect, e.g. digits_cnn")
    train.add_argument("--k", type=int, nargs="+", choices=KS, default=list(KS), metavar="K",
                       help="queries per coding group, one parity model each (2, 3 and/or 4; "
                            "default all three)")
    train.add_argument("--encoder", choices=ENCODERS, default="addition",
                       help="addition (the sum of the k queries, default) or concatenation "
                            "(the k images downsampled and tiled into one)")
    train.add_argument("--steps", type=int, default=None,
                       help="the most training iterations (default: the variant's budget)")
    train.add_argument("--out", type=Path, default=DEFAULT_OUT,
                       help=f"output folder (default {DEFAULT_OUT})")
    train.add_argument("--digits-dir", type=Path, default=DEFAULT_DIGITS_DIR,
                       help="where the digits family is (trained there first if missing; "
                            f"default {DEFAULT_DIGITS_DIR})")
    train.add_argument("--force", action="store_true", help="train again even if cached")
    train.add_argument("--store", type=Path, default=None,
                       help="then write them into this artifact store (as the family "
                            "<family>-parity), where the controller places them from, e.g. "
                            "runs/artifacts")


def run(options: argparse.Namespace) -> int:
    """Dispatch ``parity`` actions; returns an exit status."""
    from parity.errors import ParityError

    try:
        return _train(options)
    except (ParityError, ValueError, OSError) as exc:  # the store's errors are ValueErrors
        logger.error("%s", exc)
        return 2


def _train(options: argparse.Namespace) -> int:
    from parity.artifacts import train_parity_model
    from parity.errors import ParityTrainingError
    from parity.training import default_settings

    settings = default_settings(options.variant)
    if options.steps is not None:
        if options.steps <= 0:
            raise ParityTrainingError(f"--steps must be positive, got {options.steps}")
        settings = settings.model_copy(update={"steps": options.steps})
    names = []
    for k in sorted(set(options.k)):
        metadata = train_parity_model(options.variant, k, options.encoder, family=options.family,
                                      digits_dir=options.digits_dir, out_dir=options.out,
                                      settings=settings, force=options.force)
        record = metadata.training
        sys.stdout.write(
            f"{metadata.name:32} k={k} {metadata.encoder.value:13} {record.steps_run:6d} steps  "
            f"validation A_d {record.validation_degraded_acc:.4f}  "
            f"{options.out / metadata.files[metadata.format]}\n")
        names.append(metadata.name)
    if options.store is not None:
        from parity.store import import_parity_models

        stored = import_parity_models(options.out, options.store, names)
        sys.stdout.write(f"in the artifact store {options.store}: {', '.join(stored)}\n")
    return 0
