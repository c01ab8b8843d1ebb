"""Hostile input against a real controller and Redis: agent frames, Redis contents, REST bodies.

The controller starts on a Redis seeded with records it cannot use (a NaN capacity as it was
written, ``null``; an empty server id; unparsable apps, config, intents, plan, graph, event and
revision): it must start, quarantine each, and serve. Then agents' hostile hellos and frames
over real websockets, oversized and non-finite REST bodies, and glob names on the artifact route.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from controller.credentials import CredentialStore
from controller.redis_server import RedisServer
from deploy.testbed import wait_until
from tests.integration.hostile_fixtures import artifact_store
from understudy.wire.credentials import bearer, read_token_file
from understudy.wire.ports import free_port
from understudy.wire.protocol import AGENT_WS_PATH, MAX_FRAME_BYTES

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]
GOOD_SERVER = {"server_id": "s1", "site_id": "site-a",
               "capacity": {"memory_mb": 100000.0, "compute": 1000.0}}
GOOD_APP = {"spec": {"app_id": "seed-a", "family": "mobilenet_v3"}}
BAD_SERVERS = {
    "s-nan": {**GOOD_SERVER, "server_id": "s-nan", "capacity": {"memory_mb": None}},
    "": {**GOOD_SERVER, "server_id": ""},
    "s-huge": {**GOOD_SERVER, "server_id": "s-huge", "capacity": {"memory_mb": 1e308}},
}
GOOD_DECLARATION = {"seq": 1, "server_id": "s1", "reason": "missed heartbeats",
                    "detected_at": 10.0, "last_seen": 9.9}


@dataclass
class Controller:
    http: httpx.Client
    redis: redis.Redis
    port: int
    log: Path
    artifacts: Path
    credentials: CredentialStore

    def auth(self, name: str) -> dict[str, str]:
        """The header presenting a named credential (``read`` ...)."""
        return bearer(read_token_file(self.credentials.token_path(name)))

    def agent_auth(self, server_id: str) -> dict[str, str]:
        """The header presenting a server's agent credential."""
        return bearer(self.credentials.agent_token(server_id))


def _seed(client: redis.Redis) -> None:
    client.hset("us:servers", mapping={"s1": json.dumps(GOOD_SERVER),
                                       **{k: json.dumps(v) for k, v in BAD_SERVERS.items()}})
    client.hset("us:apps", mapping={"seed-a": json.dumps(GOOD_APP), "junk": "{not json",
                                    "stolen": json.dumps({"spec": {"app_id": "other",
                                                                   "family": "f"}})})
    client.set("us:rev", "not-a-number")
    client.set("us:config", json.dumps({"heartbeat_interval_ms": 5e-324}))
    client.set("us:plan", "[unclosed")
    client.hset("us:intents", "i1", "[1, 2]")
    client.hset("us:graphs", "g1", "{}")
    client.xadd("us:events", {"data": json.dumps({"seq": 1, "app_id": "seed-a",
                                                  "kind": "registered"})}, id="1-0")
    client.xadd("us:events", {"data": "garbage"}, id="2-0")
    client.set("us:event_seq", "2")
    client.hset("us:declarations", mapping={"1": json.dumps(GOOD_DECLARATION),
                                             "2": "{not json"})
    client.set("us:declaration_seq", "2")


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    run_dir = tmp_path_factory.mktemp("hostile")
    server = RedisServer(run_dir / "redis")
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    _seed(client)
    artifacts = artifact_store(run_dir / "artifacts")
    port = free_port()
    log = run_dir / "controller.log"
    credentials = CredentialStore(run_dir / "credentials")
    credentials.init()
    with log.open("w") as out:
        process = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "understudy.cli.main", "controller", "--port", str(port),
             "--redis-url", server.redacted_url, "--redis-password-file",
             str(server.password_file), "--credentials-dir", str(credentials.directory),
             "--startup-grace-s", "3600",
             "--artifacts", str(artifacts), "--run-dir", str(run_dir / "controller")],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                        headers=bearer(read_token_file(credentials.token_path("admin"))))

    def ready() -> bool:
        assert process.poll() is None, f"the controller exited: {log.read_text()[-3000:]}"
        try:
            return http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("the controller", ready, 60)
        yield Controller(http, client, port, log, artifacts, credentials)
    finally:
        process.terminate()
        try:
            process.wait(15)  # SIGTERM stops it, even after event-stream clients came and left
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
            raise
        server.stop()


