"""The early-exit family: exit logic, the runtime's extra outputs, training and its cache."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from model_repo import digits_ee  # noqa: E402
from model_repo.artifacts import render_model_config  # noqa: E402
from model_repo.early_exit import is_staged, run_staged  # noqa: E402
from model_repo.early_exit_net import EarlyExitNet  # noqa: E402
from model_repo.family_manifest import ManifestError, load_family_manifest  # noqa: E402
from model_repo.loaders import LoadSpec, load_spec  # noqa: E402
from model_repo.runtime import (  # noqa: E402
    InProcessRunner,
    _outputs_from,
    extras_field,
    parse_extras,
)
from understudy.wire.artifacts import Manifest, TensorSpec  # noqa: E402

STAGES = 3


def _net(seed: int = 0) -> EarlyExitNet:
    torch.manual_seed(seed)
    return EarlyExitNet(channels=8, stages=STAGES, convs=1).eval()


def _inputs(n: int = 16) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(3).random((n, 1, 8, 8), dtype=np.float32))


def _confidences(net: EarlyExitNet, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return np.stack([torch.softmax(o, 1).amax(1).numpy() for o in net.all_exits(x)])


def _count_stage_calls(net: EarlyExitNet) -> list[int]:
    """Items each stage's block computes, counted by forward hooks."""
    counts = [0] * STAGES
    for index, stage in enumerate(net.stages):
        stage.block.register_forward_hook(
            lambda _m, args, _out, i=index: counts.__setitem__(i, counts[i] + args[0].shape[0]))
    return counts


def test_every_request_leaves_at_the_first_exit_and_later_blocks_never_run() -> None:
    net = _net()
    net.set_thresholds([0.0] * STAGES)
    counts = _count_stage_calls(net)
    with torch.inference_mode():
        _, exits = net(_inputs())
    assert exits.tolist() == [0] * 16
    assert counts == [16, 0, 0]


def test_a_request_leaves_at_its_first_confident_exit() -> None:
    net = _net()
    x = _inputs()
    confidence = _confidences(net, x)
    # Thresholds at each exit's median confidence: about half leave at each exit.
    thresholds = [float(np.median(confidence[i])) for i in range(STAGES)]
    net.set_thresholds(thresholds)
    expected = []
    for item in range(16):
        leaves = [i for i in range(STAGES - 1) if confidence[i, item] >= thresholds[i]]
        expected.append(leaves[0] if leaves else STAGES - 1)
    with torch.inference_mode():
        every = net.all_exits(x)
    counts = _count_stage_calls(net)
    with torch.inference_mode():
        logits, exits = net(x)
    assert exits.tolist() == expected
    assert len(set(expected)) > 1, "the test needs a spread of exits"
    # A request's logits are its exit's, and a stage computes only the requests still inside.
    for item, taken in enumerate(expected):
        np.testing.assert_allclose(logits[item].numpy(), every[taken][item].numpy(), rtol=1e-5,
                                   atol=1e-6)
    assert counts == [sum(e >= i for e in expected) for i in range(STAGES)]


def test_the_runtime_stages_a_scripted_model_as_its_forward_and_times_each_exit() -> None:
    net = _net(1)
    x = _inputs()
    confidence = _confidences(net, x)
    net.set_thresholds([float(np.median(confidence[i])) for i in range(STAGES)])
    scripted = torch.jit.script(net)
    assert is_staged(scripted) and not is_staged(torch.nn.Linear(2, 2))
    with torch.inference_mode():
        logits, exits = scripted(x)
    ticks = itertools.count()
    result = run_staged(scripted, x, clock=lambda: next(ticks) * 1e-3)  # 1 ms per stage
    np.testing.assert_allclose(result.logits, logits.numpy(), rtol=1e-5, atol=1e-6)
    assert result.exits.tolist() == exits.tolist()
    # Each request's time is the end of the stage it left at: stage i ends at (i + 1) ms.
    assert result.exec_us.tolist() == [1000.0 * (e + 1) for e in exits.tolist()]
    assert result.stage_items == [sum(e >= i for e in exits.tolist())
                                  for i in range(max(exits.tolist()) + 1)]


def test_calibration_spreads_the_exits_as_asked() -> None:
    rng = np.random.default_rng(0)
    probabilities = [rng.dirichlet(np.ones(10) * 0.3, size=1000) for _ in range(4)]
    mix = (0.5, 0.2, 0.1, 0.2)
    thresholds = digits_ee.calibrate(probabilities, mix)
    assert thresholds[-1] == 0.0
    inside = np.ones(1000, dtype=bool)
    shares = []
    for probs, threshold in zip(probabilities, thresholds, strict=True):
        leave = inside & (probs.max(1) >= threshold)
        shares.append(leave.mean())
        inside &= ~leave
    np.testing.assert_allclose(shares, mix, atol=0.01)
    with pytest.raises(ValueError):
        digits_ee.calibrate(probabilities, (0.5, 0.5))


def _saved(tmp_path: Path) -> Path:
    net = _net(2)
    net.set_thresholds([0.5, 0.5, 0.0])
    path = tmp_path / "ee.pt"
    torch.jit.script(net).save(str(path))
    return path


