"""The per-server torch runtime as a real process: workers fork, serve, and yield to loads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from model_repo.network import NetworkSpec, initial_state
from model_repo.runtime import SERVING_NICE_STEP, RuntimeClient, runtime_stats

REPO = Path(__file__).resolve().parents[2]


def _thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of a process."""
    values = set()
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            values.add(os.getpriority(os.PRIO_PROCESS, int(entry.name)))
        except OSError:  # the thread ended meanwhile
            continue
    return values


@pytest.fixture()
def runtime(tmp_path: Path):
    socket_path = tmp_path / "runtime.sock"
    process = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "model_repo.runtime", "--socket", str(socket_path)],
        cwd=REPO, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        assert process.poll() is None, "the runtime exited at start-up"
        assert time.monotonic() < deadline, "the runtime did not open its socket"
        time.sleep(0.05)
    yield process, socket_path
    process.terminate()
    process.wait(timeout=10)


def _weights(tmp_path: Path) -> tuple[Path, NetworkSpec]:
    import torch

    spec = NetworkSpec(width=32, hidden_layers=1, image_side=32, seed=3)
    path = tmp_path / "weights.pt"
    torch.save(initial_state(spec), path)
    return path, spec


def test_a_loaded_worker_serves_and_runs_nicer_than_the_runtime(runtime, tmp_path: Path) -> None:
    process, socket_path = runtime
    weights, spec = _weights(tmp_path)
    client = RuntimeClient(str(socket_path), "app__tiny", weights, spec)
    try:
        worker = client.report.pid
        assert worker != process.pid
        logits = client.infer(np.ones((2, 3, 32, 32), dtype=np.float32))
        assert logits.shape == (2, spec.num_classes) and np.isfinite(logits).all()
        # Every thread of the serving worker, torch's pool included, yields to loads.
        runtime_nice = os.getpriority(os.PRIO_PROCESS, process.pid)
        assert _thread_niceness(worker) == {min(19, runtime_nice + SERVING_NICE_STEP)}
        assert [w["pid"] for w in runtime_stats(socket_path)] == [worker]
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while runtime_stats(socket_path):  # the worker ends with its connection
        assert time.monotonic() < deadline, "the worker outlived its connection"
        time.sleep(0.05)
