"""Identities and TLS on a real controller (with its embedded Redis) and simulated agents.

The agents speak the real protocol over real sockets (``deploy.sim_agents``: websocket, UDP
heartbeats), each with its own server's credential. Impostors are raw websockets: another
server's credential, a second connection for a server, a fake ``triton_down``. Reads, /metrics
and the event stream need a credential of a role the access table allows; ``--insecure`` turns
that off with a warning; with ``--tls-cert``/``--tls-key`` the REST API and both websockets are
served over TLS, trusted with the CA ``understudy credentials tls`` makes and refused without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from controller.credentials import CredentialStore
from controller.tls import make_ca_and_server_cert
from deploy.sim_agents import LoadTimes, SimAgent, SimAgentConfig
from deploy.sim_driver import ControllerProcess
from deploy.sim_heartbeats import HeartbeatPump
from model_repo.profiles import load_families
from tests.integration.agent_peer import LoopThread
from understudy.client import ClientError, UnderstudyClient
from understudy.wire.credentials import bearer, client_ssl_context, read_token_file
from understudy.wire.ports import free_port
from understudy.wire.protocol import AGENT_WS_PATH

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
CAPACITY = {"memory_mb": 4000.0, "compute": 100.0}
WAIT_S = 60.0


def wait_until(what: str, condition: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _hello(server_id: str) -> str:
    return json.dumps({"v": 1, "type": "hello", "server_id": server_id, "site_id": "site-x",
                       "capacity": CAPACITY, "boot_id": f"impostor-{server_id}"})


TRITON_DOWN = json.dumps({"v": 1, "type": "triton_down", "at": 1.0, "exit_code": -9,
                          "restarting": False, "lost_models": []})


async def _closed(ws: ClientConnection, timeout_s: float = 20.0) -> tuple[int | None, str]:
    """Read until the controller closes ``ws``: its close code and reason."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                await ws.recv()
    except ConnectionClosed as closed:
        return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")


@dataclass
class Cluster:
    controller: ControllerProcess
    store: CredentialStore
    loop: LoopThread
    agents: dict[str, SimAgent]

    def auth(self, name: str) -> dict[str, str]:
        return bearer(read_token_file(self.store.token_path(name)))

    def agent_auth(self, server_id: str) -> dict[str, str]:
        return bearer(self.store.agent_token(server_id))

    def server(self, server_id: str) -> dict[str, Any]:
        return dict(self.controller.http.get(f"/v1/servers/{server_id}").json())

    @property
    def ws_url(self) -> str:
        return self.controller.url.replace("http://", "ws://")

    def log(self) -> str:
        return self.controller.log_path.read_text(errors="replace")


def _start_agents(loop: LoopThread, pump: HeartbeatPump, url: str, tokens: dict[str, str],
                  ca_file: Path | None = None) -> dict[str, SimAgent]:
    load_times = LoadTimes(load_families(), 1.0)
    agents: dict[str, SimAgent] = {}

    async def start() -> None:
        for server_id, token in tokens.items():
            config = SimAgentConfig(server_id=server_id, site_id=f"site-{server_id}",
                                    controller_url=url, capacity=dict(CAPACITY), token=token,
                                    ca_file=ca_file)
            agents[server_id] = SimAgent(config, pump, load_times)
            agents[server_id].start()

    loop.call(start())
    return agents


def _stop_agents(loop: LoopThread, agents: dict[str, SimAgent]) -> None:
    async def stop() -> None:
        for agent in agents.values():
            await agent.stop()

    loop.call(stop())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    controller = ControllerProcess(tmp_path_factory.mktemp("identities"), log_level="INFO")
    assert controller.credentials is not None
    store = CredentialStore(controller.credentials)
    loop = LoopThread()
    pump = HeartbeatPump(0.02).start()
    agents: dict[str, SimAgent] = {}
    try:
        controller.wait_ready()
        agents = _start_agents(loop, pump, controller.url,
                               {s: store.agent_token(s) for s in ("s1", "s2")})
        bed = Cluster(controller, store, loop, agents)
        wait_until("s1 and s2 up and connected", lambda: all(
            (bed.server(s).get("state"), bed.server(s).get("connected")) == ("up", True)
            for s in ("s1", "s2")))
        yield bed
    finally:
        _stop_agents(loop, agents)
        loop.close()
        pump.stop()
        controller.stop()


# --- agents speak only for their own server ----------------------------------------------------

