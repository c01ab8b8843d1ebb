"""The SDK on real processes: a testbed (Redis, controller, agents with Triton) and SDK clients
(sync over HTTP, asyncio over gRPC) whose inputs come from the model's metadata, through server
kills and freezes; and ``understudy testbed client`` stopping on SIGTERM with the controller
down. test_sdk_tensors.py has the transports with non-image tensors on real Tritons."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology
from understudy.sdk import AsyncClient, Client, ModelMetadata, RequestRecord, SdkError

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("mobilenet_v3", "shufflenet_v2")
BATCH = 2


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(servers=3, sites=3, apps=4, critical_fraction=1.0, headroom=0.5,
                             families=FAMILIES)
    bed = Testbed.up(tmp_path_factory.mktemp("sdk-bed"), topology, seed=7, scale=0.05,
                     clients=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def victim_and_apps(bed: Testbed) -> tuple[str, list[str]]:
    """The server serving the most apps with warm backups, and the apps it serves."""
    by_server: dict[str, list[str]] = {}
    for app_id, app in bed.apps_by_id().items():
        if app["serving"]:
            by_server.setdefault(app["serving"]["server_id"], []).append(app_id)
    backed = {a for a, v in bed.apps_by_id().items() if v["backups"]}
    victim = max(by_server, key=lambda s: (len(set(by_server[s]) & backed), len(by_server[s])))
    return victim, by_server[victim]


def inputs_from(meta: ModelMetadata, seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the names, types and shapes the model's metadata gives."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.random(t.zeros(BATCH).shape).astype(t.dtype) for t in meta.inputs}


def answer_ok(meta: ModelMetadata, outputs: dict[str, np.ndarray]) -> bool:
    return set(outputs) == {t.name for t in meta.outputs} and all(
        outputs[t.name].shape == t.zeros(BATCH).shape and outputs[t.name].dtype == t.dtype
        for t in meta.outputs)


class Load:
    """A sync HTTP client (a thread per app) and an asyncio gRPC client (a task per app)."""

    def __init__(self, controller_url: str, app_ids: list[str], token: str) -> None:
        self.records: list[RequestRecord] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.token = token
        self.sync = Client(controller_url, protocol="http", timeout_s=120, token=token)
        self.meta = {a: self.sync.metadata(a) for a in app_ids}
        self.inputs = {a: inputs_from(m, i) for i, (a, m) in enumerate(self.meta.items())}
        self.threads = [threading.Thread(target=self._sync, args=(a,), daemon=True)
                        for a in app_ids]
        self.threads.append(threading.Thread(
            target=lambda: asyncio.run(self._async(controller_url, app_ids)), daemon=True))
        for thread in self.threads:
            thread.start()

    def _check(self, app_id: str, outputs: dict[str, np.ndarray], record: RequestRecord) -> None:
        if answer_ok(self.meta[app_id], outputs):
            self.records.append(record)
        else:
            shapes = [(k, v.shape, v.dtype) for k, v in outputs.items()]
            self.errors.append(f"{app_id}: unexpected outputs {shapes}")

    def _sync(self, app_id: str) -> None:
        while not self.stop.is_set():
            try:
                result = self.sync.infer(app_id, self.inputs[app_id])
                self._check(app_id, result.outputs, result.record)
            except SdkError as exc:
                self.errors.append(f"http {app_id}: {exc}")
            self.stop.wait(0.02)

    async def _async(self, controller_url: str, app_ids: list[str]) -> None:
        async with AsyncClient(controller_url, protocol="grpc", timeout_s=120,
                               token=self.token) as client:

            async def loop(app_id: str) -> None:
                while not self.stop.is_set():
                    try:
                        result = await client.infer(app_id, self.inputs[app_id])
                        self._check(app_id, result.outputs, result.record)
                    except SdkError as exc:
                        self.errors.append(f"grpc {app_id}: {exc}")
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(loop(a) for a in app_ids))

    def answered_since(self, at: float, protocol: str | None = None) -> int:
        return sum(1 for r in list(self.records)
                   if r.sent_at > at and protocol in (None, r.protocol))

    def finish(self) -> list[RequestRecord]:
        self.stop.set()
        for thread in self.threads:
            thread.join(150)
        self.sync.close()
        return list(self.records)


def test_sync_http_and_asyncio_grpc_clients_survive_a_server_kill(testbed: Testbed) -> None:
    victim, affected = victim_and_apps(testbed)
    load = Load(testbed.state.controller_url, affected, testbed.token("client"))
    killed_at = 0.0
    try:
        wait_until("answers before the kill", lambda: load.answered_since(0, "http") >= 2 * len(
            affected) and load.answered_since(0, "grpc") >= 2 * len(affected), 60, 0.05)
        killed_at = testbed.fail([victim])
        wait_until("the apps to move off the killed server",
                   lambda: testbed.serving_off(affected, victim), 120, 0.1)
        moved = time.time()
        wait_until("answers after the move", lambda: load.answered_since(moved, "http") >= 2
                   and load.answered_since(moved, "grpc") >= 2, 60, 0.05)
    finally:
        records = load.finish()
        if killed_at:  # the next tests need the whole bed, whatever happened here
            testbed.start_agent(victim)
    assert not load.errors, load.errors[:5]
    assert {r.protocol for r in records} == {"http", "grpc"}
    assert any(r.sent_at < killed_at and r.server_id == victim for r in records)
    after = [r for r in records if r.sent_at > moved]
    assert after and all(r.server_id != victim for r in after)
    # Requests the kill caught were answered, none failed. `killed_at` is stamped just before the
    # signal, so an answer the victim had already written may still be read after it (its
    # done_at is when the client read it): such an answer counts as the victim's, and comes
    # before the apps moved; every later one comes from elsewhere.
    caught = [r for r in records if r.sent_at < killed_at < r.done_at]
    assert all(r.ok for r in caught)
    assert all(r.server_id != victim or r.done_at < moved for r in caught)
    testbed.wait_converged(240)


def test_requests_held_by_a_frozen_server_are_cancelled_and_resent(testbed: Testbed) -> None:
    """A server that stops answering without closing anything (SIGSTOP: agent and Triton
    frozen): the requests it holds are cancelled and resent when the controller moves its
    apps."""
    testbed.wait_converged(240)
    victim, affected = victim_and_apps(testbed)
    load = Load(testbed.state.controller_url, affected, testbed.token("client"))
    wait_until("answers", lambda: load.answered_since(0) >= 4 * len(affected), 60, 0.05)
    group = testbed.state.processes[f"agent-{victim}"].pid
    os.killpg(group, signal.SIGSTOP)
    try:
        wait_until("the apps to move off the frozen server",
                   lambda: testbed.serving_off(affected, victim), 120, 0.05)
        moved = time.time()
        wait_until("answers after the move", lambda: load.answered_since(moved) >= 4, 60, 0.05)
    finally:
        os.killpg(group, signal.SIGCONT)
    records = load.finish()
    assert not load.errors, load.errors[:5]
    resent = [r for r in records if r.moved]
    assert resent and all(r.server_id != victim and r.resends >= 1 for r in resent)
    assert {r.protocol for r in resent} == {"http", "grpc"}
    testbed.wait_converged(240)


def start_client(controller_url: str, app_ids: list[str], out: Path,
                 token_file: Path) -> subprocess.Popen[bytes]:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", "testbed",
         "client", "--controller-url", controller_url, "--app", ",".join(app_ids),
         "--token-file", str(token_file),
         "--rate", "20", "--out", str(out)],
        cwd=REPO, stdout=(out / "client.log").open("ab"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stop_within(process: subprocess.Popen[bytes]) -> float:
    """SIGTERM; seconds until the process exited."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    return time.monotonic() - started