def _quarantined(client: redis.Redis) -> dict[str, dict[str, Any]]:
    return {k: json.loads(v) for k, v in client.hgetall("us:quarantine").items()}


def test_start_up_quarantines_every_record_it_cannot_use(controller: Controller) -> None:
    http = controller.http
    assert [s["server_id"] for s in http.get("/v1/servers").json()] == ["s1"]
    assert [a["app_id"] for a in http.get("/v1/apps").json()] == ["seed-a"]
    assert http.get("/v1/config").json()["heartbeat_interval_ms"] == 20.0  # the defaults
    assert http.get("/v1/plan").status_code == 404
    assert [e["seq"] for e in http.get("/v1/events").json()] == [1]
    assert http.get("/metrics").status_code == 200
    found = {(q["key"], q["field"]): q for q in _quarantined(controller.redis).values()}
    assert set(found) == {
        ("us:servers", "s-nan"), ("us:servers", ""), ("us:servers", "s-huge"),
        ("us:apps", "junk"), ("us:apps", "stolen"), ("us:rev", None), ("us:config", None),
        ("us:plan", None), ("us:intents", "i1"), ("us:graphs", "g1"), ("us:events", "2-0")}
    assert "capacity.memory_mb" in found["us:servers", "s-nan"]["reason"]
    assert found["us:apps", "junk"]["raw"] == "{not json"  # kept, to repair by hand
    assert set(controller.redis.hkeys("us:servers")) == {"s1"}
    assert controller.redis.get("us:rev").isdigit()
    log = controller.log.read_text()
    assert "quarantined us:servers field 's-nan'" in log and "Traceback" not in log


async def _refusal(controller: Controller, frames: list[str],
                   server_id: str = "g-1") -> tuple[int | None, str]:
    """Send ``frames`` as ``server_id``'s agent; the close code and reason the controller
    answered with."""
    async with connect(f"ws://127.0.0.1:{controller.port}{AGENT_WS_PATH}",
                       additional_headers=controller.agent_auth(server_id),
                       max_size=None) as ws:
        try:
            for frame in frames:
                await ws.send(frame)
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        except ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
    return None, ""


def _hello(server_id: str, capacity: str = '{"memory_mb": 1000.0}', **extra: Any) -> str:
    fields = "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items())
    return (f'{{"v": 1, "type": "hello", "server_id": {json.dumps(server_id)}, '
            f'"site_id": "site-h", "capacity": {capacity}{fields}}}')


@pytest.mark.parametrize("frame, code", [
    (_hello("h-nan", '{"memory_mb": NaN}'), 1008),
    (_hello("h-inf", '{"memory_mb": Infinity}'), 1008),
    (_hello("h-neg", '{"memory_mb": -5}'), 1008),
    (_hello(""), 1008),
    (_hello("h-beat", heartbeat_interval_ms=5e-324), 1008),
    (_hello("h-big", boot_id="x" * (MAX_FRAME_BYTES + 10)), 1009),
    ('{"v": 1, "type": "triton_down", "at": 1.0}', 1008),
    ("[" * 50_000, 1008),
], ids=["NaN", "Infinity", "negative", "empty id", "tiny beat", "too large", "no hello",
        "not JSON"])