async def _impostor(cluster: Cluster, credential: str, server_id: str) -> tuple[int | None, str]:
    """Connect with ``credential``'s agent credential, say hello as ``server_id``, then report
    Triton dead; the close code and reason the controller answered with."""
    async with connect(cluster.ws_url + AGENT_WS_PATH, proxy=None,
                       additional_headers=cluster.agent_auth(credential)) as ws:
        await ws.send(_hello(server_id))
        with contextlib.suppress(ConnectionClosed):  # refused already: nothing more is read
            await ws.send(TRITON_DOWN)
        return await _closed(ws)


def test_an_agent_with_another_servers_credential_is_refused_and_changes_nothing(
        cluster: Cluster) -> None:
    before = cluster.server("s1")
    code, reason = asyncio.run(_impostor(cluster, "s2", "s1"))
    assert code == 1008 and "speaks for server s2, not s1" in reason
    after = cluster.server("s1")
    assert (after["state"], after["connected"], after["boot_id"]) == (
        "up", True, before["boot_id"])  # the fake triton_down after the hello did nothing
    declarations = cluster.controller.http.get("/v1/declarations").json()
    assert not [d for d in declarations if d["server_id"] == "s1"]
    assert "its credential is s2's, its hello claims server s1" in cluster.log()


async def _upgrade_status(url: str, headers: dict[str, str]) -> int:
    try:
        async with connect(url, proxy=None, additional_headers=headers):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_only_an_agent_credential_opens_the_agent_socket(cluster: Cluster) -> None:
    url = cluster.ws_url + AGENT_WS_PATH
    assert asyncio.run(_upgrade_status(url, {})) == 401
    assert asyncio.run(_upgrade_status(url, bearer("agent.0.s1." + "0" * 64))) == 401
    for name in ("admin", "read", "client", "gateway"):
        assert asyncio.run(_upgrade_status(url, cluster.auth(name))) == 403, name


async def _second_connection(cluster: Cluster) -> tuple[tuple[int | None, str],
                                                        tuple[int | None, str], bool]:
    url = cluster.ws_url + AGENT_WS_PATH
    async with connect(url, proxy=None, additional_headers=cluster.agent_auth("s9")) as first:
        await first.send(_hello("s9"))
        assert json.loads(await first.recv())["type"] == "heartbeat_channel"  # accepted
        async with connect(url, proxy=None,
                           additional_headers=cluster.agent_auth("s9")) as second:
            await second.send(_hello("s9"))
            assert json.loads(await second.recv())["type"] == "heartbeat_channel"
            replaced = await _closed(first)
            async with connect(url, proxy=None,
                               additional_headers=cluster.agent_auth("s8")) as third:
                await third.send(_hello("s9"))
                refused = await _closed(third)
            still_open = cluster.server("s9")["connected"]
    return replaced, refused, still_open


def test_a_second_connection_for_a_server_needs_that_servers_credential(
        cluster: Cluster) -> None:
    replaced, refused, still_open = asyncio.run(_second_connection(cluster))
    assert replaced[0] == 1001  # the first connection made way for the second
    assert refused[0] == 1008 and "not s9" in refused[1]
    assert still_open  # the second connection, with s9's credential, stayed
    assert "server s9 connected again (with its own credential)" in cluster.log()


# --- reads need a credential -------------------------------------------------------------------

def test_reads_metrics_and_the_event_stream_need_a_read_credential(cluster: Cluster) -> None:
    base = cluster.controller.url
    anonymous = httpx.Client(base_url=base, timeout=10)
    for path in ("/v1/apps", "/v1/servers", "/v1/config", "/v1/events", "/metrics",
                 "/v1/apps/nope", "/v1/declarations"):
        answer = anonymous.get(path)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", path
    assert anonymous.get("/healthz").status_code == 200
    assert anonymous.get("/readyz").status_code == 200
    read = httpx.Client(base_url=base, timeout=10, headers=cluster.auth("read"))
    client = httpx.Client(base_url=base, timeout=10, headers=cluster.auth("client"))
    gateway = httpx.Client(base_url=base, timeout=10, headers=cluster.auth("gateway"))
    assert read.get("/v1/apps").status_code == 200
    assert "understudy_" in read.get("/metrics").text
    assert client.get("/metrics").status_code == 403
    assert client.get("/v1/apps").status_code == 403  # a client resolves one app, lists none
    assert client.get("/v1/apps/nope").status_code == 404  # ... which it may
    assert gateway.get("/v1/servers").status_code == 200
    assert gateway.get("/v1/config").status_code == 403
    assert read.patch("/v1/config", json={"alpha": 0.2}).status_code == 403
    assert read.get("/v1/artifacts/mobilenet_v3_small/manifest.json").status_code == 403
    events = cluster.ws_url + "/v1/events/ws?since=0"
    assert asyncio.run(_upgrade_status(events, {})) == 401
    for name in ("read", "client", "gateway", "admin"):
        assert asyncio.run(_upgrade_status(events, cluster.auth(name))) == 101, name


