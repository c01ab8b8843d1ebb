"""Accuracy of parity models (ParM §5): available, degraded (reconstructed) and default response.

Usage: ``python bench/parm_accuracy.py [--variant digits_cnn] [--encoders addition,concatenation]
[--groupings 10]``.

1. The digits family is trained (cached in ``--digits-dir``); for each encoder and k = 2, 3, 4
   the parity model of ``--variant`` is trained from the training split (``understudy parity
   train``'s code, cached in ``--out``).
2. On the held-out split (the family's evaluation set, never seen in training):
   - ``available_acc`` (A_a): the deployed variant's top-1, through its exported file;
   - ``degraded_acc_k<k>`` (A_d): the held-out digits are placed at random into groups of k,
     each group is encoded and sent through the parity model's exported file, and every member
     of every group is made unavailable in turn and rebuilt by the subtraction decoder from the
     parity output and the k - 1 other deployed outputs; A_d is the top-1 of the rebuilt
     outputs' argmax against the true labels, over ``--groupings`` random groupings;
   - ``default_acc``: answering the training split's most common class to every query (the
     default response of a server without redundancy, §5.2.2).
   Both models run as the per-server runtime runs them (``model_repo.loaders``), in the format
   the family manifest lists the deployed variant in.

The last line is one JSON object; the top-level ``degraded_acc_k*`` are the addition encoder's
(the paper's generic code), ``encoders`` holds every encoder's figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from model_repo import digits  # noqa: E402
from parity.artifacts import (  # noqa: E402
    KS,
    deployed_path,
    load_predictor,
    train_parity_model,
    variant_plan,
)
from parity.coding import EncoderKind  # noqa: E402
from parity.evaluation import (  # noqa: E402
    available_accuracy,
    default_accuracy,
    default_response,
    degraded_accuracy,
    overall_accuracy,
)

UNAVAILABLE_FRACTION = 0.1
"""f for the overall accuracy A_o = (1 - f) A_a + f A_d reported beside A_d (§5.1, eq. 1)."""


def measure_encoder(variant: str, encoder: EncoderKind, data: dict[str, Any],
                    options: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for k in KS:
        metadata = train_parity_model(variant, k, encoder, digits_dir=options.digits_dir,
                                      out_dir=options.out, force=options.force)
        parity = load_predictor(metadata.model_path(options.out), metadata.format)
        result = degraded_accuracy(parity, data["x_test"], data["deployed_outputs"],
                                   data["y_test"], k, encoder, groupings=options.groupings,
                                   seed=options.seed)
        figures[f"degraded_acc_k{k}"] = round(result.accuracy, 4)
        figures[f"overall_acc_k{k}"] = round(overall_accuracy(
            data["available_acc"], result.accuracy, UNAVAILABLE_FRACTION), 4)
        figures[f"reconstructions_k{k}"] = result.reconstructions
        figures[f"train_s_k{k}"] = metadata.training.train_s
        figures[f"train_steps_k{k}"] = metadata.training.steps_run
        figures[f"validation_acc_k{k}"] = metadata.training.validation_degraded_acc
    degraded = [figures[f"degraded_acc_k{k}"] for k in KS]
    figures["falling_with_k"] = all(a > b for a, b in zip(degraded, degraded[1:], strict=False))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="digits_cnn",
                        help="the deployed variant (default digits_cnn)")
    parser.add_argument("--encoders", default="addition,concatenation",
                        help="comma-separated encoders (default addition,concatenation)")
    parser.add_argument("--groupings", type=int, default=10,
                        help="random groupings of the held-out split per k (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits-dir", type=Path, default=REPO / "runs/digits")
    parser.add_argument("--out", type=Path, default=REPO / "runs/parity")
    parser.add_argument("--force", action="store_true", help="train the parity models again")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    encoders = [EncoderKind(name.strip()) for name in options.encoders.split(",") if name]
    plan = variant_plan(digits.FAMILY, options.variant)
    digits.train_digits(options.digits_dir)
    x_train, y_train, x_test, y_test = digits.load_split()
    deployed = load_predictor(deployed_path(options.digits_dir, plan), plan.export)
    outputs = deployed(x_test)
    data = {"x_test": x_test, "y_test": y_test, "deployed_outputs": outputs,
            "available_acc": available_accuracy(outputs, y_test)}
    per_encoder = {encoder.value: measure_encoder(options.variant, encoder, data, options)
                   for encoder in encoders}
    result: dict[str, Any] = {
        "variant": options.variant, "format": plan.export, "held_out": len(y_test),
        "groupings": options.groupings,
        "available_acc": round(data["available_acc"], 4),
        "default_acc": round(default_accuracy(y_train, y_test), 4),
        "default_class": default_response(y_train),
        "unavailable_fraction_for_overall": UNAVAILABLE_FRACTION,
    }
    headline = per_encoder.get(EncoderKind.ADDITION.value) or next(iter(per_encoder.values()))
    for k in KS:
        result[f"degraded_acc_k{k}"] = headline[f"degraded_acc_k{k}"]
    result["k2_within_10_points"] = (
        result["available_acc"] - result["degraded_acc_k2"] <= 0.10)
    result["falling_with_k"] = headline["falling_with_k"]
    result["min_margin_over_default"] = round(
        min(headline[f"degraded_acc_k{k}"] for k in KS) - result["default_acc"], 4)
    result["encoders"] = per_encoder
    print(f"deployed {options.variant}: A_a {result['available_acc']:.4f}; default response "
          f"(class {result['default_class']}) {result['default_acc']:.4f}")
    for name, figures in per_encoder.items():
        row = "  ".join(f"k={k} A_d {figures[f'degraded_acc_k{k}']:.4f}" for k in KS)
        print(f"{name:13} {row}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