def test_a_hostile_hello_closes_its_connection_and_leaves_no_trace(
        controller: Controller, frame: str, code: int) -> None:
    closed_with, reason = asyncio.run(_refusal(controller, [frame]))
    assert closed_with == code and reason, (closed_with, reason)
    assert not any(s.startswith("h-") or s == "" for s in controller.redis.hkeys("us:servers"))
    http = controller.http
    assert http.get("/v1/servers").status_code == 200
    assert http.get("/v1/apps").status_code == 200 and http.get("/metrics").status_code == 200
    assert http.get("/readyz").status_code == 200


def test_after_hostile_hellos_apps_still_register(controller: Controller) -> None:
    asyncio.run(_refusal(controller, [_hello("", '{"memory_mb": NaN}')]))
    created = controller.http.post("/v1/apps", json={"app_id": "after-hostile",
                                                     "family": "mobilenet_v3"})
    assert created.status_code == 201, created.text


def test_a_bad_frame_after_a_good_hello_closes_the_connection(controller: Controller) -> None:
    bad_result = ('{"v": 1, "type": "result", "command_id": "c1", "ok": true, '
                  '"timings": {"load_s": NaN}}')
    code, reason = asyncio.run(_refusal(controller, [_hello("g-1"), bad_result]))
    assert code == 1008 and "bad frame" in reason
    record = controller.http.get("/v1/servers/g-1").json()  # the valid hello was recorded
    assert record["capacity"] == {"memory_mb": 1000.0}


