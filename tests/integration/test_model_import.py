"""A user's ONNX models, end to end: imported, served, failed over, still answering correctly.

The test makes two Triton model directories (``platform: onnxruntime_onnx``, ``1/model.onnx``)
of one family, writes its manifest and an evaluation set, and runs ``understudy models import``
as a user would: the variants are profiled on a real Triton and their top-1 is measured through
it. A testbed (Redis, controller, two agents with Triton) then registers an app of that family (the
critical app the testbed's generator makes for it), the agents fetching the ONNX files from the
controller; the app's server is SIGKILLed, the app switches to its warm backup on the other
one, and its answers are checked against the labels before and after.

Both variants compute ``logits = x`` (through a wide hidden layer for the larger one), and the
label of an input is its argmax: every answer of either variant is correct, so a correct answer
after the failure proves the backup served the real model. Neither computes anything measurable
beyond the serving path (the import measures that path with a probe), so the larger one, the
app's primary, is larger only in memory, and the smaller one is its warm backup: the kill is
answered by a warm switch. Their tensors are named ``image``
and ``logits``, which the SDK sends and reads; a second family, one ONNX file whose tensors are
named ``features`` and ``scores``, is imported beside it to show that a model keeps its own
names through the native backend (its top-1 is measured through Triton with them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology
from understudy.client import UnderstudyClient

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
FAMILY = "tinyonnx"
CUSTOM = "customnames"
FEATURES = 6


def _onnx_identity(path: Path, hidden: int, names: tuple[str, str] = ("image", "logits")) -> None:
    """``output = (x @ A) @ B`` with ``A @ B`` the identity (A: FEATURES x hidden)."""
    from onnx import TensorProto, helper, numpy_helper

    source, target = names
    a = np.zeros((FEATURES, hidden), np.float32)
    a[:, :FEATURES] = np.eye(FEATURES)
    b = a.T.copy()
    graph = helper.make_graph(
        [helper.make_node("MatMul", [source, "a"], ["h"]),
         helper.make_node("MatMul", ["h", "b"], [target])], "identity",
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info(target, TensorProto.FLOAT, ["batch", FEATURES])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def _model_directory(root: Path, name: str, hidden: int) -> Path:
    directory = root / name
    (directory / "1").mkdir(parents=True)
    _onnx_identity(directory / "1" / "model.onnx", hidden)
    (directory / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "image" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n'
        f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n',
        encoding="utf-8")
    return directory


def _import(manifest: Path, store: Path, work: Path) -> None:
    result = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "models", "import", str(manifest),
         "--store", str(store), "--work-dir", str(work), "--repeats", "2",
         "--requests", "10", "--device", "cpu"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " imported: profile " in result.stdout


def _evaluation(count: int = 40, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    inputs = np.random.default_rng(seed).random((count, FEATURES), dtype=np.float32)
    return inputs, inputs.argmax(axis=1).astype(np.int64)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store after ``understudy models import`` of the test's family."""
    source = tmp_path_factory.mktemp("user-models")
    _model_directory(source, "small", hidden=FEATURES)
    _model_directory(source, "large", hidden=16384)
    inputs, labels = _evaluation()
    np.savez(source / "eval.npz", inputs=inputs, labels=labels)
    manifest = source / "family.yaml"
    manifest.write_text(
        f"family: {FAMILY}\nevaluation: {{path: eval.npz}}\nvariants:\n"
        f"  - {{name: {FAMILY}_small, model: small}}\n"
        f"  - {{name: {FAMILY}_large, model: large}}\n", encoding="utf-8")
    _onnx_identity(source / "custom.onnx", FEATURES, names=("features", "scores"))
    custom = source / "custom.json"
    custom.write_text(json.dumps({"family": CUSTOM, "evaluation": {"path": "eval.npz"},
                                  "variants": [{"name": f"{CUSTOM}_only",
                                                "model": "custom.onnx"}]}), encoding="utf-8")
    store = tmp_path_factory.mktemp("store")
    _import(manifest, store, source / "work")
    _import(custom, store, source / "work-custom")
    return store


