"""The SDK's transports on real Tritons with a model of non-image tensors (INT64, BOOL, FP16,
BYTES in; FP64, INT32, BYTES out): sync and asyncio, HTTP and gRPC, metadata and readiness, and
resends when a Triton dies or freezes under requests. Routes are set by the test, as the
controller would set them (test_sdk.py has the SDK on a real controller and agents)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.triton import TritonServer
from agent.triton_config import TritonConfig
from deploy.testbed import wait_until
from understudy.sdk import (
    AsyncClient,
    Client,
    InferenceError,
    Location,
    RequestRecord,
    SdkError,
)
from understudy.sdk.board import RouteBoard
from understudy.sdk.routes import AppRoute
from understudy.wire.ports import free_ports

pytestmark = pytest.mark.timeout(300)

MODEL = "tensors"
CONFIG = f'''name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "tokens" data_type: TYPE_INT64 dims: [ -1, -1 ] }},
  {{ name: "mask" data_type: TYPE_BOOL dims: [ -1, -1 ] }},
  {{ name: "scale" data_type: TYPE_FP16 dims: [ 1 ] }},
  {{ name: "text" data_type: TYPE_STRING dims: [ -1 ] }}
]
output [
  {{ name: "total" data_type: TYPE_FP64 dims: [ -1 ] }},
  {{ name: "kept" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "upper" data_type: TYPE_STRING dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
'''
SOURCE = '''
import os, site, sys
_base = list(sys.path)
for _entry in os.environ.get("UNDERSTUDY_PYTHONPATH", "").split(os.pathsep):
    if _entry:
        site.addsitedir(_entry)
sys.path[:] = [p for p in sys.path if p not in _base] + _base
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            kept = (get("tokens") * get("mask")).astype(np.int32)
            total = kept.sum(axis=-1).astype(np.float64) * float(get("scale")[0])
            upper = np.array([t.upper() for t in get("text")], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("total", total), pb_utils.Tensor("kept", kept),
                pb_utils.Tensor("upper", upper)]))
        return responses
'''


def start_triton(root: Path) -> TritonServer:
    ports = free_ports(3)
    repository = root / "repository"
    (repository / MODEL / "1").mkdir(parents=True)
    (repository / MODEL / "config.pbtxt").write_text(CONFIG)
    (repository / MODEL / "1" / "model.py").write_text(SOURCE)
    server = TritonServer(TritonConfig(
        model_repository=repository, work_dir=root / "work", http_port=ports[0],
        grpc_port=ports[1], metrics_port=ports[2], use_runtime=False, model_backend="python"))
    server.start()
    server.load(MODEL)
    return server


def location(server: TritonServer, server_id: str) -> Location:
    return Location(http=server.config.http_url, grpc=server.config.grpc_url, model_name=MODEL,
                    server_id=server_id, variant="v1", accuracy=1.0)


class SetRoutes:
    """Routes set by the test, the way the controller's events set them."""

    def __init__(self, routes: dict[str, Location]) -> None:
        self.board = RouteBoard()
        self.routes = routes

    async def resolve(self, app_id: str, deadline: float) -> AppRoute:
        if self.board.route(app_id) is None:
            self.board.place(app_id, self.routes[app_id])
        route = self.board.route(app_id)
        assert route is not None
        return route


class Mover:
    """Moves an app on the loop each client runs on (the board belongs to that loop)."""

    def __init__(self) -> None:
        self.targets: list[tuple[asyncio.AbstractEventLoop, SetRoutes]] = []

    def add(self, loop: asyncio.AbstractEventLoop, routes: SetRoutes) -> None:
        self.targets.append((loop, routes))

    def move(self, app_id: str, to: Location) -> None:
        for loop, routes in self.targets:
            loop.call_soon_threadsafe(routes.board.place, app_id, to)


@pytest.fixture
def tritons(tmp_path: Path) -> Iterator[list[TritonServer]]:
    servers: list[TritonServer] = []
    try:
        for name in ("one", "two"):
            servers.append(start_triton(tmp_path / name))
        yield servers
    finally:
        for server in servers:
            server.kill()


