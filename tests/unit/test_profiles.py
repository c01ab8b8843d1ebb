"""Model-variant profiles: CSV -> JSON documents -> policy families, and the CLI over them."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from model_repo.profiles import (
    PROFILE_DIR,
    ProfileError,
    build_profiles,
    dump_document,
    load_families,
    strip_measurements,
    write_profiles,
)
from policies.model import Family, Variant
from understudy.cli import main as cli

SHARED_CSV = (Path(__file__).resolve().parents[3]
              / "shared/data/torchvision_classification.csv")

needs_csv = pytest.mark.skipif(
    not SHARED_CSV.is_file(),
    reason=f"shared data {SHARED_CSV} is absent (the shared/ folder sits beside the repo)")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    if not SHARED_CSV.is_file():
        pytest.skip(f"shared data {SHARED_CSV} is absent")
    return build_profiles(SHARED_CSV)


def _csv_rows() -> list[dict[str, str]]:
    with SHARED_CSV.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _all_variants(docs: dict[str, dict]) -> list[dict]:
    return [v for doc in docs.values() for v in doc["variants"]]


@needs_csv
def test_one_variant_per_default_row(docs: dict[str, dict]) -> None:
    default_rows = [r for r in _csv_rows() if r["default"] == "1"]
    names = [v["name"] for v in _all_variants(docs)]
    assert len(names) == len(set(names)) == len(default_rows) == 80
    assert sorted(names) == sorted(r["model"] for r in default_rows)
    b1 = [v for v in docs["efficientnet"]["variants"] if v["name"] == "efficientnet_b1"]
    assert len(b1) == 1
    assert b1[0]["top1_pct"] == 79.838
    assert b1[0]["source"]["weights"] == "IMAGENET1K_V2"


@needs_csv
def test_families_and_single_variant_families(docs: dict[str, dict]) -> None:
    assert len(docs) == 22
    for single in ("alexnet", "googlenet", "inception", "maxvit"):
        assert len(docs[single]["variants"]) == 1
        assert docs[single]["variants"][0]["accuracy"] == 1.0


@needs_csv
def test_accuracy_is_normalised_within_family(docs: dict[str, dict]) -> None:
    for doc in docs.values():
        variants = doc["variants"]
        assert max(v["accuracy"] for v in variants) == 1.0
        best = max(v["top1_pct"] for v in variants)
        for v in variants:
            assert v["accuracy"] == pytest.approx(v["top1_pct"] / best, abs=1e-6)


@needs_csv
def test_memory_compute_and_latency_formulas(docs: dict[str, dict]) -> None:
    for v in _all_variants(docs):
        src = v["source"]
        expected_mb = src["file_size_mb"] + 16 + 0.5 * src["gflops"]
        assert v["memory_mb"] == pytest.approx(expected_mb, abs=0.05 + 1e-9)
        assert v["memory_mb"] == round(v["memory_mb"], 1)
        assert v["compute_per_rps"] == pytest.approx(100 * src["gflops"] / 1800, abs=5e-5 + 1e-12)
        assert v["latency_ms"] == {"reference": round(1.0 + src["gflops"] / 1.8, 3)}
        assert v["size_mb"] == src["file_size_mb"]
        assert v["load_time_s"] is None
    resnet50 = next(v for v in docs["resnet"]["variants"] if v["name"] == "resnet50")
    assert resnet50["memory_mb"] == 115.8  # 97.79 + 16 + 0.5 * 4.089 = 115.8345
    assert resnet50["compute_per_rps"] == 0.2272  # 100 * 4.089 / 1800 = 0.22717


@needs_csv
def test_variants_sorted_by_memory(docs: dict[str, dict]) -> None:
    for doc in docs.values():
        keys = [(v["memory_mb"], v["name"]) for v in doc["variants"]]
        assert keys == sorted(keys)


@needs_csv
def test_document_layout(docs: dict[str, dict]) -> None:
    doc = docs["resnet"]
    assert set(doc) == {"schema_version", "family", "source", "reference_gpu", "variants"}
    assert doc["schema_version"] == 1
    assert doc["source"] == {"csv": "torchvision_classification.csv", "torchvision": "0.29.2"}
    assert doc["reference_gpu"]["effective_gflops"] == 1800.0
    assert json.loads(dump_document(doc)) == doc


@needs_csv
def test_committed_profiles_match_a_fresh_build(docs: dict[str, dict]) -> None:
    committed = {p.stem: p for p in PROFILE_DIR.glob("*.json")}
    assert sorted(committed) == sorted(docs), "run `understudy profiles build` and commit"
    for family, doc in docs.items():
        committed_doc = strip_measurements(json.loads(committed[family].read_text("utf-8")))
        assert dump_document(committed_doc) == dump_document(doc), (
            f"{committed[family]} drifted from the CSV; run `understudy profiles build`")


@needs_csv
def test_write_is_deterministic(docs: dict[str, dict], tmp_path: Path) -> None:
    first = write_profiles(docs, tmp_path / "a")
    second = write_profiles(build_profiles(SHARED_CSV), tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert a.read_text().endswith("}\n")


def test_load_families_builds_policy_families() -> None:
    families = load_families()
    assert len(families) == 22
    assert sum(len(f.variants) for f in families.values()) == 80
    assert all(isinstance(f, Family) for f in families.values())
    effnet = families["efficientnet"]
    assert len(effnet.variants) == 8
    assert effnet.smallest.name == "efficientnet_b0"
    b1 = effnet.variant("efficientnet_b1")
    assert isinstance(b1, Variant)
    assert b1.top1_pct == 79.838
    assert b1.memory_mb == 46.5  # 30.136 + 16 + 0.5 * 0.687
    assert b1.latency_ms["reference"] == pytest.approx(1.382)
    assert b1.demand(10.0)["compute"] == pytest.approx(10 * b1.compute_per_rps)
    for family in families.values():
        assert math.isclose(family.most_accurate.accuracy, 1.0)


def test_load_families_from_a_written_directory(tmp_path: Path) -> None:
    doc = json.loads((PROFILE_DIR / "squeezenet.json").read_text())
    write_profiles({"squeezenet": doc}, tmp_path)
    families = load_families(tmp_path)
    assert list(families) == ["squeezenet"]
    assert [v.name for v in families["squeezenet"].variants] == ["squeezenet1_1", "squeezenet1_0"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"schema_version": 1, "family": "bad", "variants": []}', "malformed"),
        ('{"schema_version": 2, "family": "bad", "variants": [{"name": "x", "accuracy": 1,'
         ' "memory_mb": 1, "compute_per_rps": 0, "latency_ms": {"reference": 1}}]}',
         "schema_version"),
        ('{"schema_version": 1, "family": "other", "variants": [{"name": "x", "accuracy": 1,'
         ' "memory_mb": 1, "compute_per_rps": 0, "latency_ms": {"reference": 1}}]}',
         "not 'bad'"),
        ('{"schema_version": 1, "family": "bad", "variants": [{"name": "x", "accuracy": 1,'
         ' "memory_mb": 1, "compute_per_rps": 0, "latency_ms": {"gpu": 1}}]}',
         "reference"),
    ],
)
def test_malformed_profile_is_rejected(tmp_path: Path, content: str, match: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(ProfileError, match=match):
        load_families(tmp_path)


def test_missing_or_empty_profile_dir_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_families(tmp_path / "nowhere")
    with pytest.raises(ProfileError, match="no \\*.json"):
        load_families(tmp_path)


def test_bad_csv_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        build_profiles(tmp_path / "missing.csv")
    header = "family,model,weights,default,acc1,acc5,params,gflops,file_size_mb,crop_size\n"
    no_default = tmp_path / "no_default.csv"
    no_default.write_text(header + "f,m,W1,0,50,70,10,1.0,2.0,224\n")
    with pytest.raises(ProfileError, match="without a default"):
        build_profiles(no_default)
    bad_value = tmp_path / "bad_value.csv"
    bad_value.write_text(header + "f,m,W1,1,fifty,70,10,1.0,2.0,224\n")
    with pytest.raises(ProfileError, match="line 2"):
        build_profiles(bad_value)
    missing_column = tmp_path / "missing_column.csv"
    missing_column.write_text("family,model\nf,m\n")
    with pytest.raises(ProfileError, match="missing columns"):
        build_profiles(missing_column)


def test_cli_profiles_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles", "show"]) == 0
    out = capsys.readouterr().out
    assert "efficientnet_v2" in out
    assert "22 families, 80 variants" in out


def test_cli_profiles_show_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles", "show", "--family", "mobilenet_v3"]) == 0
    out = capsys.readouterr().out
    assert out.index("mobilenet_v3_small") < out.index("mobilenet_v3_large")
    assert cli.main(["profiles", "show", "--family", "nope"]) == 2


@needs_csv
def test_cli_profiles_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles", "build", "--csv", str(SHARED_CSV), "--out", str(tmp_path)]) == 0
    assert "22 families, 80 variants" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        p.name for p in PROFILE_DIR.glob("*.json"))


def test_cli_demo_passes_every_argument_through(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class FakeDemo:
        @staticmethod
        def main(argv: list[str]) -> int:
            seen.append(argv)
            return 0

    real_import = cli.importlib.import_module
    monkeypatch.setattr(
        cli.importlib, "import_module",
        lambda name: FakeDemo if name == "understudy.cli.demo" else real_import(name))
    assert cli.main(["--log-level", "WARNING", "demo", "--servers", "10", "-h"]) == 0
    assert seen == [["--servers", "10", "-h"]]