def test_config_refuses_tiny_and_non_finite_settings(controller: Controller) -> None:
    http = controller.http
    before = http.get("/v1/config").json()
    for body in ({"heartbeat_interval_ms": 5e-324}, {"time_limit_s": 5e-324}):
        response = http.patch("/v1/config", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == f"body.{next(iter(body))}"
    response = http.patch("/v1/config", content=b'{"alpha": NaN}',
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert http.get("/v1/config").json() == before


def test_an_infinite_slo_is_refused_not_stored_as_null(controller: Controller) -> None:
    response = controller.http.post(
        "/v1/apps", headers={"Content-Type": "application/json"},
        content=b'{"app_id": "slo-inf", "family": "mobilenet_v3", "latency_slo_ms": Infinity}')
    assert response.status_code == 422 and "latency_slo_ms" in response.text
    assert controller.http.get("/v1/apps/slo-inf").status_code == 404


def test_bodies_and_fields_are_bounded(controller: Controller) -> None:
    http = controller.http
    huge = {"app_id": "huge", "family": "mobilenet_v3", "pinned_site": "x" * 10_000_000}
    assert http.post("/v1/apps", json=huge).status_code == 413
    long_field = {**huge, "pinned_site": "x" * 500_000}
    refused = http.post("/v1/apps", json=long_field)
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == \
        "body.pinned_site"
    assert http.get("/v1/apps/huge").status_code == 404
    assert http.get("/v1/apps/" + "a" * 200).status_code == 422  # not echoed in a 404
    anonymous = httpx.Client(base_url=str(http.base_url), timeout=30)
    malformed = anonymous.post("/v1/apps", content=b"{" * 10_000_000,
                               headers={"Content-Type": "application/json"})
    assert malformed.status_code == 401  # refused on its headers, before any parsing
    error_schema = http.get("/openapi.json").json()["paths"]["/v1/apps"]["post"][
        "responses"]["422"]["content"]["application/json"]["schema"]
    assert error_schema == {"$ref": "#/components/schemas/ErrorBody"}
    body = refused.json()
    assert isinstance(body["detail"], str) and all(
        set(e) == {"field", "message"} for e in body["errors"])


def test_artifact_names_are_names_not_patterns(controller: Controller) -> None:
    http = controller.http
    real = http.get("/v1/artifacts/mobilenet_v3_small/manifest.json")
    assert real.status_code == 200 and real.json()["variant"] == "mobilenet_v3_small"
    for pattern in ("*", "mobilenet_v3_*", "[a-z]*", "..", "mobilenet_v3_small%2F.."):
        response = http.get(f"/v1/artifacts/{pattern}/manifest.json")
        assert response.status_code in (404, 422), (pattern, response.text)
        assert "weights_sha256" not in response.text  # no manifest, of any variant
    unknown = http.get("/v1/artifacts/resnet50/manifest.json")
    assert unknown.status_code == 404
    assert unknown.json() == {"detail": "unknown variant 'resnet50'"}
    assert str(controller.artifacts) not in unknown.text


async def _event_stream_refused(port: int, query: str, auth: dict[str, str]) -> bool:
    """Whether the events websocket refuses these query parameters (before sending anything)."""
    try:
        async with connect(f"ws://127.0.0.1:{port}/v1/events/ws?{query}",
                           additional_headers=auth) as ws:
            await asyncio.wait_for(ws.recv(), 0.5)
    except (InvalidStatus, ConnectionClosed):
        return True
    except TimeoutError:
        return False  # accepted: open, waiting for events
    return False


def test_the_event_stream_refuses_bad_query_parameters(controller: Controller) -> None:
    port = controller.port
    read = controller.auth("read")
    assert asyncio.run(_event_stream_refused(port, "since=-1", read))
    assert asyncio.run(_event_stream_refused(port, "app_id=" + "x" * 200, read))
    assert not asyncio.run(_event_stream_refused(port, "since=1000000&app_id=seed-a", read))


async def _frame_to_event_stream(controller: Controller, size: int = 100_000
                                 ) -> tuple[int | None, str]:
    async with connect(f"ws://127.0.0.1:{controller.port}/v1/events/ws?since=1000000",
                       additional_headers=controller.auth("read"), max_size=None) as ws:
        await ws.send("x" * size)
        try:
            await asyncio.wait_for(ws.recv(), 10)
        except ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
    return None, ""


def test_the_event_stream_takes_no_frames(controller: Controller) -> None:
    code, reason = asyncio.run(_frame_to_event_stream(controller))
    assert (code, reason) == (1008, "the event stream takes no frames")


def test_a_frame_over_the_protocol_limit_is_refused_by_the_server(controller: Controller) -> None:
    # The event stream's own refusal of any frame is 1008; uvicorn (ws_max_size) closes 1009
    # before the frame reaches it. With uvicorn's default (16 MiB) the frame was read whole.
    code, _ = asyncio.run(_frame_to_event_stream(controller, MAX_FRAME_BYTES + 1))
    assert code == 1009


def test_an_app_no_artifact_store_holds_is_refused_unless_provided(
        controller: Controller) -> None:
    http = controller.http
    refused = http.post("/v1/apps", json={"app_id": "no-weights", "family": "efficientnet"})
    assert refused.status_code == 422, refused.text
    assert "holds no variant of family 'efficientnet'" in refused.json()["detail"]
    partly = http.post("/v1/apps", json={"app_id": "no-large", "family": "shufflenet_v2"})
    assert partly.status_code == 422 and "shufflenet_v2_x0_5" in partly.json()["detail"]
    assert http.get("/v1/apps/no-weights").status_code == 404
    held = http.post("/v1/apps", json={"app_id": "small-weights", "family": "shufflenet_v2",
                                       "variant": "shufflenet_v2_x0_5"})
    provided = http.post("/v1/apps", json={"app_id": "own-weights", "family": "efficientnet",
                                           "artifacts_provided": True})
    assert (held.status_code, provided.status_code) == (201, 201), (held.text, provided.text)


def test_a_bad_declaration_is_quarantined_not_a_500(controller: Controller) -> None:
    listed = controller.http.get("/v1/declarations")
    assert listed.status_code == 200, listed.text
    seqs = [d["seq"] for d in listed.json()]  # with those of the agents the tests closed
    assert seqs[0] == 1 and 2 not in seqs
    found = {(q["key"], q["field"]) for q in _quarantined(controller.redis).values()}
    assert ("us:declarations", "2") in found
    assert "2" not in controller.redis.hkeys("us:declarations")
