"""An imported family in the store: artifacts, manifests, the wrapped config, the runtime's load,
the profile document and how the controller's family loader finds it."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pytest

from deploy.samples import LabelledSamples, check, prediction_summary
from model_repo.artifacts import find_variant, list_store
from model_repo.family_manifest import load_family_manifest
from model_repo.imported import (
    VariantResult,
    family_document,
    pack_directory,
    unpack_triton_directory,
    write_family,
    write_profile,
)
from model_repo.loaders import load_model, load_spec
from model_repo.profiles import Measurement, ProfileError, load_families

pytest.importorskip("onnxruntime")
from tests.unit.test_family_manifest import write_onnx  # noqa: E402


@pytest.fixture
def family(tmp_path: Path):  # noqa: ANN201 - an ImportFamily
    write_onnx(tmp_path / "small.onnx")
    write_onnx(tmp_path / "large.onnx")
    inputs = np.eye(4, dtype=np.float32)[[0, 1, 2, 0, 1]]
    np.savez(tmp_path / "eval.npz", inputs=inputs, labels=np.array([0, 1, 2, 0, 1]))
    (tmp_path / "family.json").write_text(json.dumps({
        "family": "fam", "max_batch_size": 4, "evaluation": {"path": "eval.npz"},
        "variants": [{"name": "fam_small", "model": "small.onnx"},
                     {"name": "fam_large", "model": "large.onnx"}]}))
    return load_family_manifest(tmp_path / "family.json")


def measurement(load_s: float, resident_mb: float,
                overhead_ms: float | None = 0.4) -> Measurement:
    return Measurement(host="h", server_type="testbed", artifact_scale=1.0, weights_mb=0.001,
                       repeats=1, load_s=load_s, load_s_runs=[load_s], unload_s=0.01,
                       latency_p50_ms=0.5, latency_p99_ms=1.0, latency_requests=10,
                       resident_mb=resident_mb, measured_on=date.today().isoformat(),
                       latency_ms_by_batch={"1": 0.5}, overhead_ms=overhead_ms)


def test_the_store_holds_each_variant_with_its_manifest_and_config(family, tmp_path: Path) -> None:
    store = tmp_path / "store"
    manifests = write_family(store, family)
    assert [m.format for m in manifests] == ["onnx", "onnx"]
    entry = find_variant(store, "fam_small")
    assert entry.manifest.weights_file == "model.onnx" and not entry.manifest.synthetic
    assert (entry.directory / "model.onnx").is_file()
    assert entry.manifest.inputs[0].name == "x" and entry.manifest.outputs[0].dims == (3,)
    assert {e.variant for e in list_store(store)} == {"fam_small", "fam_large"}
    assert (store / "fam" / "evaluation.npz").is_file()
    config = (entry.directory / "config.pbtxt").read_text()
    assert 'name: "x" data_type: TYPE_FP32 dims: [ 4 ]' in config
    assert 'key: "format" value: { string_value: "onnx" }' in config

    # What a runtime worker does with that config: load with onnxruntime and answer.
    parameters = dict(line.split('"')[1::2][:2] for line in config.splitlines()
                      if line.startswith("parameters"))
    model, report = load_model(load_spec(parameters, entry.directory))
    assert report.read_s >= 0
    out = model.infer(np.eye(4, dtype=np.float32)[:2])
    assert out.shape == (2, 3)


def test_the_profile_document_marks_measured_and_declared_accuracy(family,
                                                                   tmp_path: Path) -> None:
    store = tmp_path / "store"
    small, large = write_family(store, family)
    results = [VariantResult(small, measurement(0.01, 4.0), top1=0.8),
               VariantResult(large, measurement(0.02, 9.0), top1=None, declared_top1=0.9)]
    doc = family_document("fam", results, "family.json")
    by_name = {v["name"]: v for v in doc["variants"]}
    assert by_name["fam_small"]["accuracy_source"] == "measured"
    assert by_name["fam_large"]["accuracy_source"] == "declared"
    assert by_name["fam_large"]["accuracy"] == 1.0
    assert by_name["fam_small"]["accuracy"] == pytest.approx(0.8 / 0.9, abs=1e-6)
    assert by_name["fam_small"]["top1_pct"] == pytest.approx(80.0)
    assert by_name["fam_small"]["memory_mb"] == 4.0
    assert by_name["fam_small"]["latency_ms"] == {"reference": 0.5, "testbed": 0.5}

    write_profile(store, doc)
    families = load_families(stores=[store])
    assert "fam" in families and "mobilenet_v3" in families
    assert families["fam"].smallest.name == "fam_small"
    assert families["fam"].most_accurate.name == "fam_large"
    assert "fam" not in load_families()


def test_a_store_family_may_not_shadow_a_packaged_one(family, tmp_path: Path) -> None:
    store = tmp_path / "store"
    small, _ = write_family(store, family)
    doc = family_document("mobilenet_v3", [VariantResult(small, measurement(0.01, 4.0), 0.8)],
                          "family.json")
    (store / "mobilenet_v3").mkdir()
    write_profile(store, doc)
    with pytest.raises(ProfileError, match="packaged"):
        load_families(stores=[store])


def test_a_triton_directory_is_packed_reproducibly_and_unpacked_renamed(tmp_path: Path) -> None:
    source = tmp_path / "py_model"
    (source / "1").mkdir(parents=True)
    (source / "1" / "model.py").write_text("# a python backend model\n")
    (source / "config.pbtxt").write_text('name: "py_model"\nbackend: "python"\n')
    pack_directory(source, tmp_path / "a.tar")
    (source / "1" / "model.py").touch()  # a newer mtime: the same bytes
    pack_directory(source, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    unpack_triton_directory(tmp_path / "a.tar", tmp_path / "out", "app__py_model")
    assert (tmp_path / "out" / "1" / "model.py").is_file()
    assert 'name: "app__py_model"' in (tmp_path / "out" / "config.pbtxt").read_text()


def test_labelled_samples_walk_the_set_and_check_answers(tmp_path: Path) -> None:
    (tmp_path / "fam").mkdir()
    np.savez(tmp_path / "fam" / "evaluation.npz", inputs=np.eye(3, dtype=np.float32),
             labels=np.array([0, 1, 2]))
    samples = LabelledSamples.from_store(tmp_path, "fam", seed=3)
    assert samples is not None and len(samples) == 3
    seen = {samples.next()[1] for _ in range(3)}
    assert seen == {0, 1, 2}  # one pass covers the set
    image, label = samples.next()
    assert image.shape == (1, 3)
    assert check(image, label) == {"label": label, "predicted": label, "correct": True}
    assert LabelledSamples.from_store(tmp_path, "synthetic") is None

    requests = tmp_path / "requests"
    requests.mkdir()
    records = [{"app_id": "a", "ok": True, "variant": "v1", "correct": True},
               {"app_id": "a", "ok": True, "variant": "v1", "correct": False},
               {"app_id": "a", "ok": False, "variant": None},
               {"app_id": "b", "ok": True, "variant": "v2", "correct": True}]
    (requests / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records[:3]) + "\n")
    (requests / "b.jsonl").write_text(json.dumps(records[3]) + "\n")
    summary = prediction_summary(requests)
    assert summary["predictions_checked"] == 3 and summary["correct"] == 2
    assert summary["by_variant"]["v1"] == {"checked": 2, "correct": 1, "top1": 0.5}


def test_an_import_is_up_to_date_until_an_artifact_changes(family, tmp_path: Path) -> None:
    from agent.model_import import up_to_date

    store = tmp_path / "store"
    assert not up_to_date(store, family)
    small, large = write_family(store, family)
    assert not up_to_date(store, family)  # written, not yet profiled
    write_profile(store, family_document("fam", [
        VariantResult(small, measurement(0.01, 4.0), 0.8),
        VariantResult(large, measurement(0.02, 9.0), 0.9)], "family.json"))
    assert up_to_date(store, family)
    # A profile from before the serving path was measured is imported again.
    write_profile(store, family_document("fam", [
        VariantResult(small, measurement(0.01, 4.0, overhead_ms=None), 0.8),
        VariantResult(large, measurement(0.02, 9.0), 0.9)], "family.json"))
    assert not up_to_date(store, family)
    write_profile(store, family_document("fam", [
        VariantResult(small, measurement(0.01, 4.0), 0.8),
        VariantResult(large, measurement(0.02, 9.0), 0.9)], "family.json"))
    assert up_to_date(store, family)
    from onnx import load, save

    model = load(str(family.variants[1].path))  # retrained: other bytes, same signature
    model.producer_name = "retrained"
    save(model, str(family.variants[1].path))
    assert not up_to_date(store, family)
