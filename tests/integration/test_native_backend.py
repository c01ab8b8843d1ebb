"""The native Triton backend on a real Triton and torch runtime, against the Python backend."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from agent.triton import TritonServer
from agent.triton_config import ModelLoadError, TritonConfig, TritonError
from model_repo.artifacts import render_config
from model_repo.native_backend import (
    CACHE_ENV,
    NATIVE_BACKEND,
    PYTHON_BACKEND,
    NativeBackendError,
    build_library,
    compiler,
    resolve_backend,
)
from model_repo.network import NetworkSpec, initial_state
from model_repo.runtime import runtime_stats
from understudy.wire.ports import free_ports

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler to build with")

SPEC = NetworkSpec(width=32, hidden_layers=1, image_side=32, seed=3)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    path = tmp_path_factory.mktemp("weights") / "weights.pt"
    torch.save(initial_state(SPEC), path)
    return path


def _server(root: Path, backend: str) -> TritonServer:
    ports = free_ports(3)
    return TritonServer(TritonConfig(
        model_repository=root / f"repo-{backend}", work_dir=root / f"work-{backend}",
        http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
        model_backend=backend))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TritonServer]]:
    root = tmp_path_factory.mktemp("triton")
    started = {name: _server(root, name) for name in (NATIVE_BACKEND, PYTHON_BACKEND)}
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def _write_model(server: TritonServer, name: str, weights: Path) -> None:
    directory = server.config.model_repository / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(
        render_config(name, SPEC, str(weights), 8, server.model_backend), encoding="utf-8")
    if server.model_backend == PYTHON_BACKEND:
        source = Path(__file__).resolve().parents[2] / "model_repo" / "triton_model.py"
        (directory / "1" / "model.py").write_text(source.read_text(), encoding="utf-8")


def _stub_pids(server: TritonServer) -> list[int]:
    """Python-backend stub processes started by ``server``'s Triton."""
    marker = str(server.config.work_dir / "backends").encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if b"triton_python_backend_stub" in cmdline and marker in cmdline:
            pids.append(int(entry.name))
    return pids


def _worker_pid(server: TritonServer, model: str) -> int:
    return next(w["pid"] for w in runtime_stats(server.runtime_socket) if w["model"] == model)


def test_native_models_answer_as_python_ones_without_a_stub_process(servers, weights) -> None:
    native, python = servers[NATIVE_BACKEND], servers[PYTHON_BACKEND]
    assert native.model_backend == NATIVE_BACKEND
    images = np.random.default_rng(1).random((5, 3, 32, 32), dtype=np.float32)
    outputs = {}
    for server in (native, python):
        _write_model(server, "same", weights)
        server.load("same")
        outputs[server.model_backend] = server.infer("same", images)
    assert outputs[NATIVE_BACKEND].shape == (5, SPEC.num_classes)
    np.testing.assert_array_equal(outputs[NATIVE_BACKEND], outputs[PYTHON_BACKEND])
    # The Python backend runs a stub per instance; the native one runs none.
    assert _stub_pids(python) and not _stub_pids(native)
    # The native instance is a runtime worker named after the model, as the Python one is.
    assert _worker_pid(native, "same") != native.runtime.pid
    # Triton counts the native backend's requests as it counts the Python backend's (the
    # native one before it answers; the Python stub reports after, so it is waited for).
    stats = native.inference_statistics("same")
    assert stats["inference_count"] == 5 and stats["execution_count"] == 1
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    assert int(stats["inference_stats"]["compute_infer"]["ns"]) > 0
    deadline = time.monotonic() + 5
    while python.inference_statistics("same")["inference_count"] != 5:
        assert time.monotonic() < deadline, "the Python backend's statistics never came"
        time.sleep(0.02)


def test_a_dynamic_batch_is_split_back_to_each_request(servers, weights) -> None:
    native = servers[NATIVE_BACKEND]
    _write_model(native, "batched", weights)
    native.load("batched")
    rng = np.random.default_rng(2)
    batches = [rng.random((n, 3, 32, 32), dtype=np.float32) for n in (1, 2, 3, 1, 2, 3, 1, 2)]
    alone = [native.infer("batched", batch) for batch in batches]
    with ThreadPoolExecutor(len(batches)) as pool:  # concurrent: Triton batches them together
        together = list(pool.map(lambda batch: native.infer("batched", batch), batches))
    for expected, got in zip(alone, together, strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_dead_worker_is_replaced_and_a_lost_model_fails_alone(servers, weights,
                                                                 tmp_path: Path) -> None:
    native = servers[NATIVE_BACKEND]
    own_weights = tmp_path / "victim.pt"
    own_weights.write_bytes(weights.read_bytes())
    _write_model(native, "victim", own_weights)
    _write_model(native, "bystander", weights)
    for name in ("victim", "bystander"):
        native.load(name)
    image = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    expected = native.infer("victim", image)
    # A killed worker costs one batch a new worker: the answer is the same.
    first = _worker_pid(native, "victim")
    os.kill(first, signal.SIGKILL)
    np.testing.assert_array_equal(native.infer("victim", image), expected)
    assert _worker_pid(native, "victim") != first
    # A worker that cannot be replaced (its weights are gone) fails its own model's requests
    # with the reason, and nothing else.
    own_weights.unlink()
    os.kill(_worker_pid(native, "victim"), signal.SIGKILL)
    failed_before = int(native.inference_statistics("victim")["inference_stats"]["fail"]
                        ["count"])
    with pytest.raises(TritonError, match="victim.pt"):
        native.infer("victim", image)
    assert int(native.inference_statistics("victim")["inference_stats"]["fail"]["count"]) \
        == failed_before + 1
    assert native.process is not None and native.process.poll() is None  # Triton lives on
    assert native.infer("bystander", image).shape == (2, SPEC.num_classes)
    native.unload("bystander")
    deadline = time.monotonic() + 10
    while any(w["model"] == "bystander" for w in runtime_stats(native.runtime_socket)):
        assert time.monotonic() < deadline, "the worker outlived its unloaded model"
        time.sleep(0.05)


def test_a_load_that_fails_in_the_runtime_says_why(servers, weights, tmp_path: Path) -> None:
    native = servers[NATIVE_BACKEND]
    _write_model(native, "missing", tmp_path / "no-such-weights.pt")
    with pytest.raises(ModelLoadError, match="no-such-weights.pt"):
        native.load("missing")
    assert native.process is not None and native.process.poll() is None
    _write_model(native, "after", weights)  # the server still loads and serves
    native.load("after")
    assert native.infer("after", np.ones((1, 3, 32, 32), np.float32)).shape == (1, SPEC.num_classes)


def test_builds_are_cached_and_a_broken_compiler_falls_back_to_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_library(tmp_path / "cache")
    built_at = first.stat().st_mtime_ns
    again = build_library(tmp_path / "cache")
    assert again == first and again.stat().st_mtime_ns == built_at
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "other-cache"))
    with pytest.raises(NativeBackendError, match="compiling the native backend failed"):
        build_library()
    assert resolve_backend("auto", use_runtime=True) == (PYTHON_BACKEND, None)
    with pytest.raises(NativeBackendError):
        resolve_backend("understudy", use_runtime=True)
