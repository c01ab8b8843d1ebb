"""The REST API's front gate and error bodies, on the ASGI app in process (no socket, no Redis).

The controller behind it is a stand-in that fails the test if a refused request reaches it; the
same requests against a real controller are in ``tests/integration/test_hostile_controller.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from controller.access import Gate
from controller.api import create_app
from controller.credentials import Role
from controller.http_guard import MAX_BODY_BYTES

TOKEN = "front-gate"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class UnreadableStore:
    """Redis answers, but the records cannot be read."""

    async def ping(self) -> bool:
        return True

    async def view(self) -> Any:
        raise RuntimeError("records unreadable")


class Untouchable:
    """Any use of the core fails the test: refused requests must not get this far."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused request reached the controller ({name})")


class CountingApp:
    """Counts how often the app under test asked for the request's body."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.body_reads = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            self.body_reads += 1
            return await receive()

        await self.app(scope, counted, send)


@pytest.fixture()
def api() -> Iterator[tuple[CountingApp, Any]]:
    controller = SimpleNamespace(gate=Gate.with_tokens({TOKEN: Role.ADMIN}), ready=True,
                                 store=UnreadableStore(), orchestrator=Untouchable(),
                                 graphs=Untouchable(), lifecycle=Untouchable())
    app = create_app(controller)  # type: ignore[arg-type]
    yield CountingApp(app), app


def _call(app: CountingApp, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(call())


def test_a_huge_malformed_body_without_the_token_is_refused_unread(
        api: tuple[CountingApp, Any]) -> None:
    counting, _ = api
    body = b"{" * 10_000_000
    response = _call(counting, "POST", "/v1/apps", content=body)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": "missing or unknown credential"}
    assert counting.body_reads == 0


def test_a_body_over_the_limit_is_413_before_it_is_read(api: tuple[CountingApp, Any]) -> None:
    counting, _ = api
    response = _call(counting, "POST", "/v1/apps", headers=AUTH,
                     content=b"{" * (MAX_BODY_BYTES + 1))
    assert response.status_code == 413 and "larger than" in response.json()["detail"]
    assert counting.body_reads == 0


def test_a_body_without_a_length_is_stopped_at_the_limit(api: tuple[CountingApp, Any]) -> None:
    counting, _ = api

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b" " * 65536  # 2.5 MiB in all, sent without a Content-Length

    response = _call(counting, "PATCH", "/v1/config", headers=AUTH, content=chunks())
    assert response.status_code == 413 and "larger than" in response.json()["detail"]
    assert counting.body_reads <= MAX_BODY_BYTES // 65536 + 2


def test_readyz_says_503_when_the_records_cannot_be_read(api: tuple[CountingApp, Any]) -> None:
    counting, _ = api
    response = _call(counting, "GET", "/readyz")
    assert response.status_code == 503 and response.json() == {"ready": False}


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _violations(value: Any, schema: dict[str, Any], spec: dict[str, Any],
                where: str = "body") -> list[str]:
    """Where ``value`` breaks the JSON schema (the subset FastAPI writes for our models)."""
    schema = _resolve(schema, spec)
    if "anyOf" in schema:
        fits = [not _violations(value, s, spec, where) for s in schema["anyOf"]]
        return [] if any(fits) else [f"{where}: matches no alternative"]
    kinds = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool,
             "number": (int, float), "null": type(None)}
    kind = schema.get("type")
    if kind is not None and not isinstance(value, kinds[kind]):
        return [f"{where}: {type(value).__name__} where the schema says {kind}"]
    problems = []
    if kind == "object":
        problems += [f"{where}.{k}: required" for k in schema.get("required", ())
                     if k not in value]
        for key, item in value.items():
            if key in schema.get("properties", {}):
                problems += _violations(item, schema["properties"][key], spec, f"{where}.{key}")
    if kind == "array":
        for i, item in enumerate(value):
            problems += _violations(item, schema.get("items", {}), spec, f"{where}[{i}]")
    return problems


@pytest.mark.parametrize("method, path, route, body", [
    ("POST", "/v1/apps", "/v1/apps", {"family": "mobilenet_v3"}),
    ("POST", "/v1/apps", "/v1/apps",
     {"app_id": "a", "family": "mobilenet_v3", "pinned_site": "x" * 200}),
    ("POST", "/v1/apps/batch", "/v1/apps/batch", {"apps": []}),
    ("PATCH", "/v1/config", "/v1/config", {"heartbeat_interval_ms": 5e-324}),
    ("PATCH", "/v1/config", "/v1/config", {"time_limit_s": 5e-324}),
    ("GET", "/v1/events?since=-1", "/v1/events", None),
    ("GET", "/v1/artifacts/*/manifest.json", "/v1/artifacts/{variant}/{name}", None),
])
def test_every_422_body_matches_the_schema_the_api_documents(
        api: tuple[CountingApp, Any], method: str, path: str, route: str, body: Any) -> None:
    counting, app = api
    spec = app.openapi()
    response = _call(counting, method, path, headers=AUTH, json=body)
    assert response.status_code == 422, response.text
    documented = spec["paths"][route][method.lower()]["responses"]["422"]
    schema = documented["content"]["application/json"]["schema"]
    assert _violations(response.json(), schema, spec) == []
    assert response.json()["errors"], "each field's problem is named"


def test_the_schema_documents_our_error_body_everywhere(api: tuple[CountingApp, Any]) -> None:
    _, app = api
    spec = app.openapi()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    error_refs = set()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status.startswith("4") and status != "400":  # 400: the HTTP server's own
                    error_refs.add(answer["content"]["application/json"]["schema"]["$ref"])
            if method in ("post", "patch", "delete"):
                assert {"401", "413"} <= operation["responses"].keys(), (method, path)
    assert error_refs == {"#/components/schemas/ErrorBody"}
    # A plain error ({"detail": "..."}) is an ErrorBody too.
    assert _violations({"detail": "app 'x' is not registered"},
                       {"$ref": "#/components/schemas/ErrorBody"}, spec) == []
    # FastAPI's own format (detail a list) is not: the check has teeth.
    assert _violations({"detail": [{"loc": ["body"], "msg": "x", "type": "y"}]},
                       {"$ref": "#/components/schemas/ErrorBody"}, spec) != []


@pytest.mark.parametrize("field, value", [
    ("replica_memory_mb", b"Infinity"), ("replica_compute", b"NaN"),
    ("replica_memory_mb", b"1e308"), ("replica_compute", b"-1"),
])
def test_a_graph_with_a_non_finite_replica_demand_is_refused(
        api: tuple[CountingApp, Any], field: str, value: bytes) -> None:
    from stateful.services import sp_graph

    counting, _ = api
    spec = sp_graph(4).model_dump_json().encode()
    body = b'{"spec": ' + spec + b', "' + field.encode() + b'": ' + value + b"}"
    response = _call(counting, "POST", "/v1/graphs", headers={
        **AUTH, "Content-Type": "application/json"}, content=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == f"body.{field}"