# --- insecure mode -------------------------------------------------------------------------------

def test_insecure_mode_needs_no_credential_and_warns(tmp_path: Path) -> None:
    controller = ControllerProcess(tmp_path, insecure=True, log_level="INFO")
    try:
        controller.wait_ready()
        assert controller.credentials is None
        anonymous = controller.http
        assert anonymous.get("/v1/apps").status_code == 200
        assert anonymous.patch("/v1/config", json={"alpha": 0.2}).status_code == 200
        ws = controller.url.replace("http://", "ws://")
        assert asyncio.run(_upgrade_status(ws + "/v1/events/ws", {})) == 101
        log = controller.log_path.read_text()
        assert "WARNING" in log and "authentication is OFF (--insecure)" in log
        assert not (tmp_path / "ctl" / "credentials").exists()
    finally:
        controller.stop()


# --- TLS ---------------------------------------------------------------------------------------

@dataclass
class TlsController:
    url: str
    ca: Path
    store: CredentialStore
    log: Path


@pytest.fixture()
def tls_controller(tmp_path: Path) -> Iterator[TlsController]:
    """A controller serving HTTPS/WSS, its credentials made on its first start (no store yet)."""
    files = make_ca_and_server_cert(tmp_path / "tls", ["127.0.0.1", "localhost"])
    port = free_port()
    run_dir = tmp_path / "ctl"
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", "controller",
             "--port", str(port), "--run-dir", str(run_dir), "--tls-cert",
             str(files.server_cert), "--tls-key", str(files.server_key)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    verified = httpx.Client(base_url=url, timeout=5, verify=client_ssl_context(files.ca_cert))

    def ready() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return verified.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("the TLS controller", ready)
        yield TlsController(url, files.ca_cert, CredentialStore(run_dir / "credentials"), log)
    finally:
        verified.close()
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_first_start_makes_private_credentials_and_says_where(
        tls_controller: TlsController) -> None:
    store = tls_controller.store
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    for name in ("admin", "read", "client", "gateway"):
        assert stat.S_IMODE(store.token_path(name).stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert f"credentials generated in {store.directory}" in tls_controller.log.read_text()


async def _wss_status(url: str, headers: dict[str, str], context: ssl.SSLContext | None) -> int:
    try:
        async with connect(url, proxy=None, additional_headers=headers,
                           **({"ssl": context} if context else {})):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_rest_and_both_websockets_over_tls_verified_by_the_ca(
        tls_controller: TlsController) -> None:
    url, ca, store = tls_controller.url, tls_controller.ca, tls_controller.store
    read = bearer(read_token_file(store.token_path("read")))
    trusted = client_ssl_context(ca)
    with httpx.Client(base_url=url, timeout=10, verify=trusted, headers=read) as http:
        assert http.get("/v1/apps").status_code == 200
    # A client without the CA fails the handshake: nothing is sent.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/v1/apps", headers=read, timeout=10)
    wss = url.replace("https://", "wss://")
    assert asyncio.run(_wss_status(wss + "/v1/events/ws", read, trusted)) == 101
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_wss_status(wss + "/v1/events/ws", read, client_ssl_context(None)))
    # An agent over wss, verifying with the CA, with its own credential.
    loop = LoopThread()
    pump = HeartbeatPump(0.02).start()
    agents: dict[str, SimAgent] = {}
    try:
        agents = _start_agents(loop, pump, url, {"t1": store.agent_token("t1")}, ca_file=ca)
        with httpx.Client(base_url=url, timeout=10, verify=trusted, headers=read) as http:
            wait_until("t1 up over wss", lambda: (lambda s: (s.get("state"), s.get(
                "connected")))(http.get("/v1/servers/t1").json()) == ("up", True))
    finally:
        _stop_agents(loop, agents)
        loop.close()
        pump.stop()
    # The SDK, with a client credential and the CA, reaches the controller; without the CA not.
    client_token = store.token_path("client")
    with pytest.raises(ClientError, match="not registered"):
        UnderstudyClient(url, "nope", token_file=client_token, ca_file=ca).resolve()
    assert UnderstudyClient(url, "nope", token_file=client_token).resolve() is None