@pytest.fixture(scope="module")
def testbed(imported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = replace(make_topology(2, 2, 1, 1.0, 0.5), families=(FAMILY,))
    bed = Testbed.up(tmp_path_factory.mktemp("importbed"), topology, artifacts=imported,
                     clients=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def test_import_profiles_and_measures_accuracy_through_triton(imported: Path) -> None:
    profile = json.loads((imported / FAMILY / "profile.json").read_text())
    assert profile["origin"] == "imported"
    variants = {v["name"]: v for v in profile["variants"]}
    assert set(variants) == {f"{FAMILY}_small", f"{FAMILY}_large"}
    for variant in variants.values():
        assert variant["accuracy_source"] == "measured"
        assert variant["top1_pct"] == pytest.approx(100.0)
        assert variant["format"] == "onnx"
        measured = variant["measured"]
        assert measured["load_s"] > 0 and measured["latency_p50_ms"] > 0
        assert measured["resident_mb"] > 0
        assert "1" in measured["latency_ms_by_batch"]
    # The wide variant's artifact is larger (its 16384-wide layers).
    assert variants[f"{FAMILY}_large"]["size_mb"] > variants[f"{FAMILY}_small"]["size_mb"]

    # Tensors named features/scores: served with those names, every answer right.
    (custom,) = json.loads((imported / CUSTOM / "profile.json").read_text())["variants"]
    assert custom["accuracy_source"] == "measured" and custom["top1_pct"] == pytest.approx(100.0)
    manifest = json.loads((imported / CUSTOM / f"{CUSTOM}_only" / "manifest.json").read_text())
    assert [t["name"] for t in manifest["inputs"] + manifest["outputs"]] == ["features", "scores"]


def _answers_correct(client: UnderstudyClient, count: int) -> tuple[int, set[str]]:
    inputs, labels = _evaluation(count, seed=7)
    correct = 0
    servers = set()
    for index in range(count):
        result = client.infer(inputs[index:index + 1], timeout_s=60.0)
        correct += int(np.asarray(result.logits).reshape(-1).argmax() == labels[index])
        servers.add(str(result.record.server_id))
    return correct, servers


def test_an_app_of_imported_models_answers_correctly_before_and_after_a_failover(
        testbed: Testbed) -> None:
    http = testbed.http
    (spec,) = testbed.state.apps
    app_id = spec["app_id"]
    assert spec["family"] == FAMILY and spec["critical"]
    # The warm plan follows the registration a moment later: wait for the backup it places.
    # Neither variant computes anything measurable beyond the serving path, so the small one
    # fits the other server's free memory within the warm budget.
    wait_until("the app's warm backup", lambda: http.get(f"/v1/apps/{app_id}").json()["backups"],
               120, 0.1)
    testbed.wait_converged(120)
    app = http.get(f"/v1/apps/{app_id}").json()
    home = app["serving"]["server_id"]
    assert app["serving"]["variant"] == f"{FAMILY}_large"  # its best variant serves
    (backup,) = app["backups"]
    assert backup["server_id"] != home and backup["variant"] == f"{FAMILY}_small"

    with UnderstudyClient(testbed.state.controller_url, app_id,
                          token_file=testbed.token_file("client")) as client:
        correct, servers = _answers_correct(client, 20)
        assert correct == 20 and servers == {home}

        since = http.get("/v1/events", params={"limit": 10000}).json()[-1]["seq"]
        testbed.fail([home])
        wait_until("the app to serve elsewhere", lambda: (
            (a := http.get(f"/v1/apps/{app_id}", timeout=5).json())["serving"] is not None
            and a["serving"]["server_id"] != home), 120, 0.1)
        events = http.get("/v1/events", params={"since": since}).json()
        kinds = [e["kind"] for e in events if e["app_id"] == app_id]
        assert kinds and kinds[0] == "warm_switch", kinds

        correct, servers = _answers_correct(client, 20)
        assert correct == 20
        assert servers == {backup["server_id"]}
