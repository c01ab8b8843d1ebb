"""Network sizing, artifact store, profile measurements and the load-time fit (no Triton)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.profiler import fit_load_time
from model_repo.artifacts import (
    ArtifactError,
    build_store,
    find_variant,
    list_store,
    render_config,
)
from model_repo.network import BYTES_PER_PARAM, NetworkSpec, spec_for_size
from model_repo.profiles import (
    PROFILE_DIR,
    Measurement,
    apply_measurement,
    load_families,
    merge_measurements,
    strip_measurements,
)


@pytest.mark.parametrize("target_mb", [0.5, 3.0, 4.9, 37.7, 264.4, 861.5])
def test_spec_for_size_hits_the_target(target_mb: float) -> None:
    spec = spec_for_size(target_mb, seed=1)
    layer_mb = 1024 * 1025 * BYTES_PER_PARAM / 1e6
    assert abs(spec.weight_mb() - target_mb) <= max(layer_mb / 2, 0.05)


def test_spec_round_trips_through_a_dict() -> None:
    spec = NetworkSpec(width=64, hidden_layers=2, seed=7)
    assert NetworkSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_store_build_is_seeded_sized_and_loads(tmp_path: Path) -> None:
    import torch

    from model_repo.network import build_network
    from model_repo.runtime import InProcessRunner

    family = load_families()["mobilenet_v3"]
    manifests = build_store(tmp_path / "a", [family], scale=0.1)
    again = build_store(tmp_path / "b", [family], scale=0.1)
    assert [m.weights_sha256 for m in manifests] == [m.weights_sha256 for m in again]
    for manifest, variant in zip(manifests, family.variants, strict=True):
        assert manifest.weights_mb == pytest.approx(variant.size_mb * 0.1, rel=0.25)
    small, large = manifests
    assert large.weights_mb > small.weights_mb
    entry = find_variant(tmp_path / "a", "mobilenet_v3_large")
    assert (entry.directory / "1" / "model.py").exists()
    assert 'name: "mobilenet_v3_large"' in (entry.directory / "config.pbtxt").read_text()
    state = torch.load(entry.directory / "weights.pt", weights_only=True)
    assert set(state) == set(build_network(entry.manifest.network).state_dict())
    runner = InProcessRunner(entry.directory / "weights.pt", entry.manifest.network)
    logits = runner.infer(np.ones((3, 3, 224, 224), dtype=np.float32))
    assert logits.shape == (3, 1000) and np.isfinite(logits).all()
    assert [e.variant for e in list_store(tmp_path / "a")] == ["mobilenet_v3_small",
                                                                "mobilenet_v3_large"]
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert set(index["variants"]) == {"mobilenet_v3_small", "mobilenet_v3_large"}


def test_store_rejects_bad_requests(tmp_path: Path) -> None:
    family = load_families()["mobilenet_v3"]
    with pytest.raises(ArtifactError, match="scale"):
        build_store(tmp_path, [family], scale=0)
    with pytest.raises(ArtifactError, match="not in the artifact store"):
        find_variant(tmp_path, "resnet50")


def test_render_config_is_complete() -> None:
    text = render_config("app__v", NetworkSpec(width=32, hidden_layers=0, image_side=64),
                         "/w/weights.pt", 4)
    for expected in ('name: "app__v"', 'backend: "python"', "max_batch_size: 4",
                     "dims: [ 3, 64, 64 ]", "dims: [ 1000 ]", "/w/weights.pt",
                     '\\"width\\": 32'):
        assert expected in text


def test_fit_load_time_recovers_a_line() -> None:
    points = [(x, 0.1 + 0.004 * x) for x in (5.0, 40.0, 120.0, 800.0)]
    a, b, r2 = fit_load_time(points)
    assert a == pytest.approx(0.1) and b == pytest.approx(0.004) and r2 == pytest.approx(1.0)
    with pytest.raises(ValueError):
        fit_load_time(points[:1])


def _measurement(load_s: float = 0.5) -> Measurement:
    return Measurement(host="h", server_type="testbed", artifact_scale=0.35, weights_mb=10.0,
                       repeats=3, load_s=load_s, load_s_runs=[load_s] * 3, unload_s=1.1,
                       latency_p50_ms=4.0, latency_p99_ms=6.0, latency_requests=10,
                       resident_mb=12.0, measured_on="2026-11-21")


def test_measurements_apply_strip_and_survive_a_rebuild(tmp_path: Path) -> None:
    doc = json.loads((PROFILE_DIR / "squeezenet.json").read_text())
    fresh = strip_measurements(doc)
    apply_measurement(fresh, "squeezenet1_1", _measurement(0.25))
    entry = next(v for v in fresh["variants"] if v["name"] == "squeezenet1_1")
    assert entry["load_time_s"] == 0.25 and entry["latency_ms"]["testbed"] == 4.0
    assert "reference" in entry["latency_ms"]
    assert strip_measurements(fresh) == strip_measurements(doc)
    (tmp_path / "squeezenet.json").write_text(json.dumps(fresh))
    merged = merge_measurements({"squeezenet": strip_measurements(doc)}, tmp_path)
    assert merged["squeezenet"] == fresh
    with pytest.raises(ValueError, match="no variant"):
        apply_measurement(fresh, "resnet50", _measurement())
