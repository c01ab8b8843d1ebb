"""Who reaches Triton: clients infer on its address; only its agent loads, unloads and lists.

A real Triton started by a real agent (driven by the test peer) and standalone Tritons: a client
on the loopback without the agent's key is refused every model-control call over HTTP and gRPC
while inference stays open; Triton listens on the loopback only (or on exactly the address
given); the key is new at each start; it never appears in the agent's log.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.triton import TritonServer
from agent.triton_access import (
    GRPC_MODEL_CONTROL_HEADER,
    MODEL_CONTROL_HEADER,
    model_control_headers,
)
from agent.triton_config import TritonConfig
from tests.integration.test_agent import Harness, _infer, _start, _stop
from understudy.wire.ports import free_ports

pytestmark = pytest.mark.timeout(240)

MODEL = "app1__mobilenet_v3_small"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, artifact_store: Path) -> Iterator[Harness]:
    h = _start(tmp_path_factory.mktemp("agent"), artifact_store)
    loaded = h.call(h.peer.command("load", app_id="app1", variant="mobilenet_v3_small"))
    assert loaded.ok, loaded.error
    yield h
    _stop(h)


def _listening(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp{,6}); an
    IPv4-mapped IPv6 address (gRPC's listener) as the IPv4 address it is."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                local, _, state = line.split()[1:4]
                address, _, hex_port = local.partition(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)
                # The kernel writes each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                mapped = getattr(ip, "ipv4_mapped", None)
                found.append(str(mapped or ip))
    return found


def _other_address() -> str | None:
    """An address of this machine that is not the loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address  # noqa: S104


def _refused(call: object, *args: object, **kwargs: object) -> str:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as refused:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(refused.value)


def test_a_client_infers_but_cannot_control_models(harness: Harness) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    hello = harness.hello()
    assert hello.endpoints is not None
    logits = _infer(hello, MODEL)
    assert logits.shape == (2, 1000) and np.isfinite(logits).all()
    http = httpclient.InferenceServerClient(hello.endpoints.http)
    grpc = grpcclient.InferenceServerClient(hello.endpoints.grpc)
    try:
        assert http.is_server_ready() and http.is_model_ready(MODEL)
        assert grpc.is_server_ready() and grpc.is_model_ready(MODEL)
        assert http.get_model_metadata(MODEL)["name"] == MODEL
        assert http.get_inference_statistics(MODEL)["model_stats"]
        for client, header in ((http, MODEL_CONTROL_HEADER), (grpc, GRPC_MODEL_CONTROL_HEADER)):
            for headers in (None, {header: "not-the-key"}):
                message = _refused(client.unload_model, MODEL, headers=headers)
                assert "is restricted, expecting header" in message, message
                _refused(client.load_model, "app1__mobilenet_v3_large", headers=headers)
                _refused(client.get_model_repository_index, headers=headers)
        # Nothing was unloaded or loaded behind the agent's back.
        assert http.is_model_ready(MODEL)
        assert not http.is_model_ready("app1__mobilenet_v3_large")
        inventory = harness.call(harness.peer.command("inventory")).inventory
        assert [i.model_name for i in inventory] == [MODEL]
        # A tool run by the agent's user reads the key from the agent's run directory.
        key = model_control_headers(harness.agent.triton.config.work_dir)
        index = http.get_model_repository_index(headers=key)
        assert [e["name"] for e in index if e.get("state") == "READY"] == [MODEL]
        work_dir = harness.agent.triton.config.work_dir
        index = grpc.get_model_repository_index(
            headers=model_control_headers(work_dir, grpc=True), as_json=True)
        assert [m["name"] for m in index["models"] if m.get("state") == "READY"] == [MODEL]
    finally:
        http.close()
        grpc.close()


def test_triton_listens_on_the_loopback_only(harness: Harness) -> None:
    config = harness.agent.triton.config
    for port in (config.http_port, config.grpc_port, config.metrics_port):
        assert _listening(port) == ["127.0.0.1"], port
    other = _other_address()
    if other is None:
        pytest.skip("this machine has no address besides the loopback")
    with pytest.raises(OSError), socket.create_connection((other, config.http_port), 2):
        pass


def test_the_key_is_private_and_never_logged(harness: Harness) -> None:
    triton = harness.agent.triton
    key = model_control_headers(triton.config.work_dir)[MODEL_CONTROL_HEADER]
    assert triton.control_key_file.stat().st_mode & 0o777 == 0o600
    for log in triton.config.work_dir.parent.rglob("*.log"):
        assert key not in log.read_text(errors="replace"), log


def _standalone(root: Path, host: str = "127.0.0.1") -> TritonServer:
    ports = free_ports(3)
    return TritonServer(TritonConfig(
        model_repository=root / "repository", work_dir=root / "triton", http_port=ports[0],
        grpc_port=ports[1], metrics_port=ports[2], host=host, use_runtime=False,
        model_backend="python"))


def test_each_start_has_a_new_key(tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    server = _standalone(tmp_path)
    server.start()
    try:
        first = model_control_headers(server.config.work_dir)
        assert server.repository_index() == []
        server.stop()
        server.start()
        second = model_control_headers(server.config.work_dir)
        assert first != second
        assert server.repository_index() == []  # the agent's calls carry the new key
        client = httpclient.InferenceServerClient(server.config.http_url)
        try:
            _refused(client.get_model_repository_index, headers=first)
            assert client.get_model_repository_index(headers=second) == []
        finally:
            client.close()
    finally:
        server.stop()


def test_a_private_address_is_the_only_one_listened_on(tmp_path: Path) -> None:
    """``--triton-address``: Triton listens on that address alone (127.0.0.2 stands in for a
    private interface; a host name is resolved first)."""
    server = _standalone(tmp_path, host="127.0.0.2")
    server.start()
    try:
        assert server.is_ready()
        for port in (server.config.http_port, server.config.grpc_port):
            assert _listening(port) == ["127.0.0.2"]
        with pytest.raises(OSError), socket.create_connection(
                ("127.0.0.1", server.config.http_port), 2):
            pass
    finally:
        server.stop()
    assert TritonConfig(model_repository=tmp_path, work_dir=tmp_path, http_port=1, grpc_port=2,
                        metrics_port=3, host="localhost").bind_address() == "127.0.0.1"