def answered(out: Path, app_id: str) -> int:
    # One file per app and client kind: <app>.sdk-<rate>rps.jsonl (deploy.gateway_load).
    return sum(1 for path in out.glob(f"{app_id}.*jsonl")
               for line in path.read_text().splitlines() if json.loads(line)["ok"])


def _connections(listener: socket.socket) -> int:
    """Connections waiting in a listener's backlog (accepted by the kernel, never by us)."""
    port = listener.getsockname()[1]
    text = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in text if int(line.split()[2].split(":")[1], 16) == port
               and line.split()[3] == "01")


def test_a_client_process_stops_within_two_seconds_of_sigterm_with_the_controller_down(
        testbed: Testbed, tmp_path: Path) -> None:
    # A controller that accepts connections and never answers (hung, or behind a dead link):
    # the client is stuck resolving its app when the signal comes.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        hung = start_client(f"http://127.0.0.1:{silent.getsockname()[1]}", ["a"],
                            tmp_path / "hung", testbed.token_file("client"))
        wait_until("the client to reach the silent controller",
                   lambda: _connections(silent) >= 1, 30, 0.05)
        took_hung = stop_within(hung)
    finally:
        silent.close()
    # A client whose controller dies under it: it goes on from the routes it knows; at the
    # signal it stops at once.
    testbed.wait_converged(240)
    app_id = sorted(testbed.apps_by_id())[0]
    out = tmp_path / "running"
    running = start_client(testbed.state.controller_url, [app_id], out,
                           testbed.token_file("client"))
    wait_until("answers", lambda: answered(out, app_id) >= 5, 60, 0.05)
    testbed.kill_process("controller", signal.SIGKILL)
    down = answered(out, app_id)
    wait_until("answers with the controller down", lambda: answered(out, app_id) >= down + 5,
               60, 0.05)
    took_running = stop_within(running)
    assert hung.returncode == 0 and running.returncode == 0
    assert took_hung < 2.0 and took_running < 2.0, (took_hung, took_running)
    testbed.start_controller()