def test_the_runtime_answers_the_extra_outputs_of_the_config(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    load = load_spec({"format": "torchscript", "weights": path.name, "input_dims": "[1, 8, 8]",
                      "extra_outputs": "exit_index,exec_us"}, tmp_path)
    assert load.extra_outputs == ("exit_index", "exec_us")
    runner = InProcessRunner(load=load)
    x = _inputs(5).numpy()
    logits, exits, exec_us = runner.infer_outputs(x)
    assert logits.shape == (5, 10) and logits.dtype == np.float32
    assert exits.shape == (5, 1) and exits.dtype == np.int32
    assert exec_us.shape == (5, 1) and exec_us.dtype == np.float32 and (exec_us > 0).all()
    np.testing.assert_array_equal(runner.infer(x), logits)
    # A later exit never answered sooner than an earlier one within a batch.
    order = np.argsort(exits[:, 0], kind="stable")
    assert np.all(np.diff(exec_us[order, 0]) >= 0)
    # Without extras the same model answers its logits alone.
    plain = InProcessRunner(load=LoadSpec(weights=path, format="torchscript",
                                          input_dims=(1, 8, 8)))
    assert len(plain.infer_outputs(x)) == 1


@pytest.mark.parametrize("parameters", [
    {"format": "torchscript", "weights": "m.pt", "extra_outputs": "exit_index,bogus"},
    {"format": "synthetic", "weights": "w.pt", "network_spec": "{\"width\": 8, "
     "\"hidden_layers\": 1, \"num_classes\": 4, \"image_side\": 16, \"seed\": 1}",
     "extra_outputs": "exec_us"},
])
def test_unknown_or_unsupported_extra_outputs_are_refused(parameters: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        load_spec(parameters, Path("."))


def test_the_wire_carries_the_extras_after_the_models_output() -> None:
    extras = parse_extras(extras_field(("exit_index", "exec_us")))
    assert extras == [("exit_index", "INT32"), ("exec_us", "FP32")]
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    exits = np.array([[0], [2]], dtype=np.int32)
    times = np.array([[1.5], [9.0]], dtype=np.float32)
    payload = bytearray(logits.tobytes() + exits.tobytes() + times.tobytes())
    got = _outputs_from({"shape": [2, 3], "extras": 2}, payload, extras)
    np.testing.assert_array_equal(got[0], logits)
    np.testing.assert_array_equal(got[1], exits)
    np.testing.assert_array_equal(got[2], times)
    assert got[1].dtype == np.int32


def test_the_config_declares_the_extras_and_asks_the_runtime_for_them() -> None:
    manifest = Manifest(
        family="f", variant="v", profiled_size_mb=1, scale=1, weights_mb=1,
        weights_sha256="0" * 64, format="torchscript", weights_file="model.pt", max_batch_size=8,
        inputs=(TensorSpec(name="image", data_type="FP32", dims=(1, 8, 8)),),
        outputs=(TensorSpec(name="logits", data_type="FP32", dims=(10,)),
                 TensorSpec(name="exit_index", data_type="INT32", dims=(1,)),
                 TensorSpec(name="exec_us", data_type="FP32", dims=(1,))))
    config = render_model_config("v", manifest, "model.pt", backend="understudy")
    assert 'name: "exit_index" data_type: TYPE_INT32 dims: [ 1 ]' in config
    assert 'key: "extra_outputs" value: { string_value: "exit_index,exec_us" }' in config
    assert 'key: "output" value: { string_value: "logits" }' in config


def _tiny_plans() -> tuple[digits_ee.VariantPlan, ...]:
    return (digits_ee.VariantPlan("tiny_ee", 8, 2, 1, 1, 0.01, (0.6, 0.4)),)


def test_training_writes_an_importable_dynamic_family_and_is_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digits_ee, "VARIANTS", _tiny_plans())
    record = digits_ee.train_early_exit(tmp_path)
    variant = record["variants"]["tiny_ee"]
    assert record["dynamic"] == "early_exit" and variant["exits"] == 2
    assert abs(sum(variant["exit_fractions"]) - 1.0) < 1e-6
    assert variant["exit_fractions"][0] > 0.3, "calibrated on validation: a spread mix"
    assert 0.5 < variant["top1"] <= 1.0 and len(variant["top1_per_exit_head"]) == 2
    family = load_family_manifest(tmp_path / digits_ee.MANIFEST_NAME)
    assert family.family == "digits_ee"
    assert [o.name for o in family.outputs] == ["logits", "exit_index", "exec_us"]
    # The second call reuses the files: nothing is trained again.
    monkeypatch.setattr(digits_ee, "train", lambda *_: pytest.fail("trained again"))
    assert digits_ee.train_early_exit(tmp_path) == record


def test_a_manifest_may_list_only_the_runtimes_extras(tmp_path: Path) -> None:
    _saved(tmp_path).rename(tmp_path / "m.pt")
    (tmp_path / "f.yaml").write_text(
        "family: f\ninputs: [{name: image, data_type: FP32, dims: [1, 8, 8]}]\n"
        "outputs: [{name: logits, data_type: FP32, dims: [10]},"
        " {name: exit_index, data_type: FP32, dims: [1]}]\n"
        "variants: [{name: v, model: m.pt, accuracy: 0.9}]\n", encoding="utf-8")
    with pytest.raises(ManifestError, match="exit_index"):
        load_family_manifest(tmp_path / "f.yaml")


def test_training_refuses_fewer_than_one_epoch(tmp_path: Path) -> None:
    from model_repo import digits_ee

    with pytest.raises(ValueError, match="epochs"):
        digits_ee.train_early_exit(tmp_path, epochs=0)
