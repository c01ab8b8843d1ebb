"""Family manifests: a good one resolves; each kind of mistake names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_repo.family_manifest import ManifestError, load_family_manifest, parse_pbtxt_config

onnx = pytest.importorskip("onnx")


def write_onnx(path: Path, features: int = 4, classes: int = 3, input_name: str = "x",
               output_name: str = "y") -> Path:
    """A one-layer ONNX classifier (Gemm), batch dimension dynamic."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((features, classes), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", [input_name, "w"], [output_name])], "g",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])],
        [weights])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def write_manifest(folder: Path, doc: dict, name: str = "family.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def family_dir(tmp_path: Path) -> Path:
    write_onnx(tmp_path / "small.onnx")
    write_onnx(tmp_path / "large.onnx")
    np.savez(tmp_path / "eval.npz", inputs=np.zeros((5, 4), np.float32),
             labels=np.zeros(5, np.int64))
    return tmp_path


def good(**changes: object) -> dict:
    doc = {"family": "fam", "evaluation": {"path": "eval.npz"},
           "variants": [{"name": "fam_small", "model": "small.onnx"},
                        {"name": "fam_large", "model": "large.onnx"}]}
    doc.update(changes)
    return doc


def error_of(path: Path) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        load_family_manifest(path)
    assert str(path) in str(caught.value)
    return caught.value


def test_a_good_manifest_resolves_formats_signature_and_evaluation(family_dir: Path) -> None:
    family = load_family_manifest(write_manifest(family_dir, good()))
    assert family.family == "fam"
    assert [v.format for v in family.variants] == ["onnx", "onnx"]
    assert family.inputs[0].name == "x" and family.inputs[0].dims == (4,)
    assert family.outputs[0].dims == (3,)
    assert family.evaluation is not None and family.evaluation.count == 5


def test_yaml_manifests_are_read_too(family_dir: Path) -> None:
    text = ("family: fam\nevaluation: {path: eval.npz}\nvariants:\n"
            "  - {name: fam_small, model: small.onnx}\n")
    path = family_dir / "family.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_family_manifest(path).variants[0].name == "fam_small"


def test_a_missing_model_file_names_the_variant_field(family_dir: Path) -> None:
    doc = good(variants=[{"name": "fam_small", "model": "small.onnx"},
                         {"name": "fam_gone", "model": "gone.onnx"}])
    error = error_of(write_manifest(family_dir, doc))
    assert error.field == "variants[1].model"
    assert "gone.onnx" in str(error)


def test_a_missing_required_field_is_named(family_dir: Path) -> None:
    error = error_of(write_manifest(family_dir, {"variants": good()["variants"]}))
    assert error.field == "family"


def test_an_unknown_field_is_named(family_dir: Path) -> None:
    doc = good()
    doc["variants"][0]["weights"] = "x"
    assert error_of(write_manifest(family_dir, doc)).field == "variants[0].weights"


def test_signatures_that_differ_between_variants_are_refused(family_dir: Path) -> None:
    write_onnx(family_dir / "other.onnx", features=5)
    doc = good(variants=[{"name": "fam_small", "model": "small.onnx"},
                         {"name": "fam_other", "model": "other.onnx"}])
    error = error_of(write_manifest(family_dir, doc))
    assert error.field == "variants[1].model"
    assert "differ" in str(error) and "fam_other" in str(error)


def test_an_output_name_that_differs_is_refused(family_dir: Path) -> None:
    write_onnx(family_dir / "renamed.onnx", output_name="probs")
    doc = good(variants=[{"name": "fam_small", "model": "small.onnx"},
                         {"name": "fam_renamed", "model": "renamed.onnx"}])
    assert "outputs" in str(error_of(write_manifest(family_dir, doc)))


def test_an_unknown_backend_in_a_triton_directory_is_named(family_dir: Path) -> None:
    model_dir = family_dir / "exotic"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text('name: "exotic"\nbackend: "quantum"\n')
    doc = good(variants=[{"name": "fam_exotic", "model": "exotic"}])
    error = error_of(write_manifest(family_dir, doc))
    assert error.field == "variants[0].model"
    assert "unknown backend 'quantum'" in str(error)


def test_an_onnxruntime_directory_is_wrapped_from_its_model_file(family_dir: Path) -> None:
    model_dir = family_dir / "ort"
    (model_dir / "1").mkdir(parents=True)
    write_onnx(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text('name: "ort"\nplatform: "onnxruntime_onnx"\n')
    family = load_family_manifest(write_manifest(family_dir, good(
        variants=[{"name": "fam_ort", "model": "ort"}])))
    assert family.variants[0].format == "onnx"
    assert family.variants[0].path == (model_dir / "1" / "model.onnx").resolve()


def test_an_unknown_file_suffix_asks_for_the_format(family_dir: Path) -> None:
    (family_dir / "model.bin").write_bytes(b"\0")
    doc = good(variants=[{"name": "fam_bin", "model": "model.bin"}])
    error = error_of(write_manifest(family_dir, doc))
    assert error.field == "variants[0].model" and "format" in str(error)


def test_torchscript_needs_a_declared_signature(family_dir: Path) -> None:
    (family_dir / "model.pt").write_bytes(b"\0")
    doc = good(variants=[{"name": "fam_ts", "model": "model.pt"}])
    assert error_of(write_manifest(family_dir, doc)).field == "inputs"


def test_an_evaluation_set_of_the_wrong_shape_is_named(family_dir: Path) -> None:
    np.savez(family_dir / "bad.npz", inputs=np.zeros((5, 7), np.float32),
             labels=np.zeros(5, np.int64))
    doc = good(evaluation={"path": "bad.npz"})
    assert error_of(write_manifest(family_dir, doc)).field == "evaluation.inputs"


def test_an_evaluation_key_that_is_absent_is_named(family_dir: Path) -> None:
    doc = good(evaluation={"path": "eval.npz", "labels": "targets"})
    error = error_of(write_manifest(family_dir, doc))
    assert error.field == "evaluation.labels" and "targets" in str(error)


def test_without_an_evaluation_set_each_variant_declares_its_accuracy(family_dir: Path) -> None:
    doc = good()
    del doc["evaluation"]
    assert error_of(write_manifest(family_dir, doc)).field == "variants[0].accuracy"
    doc["variants"] = [{**v, "accuracy": 0.9} for v in doc["variants"]]
    family = load_family_manifest(write_manifest(family_dir, doc))
    assert [v.declared_accuracy for v in family.variants] == [0.9, 0.9]


def test_a_declared_accuracy_above_one_is_refused(family_dir: Path) -> None:
    doc = good()
    doc["variants"][0]["accuracy"] = 93.5
    assert error_of(write_manifest(family_dir, doc)).field == "variants[0].accuracy"


def test_duplicate_and_invalid_variant_names_are_named(family_dir: Path) -> None:
    doc = good(variants=[{"name": "fam_small", "model": "small.onnx"},
                         {"name": "fam_small", "model": "large.onnx"}])
    assert error_of(write_manifest(family_dir, doc)).field == "variants[1].name"
    doc = good(variants=[{"name": "app__v", "model": "small.onnx"}])
    assert error_of(write_manifest(family_dir, doc)).field == "variants[0].name"


def test_a_manifest_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "family.json"
    path.write_text("{not json", encoding="utf-8")
    assert "not valid json" in str(error_of(path)).lower()


def test_the_pbtxt_reader_takes_nested_dims_and_repeated_blocks() -> None:
    config = parse_pbtxt_config(
        'name: "m"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "a" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]\n'
        'output { name: "b" data_type: TYPE_INT64 dims: [ -1 ] }\n'
        'instance_group [ { kind: KIND_CPU } ]\n')
    assert config["backend"] == "python" and config["max_batch_size"] == 4
    assert config["input"][0].dims == (1, 8, 8)
    assert config["output"][0].data_type == "INT64" and config["output"][0].dims == (-1,)


def test_the_import_command_reports_a_bad_manifest_and_exits_2(
        family_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    from understudy.cli import main as cli

    doc = good(variants=[{"name": "fam_small", "model": "missing.onnx"}])
    path = write_manifest(family_dir, doc)
    assert cli.main(["models", "import", str(path), "--check"]) == 2
    assert f"{path}: variants[0].model: no such file" in caplog.text
    assert cli.main(["models", "import", str(write_manifest(family_dir, good())),
                     "--check"]) == 0
