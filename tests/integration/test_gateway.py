"""The inference gateway on real processes: a testbed (Redis, controller, agents with Triton) and
``understudy gateway`` processes, driven by plain clients (raw HTTP as curl sends it, and
``tritonclient.http``) that know nothing of failovers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology
from understudy.wire.ports import free_port

pytestmark = pytest.mark.timeout(420)
REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("mobilenet_v3", "shufflenet_v2")
IMAGE = np.zeros((1, 3, 224, 224), dtype=np.float32)


# --- processes -----------------------------------------------------------------------------

@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    run_dir: Path
    grpc_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def total(self, name: str, label: str = "") -> float:
        """The sum of a metric's samples whose labels contain ``label``."""
        lines = httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines()
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines
                   if line.startswith(name) and label in line)

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        return time.monotonic() - started


def start_gateway(run_dir: Path, controller_url: str, grpc: bool = False,
                  wait_ready: bool = True, extra: tuple[str, ...] = (),
                  token_file: Path | None = None) -> GatewayProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    grpc_port = free_port() if grpc else None
    log = (run_dir / "gateway.log").open("ab")
    process = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", "gateway",
         "--controller-url", controller_url, "--port", str(port), "--run-dir", str(run_dir),
         *(["--grpc-port", str(grpc_port)] if grpc_port else []),
         *(["--token-file", str(token_file)] if token_file else []), *extra],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                                             "PYTHONUNBUFFERED": "1"})
    gateway = GatewayProcess(process, port, run_dir, grpc_port)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {(run_dir / 'gateway.log').read_text()}")
        try:
            return httpx.get(f"{gateway.url}/v2/health/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    if wait_ready:
        wait_until("the gateway to be ready", ready, 60, 0.05)
    return gateway


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(servers=3, sites=3, apps=4, critical_fraction=1.0, headroom=0.5,
                             families=FAMILIES)
    bed = Testbed.up(tmp_path_factory.mktemp("gateway-bed"), topology, seed=5, scale=0.05,
                     clients=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="module")
def gateway(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayProcess]:
    process = start_gateway(tmp_path_factory.mktemp("gateway"), testbed.state.controller_url,
                            grpc=True, token_file=testbed.token_file("gateway"))
    try:
        yield process
    finally:
        process.stop()


# --- clients -------------------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str
    app_id: str
    sent_at: float
    ok: bool
    server: str | None
    detail: str = ""


@dataclass
class Load:
    """Plain clients of some apps through the gateway, each in a loop until stopped."""

    gateway: str
    app_ids: list[str]
    grpc: str | None = None
    """``host:port`` of the gateway's gRPC endpoint, for tritonclient.grpc clients too."""
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        clients = [self._raw, self._tritonclient] + ([self._grpc] if self.grpc else [])
        for app_id in self.app_ids:
            for client in clients:
                thread = threading.Thread(target=self._loop, args=(client, app_id),
                                          daemon=True)
                thread.start()
                self.threads.append(thread)
        return self

    def _loop(self, client: Callable[[str], Callable[[], Outcome]], app_id: str) -> None:
        send = client(app_id)
        while not self.stop.is_set():
            self.outcomes.append(send())
            self.stop.wait(0.02)

    def _raw(self, app_id: str) -> Callable[[], Outcome]:
        """What curl sends: the binary tensor extension, bytes built by hand."""
        data = IMAGE.tobytes()
        header = json.dumps({"inputs": [{"name": "image", "shape": list(IMAGE.shape),
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": len(data)}}],
                             "outputs": [{"name": "logits",
                                          "parameters": {"binary_data": True}}]}).encode()
        http = httpx.Client(base_url=self.gateway, timeout=90)
        headers = {"Inference-Header-Content-Length": str(len(header)),
                   "Content-Type": "application/octet-stream",
                   "Understudy-Timeout-Ms": "60000"}

        def send() -> Outcome:
            sent = time.time()
            try:
                response = http.post(f"/v2/models/{app_id}/infer", content=header + data,
                                     headers=headers)
            except httpx.HTTPError as exc:
                return Outcome("raw", app_id, sent, False, None, repr(exc))
            length = int(response.headers.get("Inference-Header-Content-Length", "0"))
            ok = (response.status_code == 200 and length > 0
                  and json.loads(response.content[:length])["model_name"] == app_id
                  and len(response.content) - length == 4000)
            return Outcome("raw", app_id, sent, ok, response.headers.get("Understudy-Server"),
                           "" if ok else f"{response.status_code} {response.text[:300]}")

        return send

    def _tritonclient(self, app_id: str) -> Callable[[], Outcome]:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.gateway.removeprefix("http://"),
                                                  network_timeout=90)

        def send() -> Outcome:
            sent = time.time()
            try:
                tensor = httpclient.InferInput("image", list(IMAGE.shape), "FP32")
                tensor.set_data_from_numpy(IMAGE)
                result = client.infer(app_id, [tensor])
                ok = (result.as_numpy("logits").shape == (1, 1000)
                      and result.get_response()["model_name"] == app_id)
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                return Outcome("tritonclient", app_id, sent, False, None, described(exc))
            return Outcome("tritonclient", app_id, sent, ok, None)

        return send

    def _grpc(self, app_id: str) -> Callable[[], Outcome]:
        import tritonclient.grpc as grpcclient

        assert self.grpc is not None
        client = grpcclient.InferenceServerClient(self.grpc)

        def send() -> Outcome:
            sent = time.time()
            try:
                tensor = grpcclient.InferInput("image", list(IMAGE.shape), "FP32")
                tensor.set_data_from_numpy(IMAGE)
                result = client.infer(app_id, [tensor], client_timeout=60)
                ok = (result.as_numpy("logits").shape == (1, 1000)
                      and result.get_response().model_name == app_id)
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                return Outcome("grpc", app_id, sent, False, None, described(exc))
            return Outcome("grpc", app_id, sent, ok, None)

        return send

    def finish(self) -> list[Outcome]:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
        return list(self.outcomes)

    def answered_since(self, at: float, kind: str | None = None) -> int:
        return sum(1 for o in list(self.outcomes)
                   if o.sent_at > at and o.ok and kind in (None, o.kind))


def described(exc: Exception) -> str:
    """The exception's type and message (tritonclient's exceptions have an empty repr)."""
    return f"{type(exc).__name__}: {exc}"[:300]


def serving_on(bed: Testbed) -> dict[str, list[str]]:
    by_server: dict[str, list[str]] = {}
    for app_id, app in bed.apps_by_id().items():
        if app["serving"]:
            by_server.setdefault(app["serving"]["server_id"], []).append(app_id)
    return by_server


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]


# --- tests ---------------------------------------------------------------------------------

def test_plain_clients_http_and_grpc_survive_a_server_kill(
        testbed: Testbed, gateway: GatewayProcess) -> None:
    by_server = serving_on(testbed)
    backed = {a for a, v in testbed.apps_by_id().items() if v["backups"]}
    victim = max(by_server, key=lambda s: (len(set(by_server[s]) & backed), len(by_server[s])))
    affected = by_server[victim]
    load = Load(gateway.url, affected, f"127.0.0.1:{gateway.grpc_port}").start()
    wait_until("answers before the kill", lambda: load.answered_since(0) >= 4 * len(affected),
               60, 0.05)
    killed_at = testbed.fail([victim])
    wait_until("the apps to move off the killed server",
               lambda: testbed.serving_off(affected, victim), 120, 0.1)
    moved = time.time()
    wait_until("answers after the move", lambda: load.answered_since(moved, "raw") >= 2, 60,
               0.05)
    # The killed server comes back: the apps fail back to it, through the gateway too.
    revived = time.time()
    testbed.start_agent(victim)
    testbed.wait_converged(180)
    back = time.time()
    wait_until("answers after the fail-back", lambda: load.answered_since(back) >= 4, 60, 0.05)
    outcomes = load.finish()
    assert not failures(outcomes), failures(outcomes)[:5]
    assert {o.kind for o in outcomes} == {"raw", "tritonclient", "grpc"}
    assert any(o.sent_at < killed_at and o.server == victim for o in outcomes)
    away = [o for o in outcomes if moved < o.sent_at < revived and o.kind == "raw"]
    assert away and all(o.server != victim for o in away)
    assert gateway.metric("understudy_gateway_route_changes_total") >= 1


def test_requests_held_by_a_frozen_server_are_resent_when_the_app_moves(
        testbed: Testbed, gateway: GatewayProcess) -> None:
    """A server that stops answering without closing anything (SIGSTOP: agent and Triton
    frozen): the requests it holds are cancelled and resent when the controller moves its apps."""
    testbed.wait_converged(180)
    by_server = serving_on(testbed)
    backed = {a for a, v in testbed.apps_by_id().items() if v["backups"]}
    victim = max(by_server, key=lambda s: (len(set(by_server[s]) & backed), len(by_server[s])))
    affected = by_server[victim]
    moved_before = gateway.total("understudy_gateway_resends_total", 'cause="moved"')
    load = Load(gateway.url, affected).start()
    wait_until("answers", lambda: load.answered_since(0) >= 2 * len(affected), 60, 0.05)
    group = testbed.state.processes[f"agent-{victim}"].pid
    os.killpg(group, signal.SIGSTOP)
    try:
        wait_until("the apps to move off the frozen server",
                   lambda: testbed.serving_off(affected, victim), 60, 0.05)
        moved = time.time()
        wait_until("answers after the move", lambda: load.answered_since(moved) >= 4, 60, 0.05)
    finally:
        os.killpg(group, signal.SIGCONT)
    outcomes = load.finish()
    assert not failures(outcomes), failures(outcomes)[:5]
    assert gateway.total("understudy_gateway_resends_total", 'cause="moved"') > moved_before
    testbed.wait_converged(180)


def test_a_hedge_answers_from_the_warm_backup_while_the_primary_hangs(
        testbed: Testbed, tmp_path: Path) -> None:
    """Triton of the serving replica frozen (SIGSTOP, its agent still heartbeating): with
    hedging on, the app's requests are answered by its warm backup after the hedge delay."""
    testbed.wait_converged(180)
    app_id, app = next((a, v) for a, v in sorted(testbed.apps_by_id().items())
                       if v["serving"] and any(b["state"] == "ready" for b in v["backups"]))
    primary = app["serving"]["server_id"]
    backups = {b["server_id"] for b in app["backups"] if b["state"] == "ready"}
    hedging = start_gateway(tmp_path / "hedging", testbed.state.controller_url,
                            extra=("--hedge-ms", f"{app_id}=30"),
                            token_file=testbed.token_file("gateway"))
    triton = _triton_pid(testbed, primary)
    try:
        load = Load(hedging.url, [app_id]).start()
        wait_until("answers", lambda: load.answered_since(0) >= 4, 60, 0.05)
        os.kill(triton, signal.SIGSTOP)
        try:
            frozen = time.time()
            wait_until("answers from the backup", lambda: sum(
                1 for o in list(load.outcomes) if o.sent_at > frozen and o.ok
                and o.server in backups) >= 4, 60, 0.05)
        finally:
            os.kill(triton, signal.SIGCONT)
        outcomes = load.finish()
        assert not failures(outcomes), failures(outcomes)[:5]
        assert hedging.total("understudy_gateway_hedges_total", 'outcome="won"') >= 1
    finally:
        hedging.stop()
    testbed.wait_converged(180)


def _triton_pid(bed: Testbed, server_id: str) -> int:
    """The pid of a server's tritonserver process (found by its model repository)."""
    repository = f"{bed.state.run_dir}/agents/{server_id}/repository"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command and command[0].endswith(b"tritonserver") and any(
                repository.encode() in part for part in command):
            return int(proc.name)
    raise RuntimeError(f"no tritonserver of {server_id}")


def test_the_gateway_routes_while_the_controller_is_down_and_follows_it_after(
        testbed: Testbed, gateway: GatewayProcess, tmp_path: Path) -> None:
    testbed.wait_converged(180)
    by_server = serving_on(testbed)
    backed = {a for a, v in testbed.apps_by_id().items() if v["backups"]}
    victim = max(by_server, key=lambda s: (len(set(by_server[s]) & backed), len(by_server[s])))
    affected = by_server[victim]
    snapshots = gateway.metric("understudy_gateway_snapshots_total")
    load = Load(gateway.url, affected).start()
    wait_until("answers", lambda: load.answered_since(0) >= 2 * len(affected), 60, 0.05)

    hellos_before = _hellos(testbed, victim)
    testbed.kill_process("controller", signal.SIGKILL)
    down = time.time()
    wait_until("answers with the controller down", lambda: load.answered_since(down) >= 4, 60,
               0.05)
    assert gateway.metric("understudy_gateway_controller_connected") == 0
    # A gateway started while the controller is down routes from the table it persisted.
    copy = tmp_path / "restarted"
    shutil.copytree(gateway.run_dir, copy, ignore=shutil.ignore_patterns("*.log"))
    second = start_gateway(copy, testbed.state.controller_url,
                           token_file=testbed.token_file("gateway"))
    try:
        second_load = Load(second.url, affected[:1]).start()
        wait_until("answers from a gateway started without a controller",
                   lambda: second_load.answered_since(0) >= 2, 60, 0.05)
        assert not failures(second_load.finish())
    finally:
        second.stop()

    # The controller comes back; the gateway reconnects from its last sequence number and
    # follows the next move.
    testbed.start_controller()
    wait_until("the gateway to reconnect", lambda: gateway.metric(
        "understudy_gateway_controller_connected") == 1, 30, 0.1)
    # A server killed before its agent reconnected to the restarted controller is not
    # declared failed (and the records still say it is connected): wait for the agent's hello.
    wait_until("the victim's agent to reconnect",
               lambda: _hellos(testbed, victim) > hellos_before, 60, 0.1)
    killed_at = testbed.fail([victim])
    wait_until("the apps to move off the killed server",
               lambda: testbed.serving_off(affected, victim), 120, 0.1)
    moved = time.time()
    wait_until("answers after the move", lambda: load.answered_since(moved) >= 4, 60, 0.05)
    outcomes = load.finish()
    assert not failures(outcomes), failures(outcomes)[:5]
    assert any(o.sent_at > moved and o.server not in (None, victim) for o in outcomes)
    assert any(killed_at > o.sent_at > down and o.server == victim for o in outcomes)
    last = testbed.http.get("/v1/events", params={"limit": 10000}).json()[-1]["seq"]
    wait_until("the gateway to catch up", lambda: gateway.metric(
        "understudy_gateway_last_event_seq") >= last, 30, 0.1)
    # Caught up by replaying from its last sequence number, not by reloading the table.
    assert gateway.metric("understudy_gateway_snapshots_total") == snapshots
    testbed.start_agent(victim)


def _exchange(port: int, data: bytes, expect: int = 1, wait_s: float = 30.0) -> list[bytes]:
    """Send raw bytes on one connection; the first ``expect`` HTTP answers (head and body)."""
    answers: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        buffer = b""
        while len(answers) < expect:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = buffer[:end].decode("latin-1")
                length = next((int(line.split(":")[1]) for line in head.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)
                if head.startswith("HTTP/1.1 100") or len(buffer) >= end + 4 + length:
                    size = end + 4 + (0 if head.startswith("HTTP/1.1 100") else length)
                    answers.append(buffer[:size])
                    buffer = buffer[size:]
                    continue
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
    return answers


def test_the_http_front_end_reads_what_clients_send(testbed: Testbed,
                                                    gateway: GatewayProcess) -> None:
    app_id = next(a for a, v in sorted(testbed.apps_by_id().items()) if v["serving"])
    body = json.dumps({"inputs": [{"name": "image", "shape": list(IMAGE.shape),
                                   "datatype": "FP32", "data": IMAGE.ravel().tolist()}]}).encode()
    http = httpx.Client(base_url=gateway.url, timeout=60)
    # A chunked body (a streaming client), and JSON in and out.
    chunked = http.post(f"/v2/models/{app_id}/infer",
                        content=iter([body[:1000], body[1000:]]))
    assert chunked.status_code == 200, chunked.text
    assert chunked.json()["model_name"] == app_id
    assert len(chunked.json()["outputs"][0]["data"]) == 1000
    # curl's Expect: 100-continue: the gateway asks for the body, then answers.
    head = (f"POST /v2/models/{app_id}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(head)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        reply = b""
        while b'"outputs"' not in reply:
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200")
    # The same with a chunked body (curl -T -).
    head = (f"POST /v2/models/{app_id}/infer HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(head)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                              for part in (body[:5000], body[5000:])) + b"0\r\n\r\n")
        reply = b""
        while b'"outputs"' not in reply:
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200")
    # Pipelined requests are answered in order on the connection.
    answers = _exchange(gateway.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                        b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"
                        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close"
                        b"\r\n\r\n", 3)
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"200"]
    assert b"understudy-gateway" in answers[1] and b"Connection: close" in answers[2]
    head_only = http.head("/v2")
    assert head_only.status_code == 200 and head_only.content == b""
    # Bad input gets a clear 4xx with a reason, never a 500.
    too_big = _exchange(gateway.port, b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 999999999999\r\n\r\n")
    assert too_big[0].startswith(b"HTTP/1.1 413") and b"limit" in too_big[0]
    garbage = _exchange(gateway.port, b"NOT HTTP AT ALL\r\n\r\n")
    assert garbage[0].startswith(b"HTTP/1.1 400")
    cases = [("POST", "/v2/models/bad__id/infer", {}, 400, "app id"),
             ("POST", "/v2/models/nope/infer", {}, 404, "not registered"),
             ("POST", f"/v2/models/{app_id}/infer", {"Understudy-Timeout-Ms": "nan"}, 400,
              "timeout"),
             ("POST", f"/v2/models/{app_id}/versions/x/infer", {}, 400, "version"),
             ("GET", f"/v2/models/{app_id}/infer", {}, 405, "POST"),
             ("GET", "/v3/anything", {}, 404, "no endpoint")]
    for method, path, headers, status, fragment in cases:
        response = http.request(method, path, headers=headers, content=b"{}")
        assert response.status_code == status, (path, response.text)
        assert fragment in response.json()["error"], response.text
    metadata = http.get(f"/v2/models/{app_id}")
    assert metadata.status_code == 200 and metadata.json()["name"] == app_id
    assert http.get(f"/v2/models/{app_id}/ready").status_code == 200
    assert http.get(f"/v2/models/{app_id}/config").json()["name"] == app_id


def test_the_grpc_front_end_answers_like_triton(testbed: Testbed,
                                                gateway: GatewayProcess) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    app_id = next(a for a, v in sorted(testbed.apps_by_id().items()) if v["serving"])
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.grpc_port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "understudy-gateway"
    assert client.is_model_ready(app_id)
    assert client.get_model_metadata(app_id).name == app_id
    assert client.get_model_config(app_id).config.name == app_id
    tensor = grpcclient.InferInput("image", list(IMAGE.shape), "FP32")
    tensor.set_data_from_numpy(IMAGE)
    result = client.infer(app_id, [tensor], client_timeout=60)
    assert result.get_response().model_name == app_id
    assert result.as_numpy("logits").shape == (1, 1000)
    cases = [("nope", "", "NOT_FOUND"), ("bad__id", "", "INVALID_ARGUMENT"),
             (app_id, "x", "INVALID_ARGUMENT")]
    for name, version, code in cases:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(name, [tensor], model_version=version)
        assert raised.value.status() == f"StatusCode.{code}", raised.value
    wrong = grpcclient.InferInput("nothing", [1], "FP32")
    wrong.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:  # Triton's own error, passed on
        client.infer(app_id, [wrong])
    assert "nothing" in str(raised.value) or "image" in str(raised.value)


def test_the_gateway_stops_within_two_seconds_answering_what_it_holds(tmp_path: Path) -> None:
    """SIGTERM with requests held by a replica that never answers (a socket that accepts and
    stays silent): each gets a 503 saying why, and the process is gone within 2 s."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    host = f"127.0.0.1:{silent.getsockname()[1]}"
    run_dir = tmp_path / "gw"
    run_dir.mkdir()
    route = {"http": host, "grpc": host, "model_name": "held__v", "server_id": "s1",
             "variant": "v", "accuracy": 1.0, "seq": 1}
    (run_dir / "routes.json").write_text(json.dumps({"version": 1, "last_seq": 1, "apps": {
        "held": {"serving": route, "backups": [], "seq": 1, "reason": ""}}}))
    gateway = start_gateway(run_dir, f"http://127.0.0.1:{free_port()}")
    answers: list[tuple[int, str]] = []

    def held() -> None:
        response = httpx.post(f"{gateway.url}/v2/models/held/infer", content=b"{}",
                              timeout=30)
        answers.append((response.status_code, response.text))

    threads = [threading.Thread(target=held) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        wait_until("the requests held at the silent replica",
                   lambda: _connections(silent) >= len(threads), 10, 0.02)
        took = gateway.stop()
    finally:
        silent.close()
        for thread in threads:
            thread.join(10)
    assert took < 2.0, took
    assert len(answers) == 3
    assert all(status == 503 and "stopping" in text for status, text in answers), answers
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gateway.url}/v2/health/live", timeout=2)


def _connections(listener: socket.socket) -> int:
    """Connections waiting in a listener's backlog (accepted by the kernel, never by us)."""
    port = listener.getsockname()[1]
    text = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in text if int(line.split()[2].split(":")[1], 16) == port
               and line.split()[3] == "01")


def _hellos(bed: Testbed, server_id: str) -> int:
    """How many times the server's agent has connected to a controller (from its log)."""
    log = Path(bed.state.processes[f"agent-{server_id}"].log)
    return log.read_text(errors="replace").count(f"connected to controller as {server_id}")