def inputs_from(spec: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs built from the model's metadata: names, types and shapes as it says."""
    arrays = {}
    for tensor in spec.inputs:
        array = tensor.zeros(any_size=3)
        if tensor.datatype == "BYTES":
            array = np.array([f"word{i}".encode() for i in range(array.size)],
                             dtype=object).reshape(array.shape)
        elif tensor.datatype == "BOOL":
            array = rng.random(array.shape) > 0.3
        elif tensor.datatype == "FP16":
            array = np.full(array.shape, 0.5, dtype=np.float16)
        else:
            array = rng.integers(0, 100, array.shape).astype(tensor.dtype)
        arrays[tensor.name] = array
    return arrays


def check(outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    kept = inputs["tokens"] * inputs["mask"]
    np.testing.assert_array_equal(outputs["kept"], kept.astype(np.int32))
    assert outputs["kept"].dtype == np.int32
    np.testing.assert_allclose(outputs["total"], kept.sum(axis=-1) * 0.5)
    assert outputs["total"].dtype == np.float64
    assert [t.decode() for t in outputs["upper"]] == [t.decode().upper() for t in inputs["text"]]


def test_any_tensors_over_http_and_grpc_sync_and_asyncio(tritons: list[TritonServer]) -> None:
    where = {"app": location(tritons[0], "s1")}
    rng = np.random.default_rng(3)
    for protocol in ("http", "grpc"):
        with Client(routes=SetRoutes(where), protocol=protocol) as client:
            meta = client.metadata("app")
            assert [t.name for t in meta.inputs] == ["tokens", "mask", "scale", "text"]
            assert meta.input("tokens").shape == (-1, -1) and meta.input("text").datatype == \
                "BYTES"
            assert meta.output("kept").datatype == "INT32" and meta.server_id == "s1"
            assert client.ready("app")
            inputs = inputs_from(meta, rng)
            result = client.infer("app", inputs)
            check(result.outputs, inputs)
            assert result.record.ok and result.record.protocol == protocol
            only = client.infer("app", inputs, ["upper"])
            assert list(only.outputs) == ["upper"]
            with pytest.raises(InferenceError) as raised:  # Triton's own refusal, not resent
                client.infer("app", {"tokens": inputs["tokens"]})
            assert raised.value.record is not None and raised.value.record.attempts == 1

        async def asynchronous(protocol: str = protocol) -> None:
            async with AsyncClient(routes=SetRoutes(where), protocol=protocol) as client:
                meta = await client.metadata("app")
                inputs = inputs_from(meta, rng)
                results = await asyncio.gather(*(client.infer("app", inputs) for _ in range(8)))
                for result in results:
                    check(result.outputs, inputs)
                assert await client.ready("app")

        asyncio.run(asynchronous())


class Load:
    """A sync HTTP client in threads and an asyncio gRPC client, each in a loop."""

    def __init__(self, where: dict[str, Location], mover: Mover) -> None:
        self.records: list[RequestRecord] = []
        self.errors: list[SdkError] = []
        self.stop = threading.Event()
        self.inputs = inputs_from_static()
        routes = SetRoutes(where)
        self.sync = Client(routes=routes, protocol="http", timeout_s=60)
        self.sync._loop.call_soon_threadsafe(mover.add, self.sync._loop, routes)  # noqa: SLF001
        self.mover = mover
        self.threads = [threading.Thread(target=self._sync_loop, daemon=True) for _ in range(2)]
        self.threads.append(threading.Thread(target=lambda: asyncio.run(self._async_loop(where)),
                                             daemon=True))
        for thread in self.threads:
            thread.start()

    def _sync_loop(self) -> None:
        while not self.stop.is_set():
            try:
                result = self.sync.infer("app", self.inputs)
                check(result.outputs, self.inputs)
                self.records.append(result.record)
            except SdkError as exc:
                self.errors.append(exc)
            self.stop.wait(0.01)

    async def _async_loop(self, where: dict[str, Location]) -> None:
        routes = SetRoutes(where)
        self.mover.add(asyncio.get_running_loop(), routes)
        async with AsyncClient(routes=routes, protocol="grpc", timeout_s=60) as client:

            async def one() -> None:
                while not self.stop.is_set():
                    try:
                        result = await client.infer("app", self.inputs)
                        check(result.outputs, self.inputs)
                        self.records.append(result.record)
                    except SdkError as exc:
                        self.errors.append(exc)
                    await asyncio.sleep(0.01)

            await asyncio.gather(one(), one())

    def answered_since(self, at: float, server: str | None = None) -> int:
        return sum(1 for r in list(self.records)
                   if r.sent_at > at and server in (None, r.server_id))

    def finish(self) -> list[RequestRecord]:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        self.sync.close()
        return list(self.records)


def inputs_from_static() -> dict[str, np.ndarray]:
    return {"tokens": np.arange(12, dtype=np.int64).reshape(3, 4),
            "mask": np.array([[True, False, True, True]] * 3),
            "scale": np.array([0.5], dtype=np.float16),
            "text": np.array([b"a", b"bc", b"def"], dtype=object)}


def test_clients_survive_a_killed_triton_and_resend_what_a_frozen_one_held(
        tritons: list[TritonServer]) -> None:
    one, two = tritons
    mover = Mover()
    load = Load({"app": location(one, "s1")}, mover)
    wait_until("answers from the first Triton", lambda: load.answered_since(0, "s1") >= 8, 60,
               0.05)
    # Frozen: requests hang in it until the app moves; they are cancelled and resent.
    os.kill(one.pid or 0, signal.SIGSTOP)
    try:
        time.sleep(0.3)  # let requests pile up in the frozen server
        moved_at = time.time()
        mover.move("app", location(two, "s2"))
        wait_until("answers from the second Triton",
                   lambda: load.answered_since(moved_at, "s2") >= 8, 60, 0.05)
    finally:
        os.kill(one.pid or 0, signal.SIGCONT)
    # Killed: requests fail, wait for the move, and go there.
    mover.move("app", location(one, "s1"))
    back = time.time()
    wait_until("answers from the first Triton again",
               lambda: load.answered_since(back, "s1") >= 8, 60, 0.05)
    one.kill()
    killed = time.time()
    time.sleep(0.3)  # requests fail against the dead server and wait
    moved_again = time.time()
    mover.move("app", location(two, "s2"))
    wait_until("answers after the kill", lambda: load.answered_since(killed, "s2") >= 8, 60,
               0.05)
    records = load.finish()
    assert not load.errors, load.errors[:3]
    assert {r.protocol for r in records} == {"http", "grpc"}
    resent = [r for r in records if moved_at - 0.5 < r.sent_at < moved_at and r.moved]
    assert resent and all(r.server_id == "s2" for r in resent)
    # Requests the kill caught failed, waited for the move and were answered after it.
    caught = [r for r in records if back < r.sent_at < moved_again and r.done_at > killed]
    assert caught and all(r.server_id == "s2" and r.resends for r in caught)
