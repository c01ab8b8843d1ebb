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
from model_repo.runtime import RuntimeClient, runtime_stats
from model_repo.worker_priority import LOADING_NICE_STEP, SERVING_NICE_STEP, STARTING_BOOST_S

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
        runtime_nice = os.getpriority(os.PRIO_PROCESS, process.pid)
        serving = min(19, runtime_nice + SERVING_NICE_STEP)
        _wait_for_niceness(worker, serving, 5)  # loaded, nothing served yet
        logits = client.infer(np.ones((2, 3, 32, 32), dtype=np.float32))
        assert logits.shape == (2, spec.num_classes) and np.isfinite(logits).all()
        # Its first answers (a warm backup just switched to) go at the loads' priority where
        # the OS allows raising it; then every thread, torch's pool included, yields to loads.
        if os.geteuid() == 0:
            assert _thread_niceness(worker) == {max(-20, runtime_nice - LOADING_NICE_STEP)}
        _wait_for_niceness(worker, serving, STARTING_BOOST_S + 5)
        assert [w["pid"] for w in runtime_stats(socket_path)] == [worker]
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while runtime_stats(socket_path):  # the worker ends with its connection
        assert time.monotonic() < deadline, "the worker outlived its connection"
        time.sleep(0.05)


def _wait_for_niceness(worker: int, niceness: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := _thread_niceness(worker)) != {niceness}:
        assert time.monotonic() < deadline, f"worker threads at {seen}, not {niceness}"
        time.sleep(0.05)


def _children(pid: int) -> set[int]:
    """Live (not zombie) child processes of ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(what: str, condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_loads_go_to_pre_forked_spares_that_are_replaced_and_answer_like_a_plain_build(
        runtime, tmp_path: Path) -> None:
    import torch

    from model_repo.network import build_network
    from model_repo.runtime_spares import DEFAULT_SPARES

    process, socket_path = runtime
    weights, spec = _weights(tmp_path)
    _wait_for("the spares", lambda: len(_children(process.pid)) == DEFAULT_SPARES)
    spares = _children(process.pid)
    images = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    reference = build_network(spec)  # allocated on the CPU, weights copied in: no meta, no mmap
    reference.load_state_dict(initial_state(spec))
    with torch.inference_mode():
        expected = reference(torch.from_numpy(images)).numpy()

    # A burst larger than the pool: the spares take the first loads, the rest are forked.
    clients = []
    try:
        for index in range(DEFAULT_SPARES + 2):
            clients.append(RuntimeClient(str(socket_path), f"app{index}__tiny", weights, spec))
        pids = [c.report.pid for c in clients]
        assert len(set(pids)) == len(pids)
        assert set(pids[:DEFAULT_SPARES]) == spares
        assert not set(pids[DEFAULT_SPARES:]) & spares
        for client in clients:
            np.testing.assert_allclose(client.infer(images), expected, rtol=1e-5, atol=1e-5)
        # Idle spares come back once the burst is over; they are not listed as workers.
        _wait_for("the pool to refill",
                  lambda: len(_children(process.pid)) == len(pids) + DEFAULT_SPARES)
        assert sorted(w["pid"] for w in runtime_stats(socket_path)) == sorted(pids)
        # A spare that died idle is skipped (or reaped) and the load still succeeds.
        dead = min(_children(process.pid) - set(pids))
        os.kill(dead, 9)
        _wait_for("the killed spare to exit", lambda: not _alive(dead))
        late = RuntimeClient(str(socket_path), "late__tiny", weights, spec)
        clients.append(late)
        assert late.report.pid != dead
        np.testing.assert_allclose(late.infer(images), expected, rtol=1e-5, atol=1e-5)
    finally:
        for client in clients:
            client.close()
    # With the runtime gone, idle spares exit on their own (nothing outlives the server).
    _wait_for("the pool to refill", lambda: len(_children(process.pid)) == DEFAULT_SPARES)
    idle = _children(process.pid)
    process.kill()
    process.wait(timeout=10)
    _wait_for("the idle spares to exit", lambda: not any(_alive(pid) for pid in idle))


def test_stats_measure_only_the_workers_asked_for(runtime, tmp_path: Path) -> None:
    _, socket_path = runtime
    weights, spec = _weights(tmp_path)
    first = RuntimeClient(str(socket_path), "first__tiny", weights, spec)
    second = RuntimeClient(str(socket_path), "second__tiny", weights, spec)
    try:
        listed = {w["model"]: w["private_mb"] for w in runtime_stats(socket_path, memory=False)}
        assert listed == {"first__tiny": None, "second__tiny": None}
        one = {w["model"]: w["private_mb"] for w in
               runtime_stats(socket_path, models=["second__tiny"])}
        assert one["first__tiny"] is None and one["second__tiny"] > 0
        every = {w["model"]: w["private_mb"] for w in runtime_stats(socket_path)}
        assert all(mb > 0 for mb in every.values()) and set(every) == set(listed)
    finally:
        first.close()
        second.close()
