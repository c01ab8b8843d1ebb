"""What the OpenAPI schema promises, on the ASGI app in process (no socket, no Redis).

The schemathesis run over a real controller is ``tests/integration/test_fuzz_api.py``; these
are its findings, each pinned down: statuses the core answers that the schema did not name, a
405 whose ``Allow`` hid the path's other methods, an undeclared method with an
``Idempotency-Key`` refused by the idempotency guard instead of the router, and answers whose
media type the schema did not name.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from controller.access import Gate
from controller.api import create_app
from controller.api_contract import ROUTE_ERRORS, allowed_methods
from controller.credentials import Role
from controller.idempotency import IdempotencyGuard

TOKEN = "contract"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class UnreadableStore:
    async def ping(self) -> bool:
        return True

    async def view(self) -> Any:
        raise RuntimeError("records unreadable")


@pytest.fixture()
def app() -> Any:
    controller = SimpleNamespace(gate=Gate.with_tokens({TOKEN: Role.ADMIN}), ready=True,
                                 store=UnreadableStore())
    return create_app(controller)  # type: ignore[arg-type]


def _call(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(call())


def test_every_error_the_core_answers_is_documented(app: Any) -> None:
    paths = app.openapi()["paths"]
    for (method, path), statuses in ROUTE_ERRORS.items():
        responses = paths[path][method.lower()]["responses"]
        for status in statuses:
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)
    assert "404" in paths["/v1/apps/{app_id}"]["delete"]["responses"]
    assert "409" in paths["/v1/servers/{server_id}/drain"]["post"]["responses"]


def test_non_json_answers_are_documented_with_their_media_type(app: Any) -> None:
    paths = app.openapi()["paths"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    artifact = paths["/v1/artifacts/{variant}/{name}"]["get"]["responses"]["200"]["content"]
    assert set(artifact) == {"application/json", "application/octet-stream"}
    ready = paths["/readyz"]["get"]["responses"]
    assert ready["503"]["content"]["application/json"]["schema"] == \
        {"$ref": "#/components/schemas/Readiness"}


@pytest.mark.parametrize("method, path, allowed", [
    ("OPTIONS", "/v1/config", "GET, PATCH"),
    ("PUT", "/v1/apps/a1", "DELETE, GET"),
    ("OPTIONS", "/v1/graphs/g1", "DELETE, GET"),
    ("PUT", "/v1/apps", "GET, POST"),
    ("OPTIONS", "/v1/apps/batch", "POST"),  # the concrete path, not /v1/apps/{app_id}
])
def test_a_405_allows_every_method_of_the_path(app: Any, method: str, path: str,
                                                allowed: str) -> None:
    response = _call(app, method, path, headers=AUTH)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allowed
    assert response.json() == {"detail": "Method Not Allowed"}


def test_allowed_methods_are_those_of_every_route_of_the_path(app: Any) -> None:
    assert allowed_methods(app.router.routes, "/v1/apps/x") == ["DELETE", "GET"]
    assert allowed_methods(app.router.routes, "/no/such/path") == []


class SpentKeys:
    """An idempotency log in which every key was used by another request already."""

    async def claim(self, key: str, fingerprint: str) -> Any:
        return SimpleNamespace(outcome="other_request", answer=None)


def test_a_method_the_path_lacks_is_a_405_whatever_its_idempotency_key() -> None:
    async def router(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 405,
                    "headers": [(b"allow", b"GET")]})
        await send({"type": "http.response.body", "body": b""})

    def only_get(scope: Any) -> bool:
        return scope["method"] == "GET"

    guard = IdempotencyGuard(router, log=lambda: SpentKeys(), routed=only_get)  # type: ignore
    response = _call(guard, "PUT", "/v1/apps", headers={"Idempotency-Key": "k1"}, json={})
    assert response.status_code == 405
    routed_guard = IdempotencyGuard(router, log=lambda: SpentKeys())  # type: ignore
    refused = _call(routed_guard, "PUT", "/v1/apps", headers={"Idempotency-Key": "k1"},
                    json={})
    assert refused.status_code == 422 and "different request" in refused.text


@pytest.mark.parametrize("path", ["/v1/events?since=18446744073709551616",
                                  "/v1/declarations?since=9223372036854775808"])
def test_a_sequence_number_past_64_bits_is_a_422(app: Any, path: str) -> None:
    # Redis stream ids are 64-bit: the range of a larger one was refused by Redis (a 500).
    response = _call(app, "GET", path, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "query.since"


@pytest.mark.parametrize("body", [b"\xff\xfe\x00", b"[" * 200_000])
def test_a_body_that_does_not_parse_is_a_422_like_other_bad_input(app: Any, body: bytes) -> None:
    response = _call(app, "POST", "/v1/apps", content=body,
                     headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "invalid request"
    assert response.json()["errors"][0]["field"] == "body"


def test_every_operation_documents_the_http_servers_own_400(app: Any) -> None:
    # uvicorn answers a request whose headers it cannot parse before the API sees it.
    for operations in app.openapi()["paths"].values():
        for operation in operations.values():
            assert set(operation["responses"]["400"]["content"]) == {"text/plain"}
