"""Training parity models: the loss falls, artifacts and metadata are written and cached, and
``understudy parity train`` exits with a status and a message on bad arguments.

The deployed model is a small untrained digits variant exported into a temporary folder (the
digits family's own training is replaced by that folder), so no test trains the family.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from model_repo import digits
from parity import artifacts
from parity.artifacts import (
    load_predictor,
    parity_name,
    read_metadata,
    train_parity_model,
)
from parity.coding import EncoderKind
from parity.errors import ParityTrainingError
from parity.training import TrainingSettings, torch_predictor, train_parity
from understudy.cli.main import main

torch = pytest.importorskip("torch")

VARIANT = "digits_mlp_xs"
TINY = TrainingSettings(steps=60, validate_every=20, patience=10, batch_size=16)


def _plan(name: str = VARIANT) -> digits.VariantPlan:
    return next(plan for plan in digits.VARIANTS if plan.name == name)


@pytest.fixture
def digits_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A digits folder holding one deployed variant (seeded, untrained), exported as ONNX."""
    folder = tmp_path / "digits"
    folder.mkdir()
    torch.manual_seed(1)
    digits.export(digits.build(_plan()).eval(), folder, VARIANT)
    monkeypatch.setattr(digits, "train_digits", lambda out_dir, force=False: {})
    return folder


def test_training_reduces_the_loss_on_a_tiny_run() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, 10, size=32)
    torch.manual_seed(3)
    deployed = torch_predictor(digits.build(_plan("digits_mlp")).eval())
    settings = TrainingSettings(steps=300, validate_every=50, patience=50, batch_size=32)
    trained = train_parity(_plan("digits_mlp"), deployed, x, (x[:32], y), 2,
                           EncoderKind.ADDITION, settings)
    assert trained.steps_run == 300
    assert len(trained.losses) == 6
    assert trained.losses[-1] < 0.5 * trained.losses[0]
    assert 0.0 <= trained.validation_accuracy <= 1.0
    assert trained.best_step in range(50, 301, 50)
    assert not trained.model.training


def test_training_stops_after_patience_validations_without_progress() -> None:
    x = np.zeros((40, 1, 8, 8), dtype=np.float32)  # nothing to learn: A_d never improves

    def deployed(batch: np.ndarray) -> np.ndarray:
        return np.zeros((len(batch), 10), dtype=np.float32)

    settings = TrainingSettings(steps=1000, validate_every=10, patience=3, batch_size=8)
    trained = train_parity(_plan(), deployed, x, (x[:12], np.zeros(12, dtype=np.int64)), 3,
                           EncoderKind.CONCATENATION, settings)
    assert trained.best_step == 10
    assert trained.steps_run == 40


@pytest.mark.parametrize("encoder", [EncoderKind.ADDITION, EncoderKind.CONCATENATION])
def test_artifacts_are_written_with_their_metadata(digits_dir: Path, tmp_path: Path,
                                                   encoder: EncoderKind) -> None:
    out = tmp_path / "parity"
    metadata = train_parity_model(VARIANT, 3, encoder, digits_dir=digits_dir, out_dir=out,
                                  settings=TINY)
    name = parity_name(VARIANT, 3, encoder)
    assert metadata.name == name
    assert name.endswith("_concat") == (encoder is EncoderKind.CONCATENATION)
    assert (metadata.family, metadata.deployed_variant, metadata.k) == ("digits", VARIANT, 3)
    assert (metadata.encoder, metadata.decoder, metadata.loss) == (encoder, "subtraction", "mse")
    assert metadata.format == "onnx"  # the deployed variant's format in the family manifest
    assert metadata.files == {"onnx": f"{name}.onnx", "torchscript": f"{name}.pt"}
    assert (metadata.input_name, metadata.output_name) == ("image", "logits")
    assert metadata.training.steps_run == 60
    assert metadata.training.fit_queries + metadata.training.validation_queries == 1347
    on_disk = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    assert on_disk["k"] == 3 and on_disk["encoder"] == encoder.value
    assert read_metadata(out / f"{name}.json") == metadata
    for fmt in ("onnx", "torchscript"):
        predict = load_predictor(out / metadata.files[fmt], fmt)
        assert predict(np.zeros((5, 1, 8, 8), dtype=np.float32)).shape == (5, 10)


def test_a_trained_parity_model_is_cached_until_its_inputs_change(
        digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "parity"
    first = train_parity_model(VARIANT, 2, digits_dir=digits_dir, out_dir=out, settings=TINY)
    calls: list[int] = []
    real = artifacts.train_parity

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(artifacts, "train_parity", counting)
    assert train_parity_model(VARIANT, 2, digits_dir=digits_dir, out_dir=out,
                              settings=TINY) == first
    assert calls == []
    longer = TINY.model_copy(update={"steps": 80})
    assert train_parity_model(VARIANT, 2, digits_dir=digits_dir, out_dir=out,
                              settings=longer).key != first.key
    train_parity_model(VARIANT, 2, digits_dir=digits_dir, out_dir=out, settings=longer,
                       force=True)
    (out / first.files["onnx"]).unlink()
    train_parity_model(VARIANT, 2, digits_dir=digits_dir, out_dir=out, settings=longer)
    assert len(calls) == 3


def test_unknown_families_variants_and_ks_are_refused(digits_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ParityTrainingError, match="no parity training for family 'resnet'"):
        train_parity_model(VARIANT, 2, family="resnet", digits_dir=digits_dir, out_dir=tmp_path)
    with pytest.raises(ParityTrainingError, match="unknown variant 'big'.*known: digits_mlp_xs"):
        train_parity_model("big", 2, digits_dir=digits_dir, out_dir=tmp_path)
    with pytest.raises(ParityTrainingError, match="k must be one of 2, 3, 4, got 5"):
        train_parity_model(VARIANT, 5, digits_dir=digits_dir, out_dir=tmp_path)


# --- the command line ---------------------------------------------------------------------------

def test_cli_trains_one_parity_model_per_k(digits_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "parity"
    status = main(["parity", "train", "--variant", VARIANT, "--k", "2", "4", "--steps", "20",
                   "--digits-dir", str(digits_dir), "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert status == 0
    assert [line.split()[0] for line in printed] == [f"{VARIANT}_parity_k2",
                                                     f"{VARIANT}_parity_k4"]
    assert "20 steps" in printed[0] and printed[0].endswith(f"{VARIANT}_parity_k2.onnx")
    assert (out / f"{VARIANT}_parity_k4.json").is_file()


@pytest.mark.parametrize(("arguments", "message"), [
    (["--variant", "nope"], "unknown variant 'nope' of family 'digits'"),
    (["--family", "resnet", "--variant", VARIANT], "no parity training for family 'resnet'"),
    (["--variant", VARIANT, "--steps", "0"], "--steps must be positive, got 0"),
])
def test_cli_bad_arguments_exit_2_with_a_message(arguments: list[str], message: str,
                                                 digits_dir: Path, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        status = main(["parity", "train", *arguments, "--digits-dir", str(digits_dir),
                       "--out", str(tmp_path / "parity")])
    assert status == 2
    assert message in caplog.text
    assert not (tmp_path / "parity").exists() or not any((tmp_path / "parity").iterdir())


@pytest.mark.parametrize(("arguments", "message"), [
    (["--variant", VARIANT, "--k", "5"], "argument --k: invalid choice: 5"),
    (["--variant", VARIANT, "--encoder", "xor"], "argument --encoder: invalid choice: 'xor'"),
    ([], "the following arguments are required: --variant"),
])
def test_cli_refuses_malformed_arguments(arguments: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["parity", "train", *arguments])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
