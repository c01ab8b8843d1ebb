"""The access table (``controller.access``) and the HTTP layer that consults only it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.access import (
    ACCESS,
    OPEN,
    WEBSOCKET,
    Gate,
    roles_for,
    uncovered,
)
from controller.credentials import INSECURE, CredentialStore, Identity, Role


def _app() -> Any:
    from controller.api import create_app
    from controller.service import Controller, ControllerSettings

    return create_app(Controller(ControllerSettings(run_dir=Path("/nonexistent/never"))))


def test_every_route_of_the_application_is_in_the_table_and_nothing_else() -> None:
    app = _app()
    assert uncovered(app.routes) == []
    served = {(m, r.path) for r in app.routes for m in (getattr(r, "methods", None)
                                                          or {WEBSOCKET}) if m != "HEAD"}
    assert set(ACCESS) == served


def test_an_application_with_a_route_the_table_misses_is_refused() -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/v1/secret")
    async def secret() -> dict[str, str]:
        return {}

    assert uncovered(app.routes) == ["GET /v1/secret"]


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/healthz", set()),
    ("GET", "/readyz", set()),
    ("GET", "/metrics", {"admin", "read"}),
    ("GET", "/v1/apps", {"admin", "read", "gateway"}),
    ("GET", "/v1/apps/a1", {"admin", "read", "gateway", "client", "agent"}),
    ("HEAD", "/v1/apps/a1", {"admin", "read", "gateway", "client", "agent"}),
    ("POST", "/v1/apps", {"admin"}),
    ("DELETE", "/v1/apps/a1", {"admin"}),
    ("GET", "/v1/servers/s1", {"admin", "read", "gateway"}),
    ("POST", "/v1/servers/s1/drain", {"admin"}),
    ("PATCH", "/v1/config", {"admin"}),
    ("GET", "/v1/events", {"admin", "read"}),
    (WEBSOCKET, "/v1/events/ws", {"admin", "read", "gateway", "client", "agent"}),
    (WEBSOCKET, "/v1/agents/connect", {"agent"}),
    ("GET", "/v1/artifacts/v1/weights.pt", {"admin", "agent"}),
    ("POST", "/v1/graphs/g/requests", {"admin", "client"}),
    ("GET", "/v1/graphs/g/consistency", {"admin", "read"}),
])
def test_roles_per_route(method: str, path: str, allowed: set[str]) -> None:
    roles = roles_for(method, path)
    assert roles is not None and {r.value for r in roles} == allowed


def test_admin_may_call_every_route_but_the_agents_socket() -> None:
    for (method, path), roles in ACCESS.items():
        if roles != OPEN and path != "/v1/agents/connect":
            assert Role.ADMIN in roles, (method, path)
    assert roles_for("GET", "/v1/nothing/here") is None
    assert roles_for("PUT", "/v1/apps/a1") is None  # no such route: the app answers 405


def test_the_gate_answers_401_without_a_known_credential_and_403_for_a_wrong_role(
        tmp_path: Path) -> None:
    store = CredentialStore(tmp_path)
    store.init()
    gate = Gate(store)
    read = "Bearer " + store.token_path("read").read_text().strip()
    admin = "Bearer " + store.token_path("admin").read_text().strip()
    agent = "Bearer " + store.agent_token("s1")
    assert gate.check("POST", "/v1/apps", None).status == 401
    assert gate.check("POST", "/v1/apps", "Bearer nope").status == 401
    assert gate.check("POST", "/v1/apps", read.replace("Bearer", "Basic")).status == 401
    assert gate.check("POST", "/v1/apps", read).status == 403
    assert gate.check("GET", "/v1/apps", read).identity == Identity(Role.READ, "read")
    assert gate.check("POST", "/v1/apps", admin).allowed
    assert gate.check("GET", "/metrics", None).status == 401
    assert gate.check("GET", "/healthz", None).allowed
    assert gate.check(WEBSOCKET, "/v1/agents/connect", admin).status == 403
    decision = gate.check(WEBSOCKET, "/v1/agents/connect", agent)
    assert decision.allowed and decision.identity == Identity(Role.AGENT, "agent.s1", "s1")
    assert "read" in gate.check("PATCH", "/v1/config", read).detail


def test_an_insecure_gate_lets_everyone_in_as_admin() -> None:
    gate = Gate(None)
    assert gate.insecure
    decision = gate.check("POST", "/v1/apps", None)
    assert decision.allowed and decision.identity == INSECURE


def test_a_gate_without_its_store_refuses_everyone(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate(CredentialStore(tmp_path / "missing"))
    assert gate.check("GET", "/v1/apps", "Bearer admin.x").status == 401
    assert gate.check("GET", "/v1/apps", "Bearer admin.y").status == 401
    assert caplog.text.count("every credential refused") == 1


def _call(app: Any, method: str, path: str, token: str | None = None) -> httpx.Response:
    async def call() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(call())


def test_the_http_layer_answers_from_the_table_before_any_route_runs() -> None:
    from types import SimpleNamespace

    from controller.api import create_app

    gate = Gate.with_tokens({"r": Role.READ, "c": Role.CLIENT})
    controller = SimpleNamespace(gate=gate, store=None, ready=False)
    app = create_app(controller)  # type: ignore[arg-type]
    missing = _call(app, "GET", "/metrics")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json() == {"detail": "missing or unknown credential"}
    forbidden = _call(app, "GET", "/v1/config", "c")
    assert forbidden.status_code == 403 and "client" in forbidden.json()["detail"]
    assert "www-authenticate" not in forbidden.headers
    assert _call(app, "GET", "/readyz").status_code == 503  # open (and not ready)
    assert _call(app, "DELETE", "/v1/apps/a1", "r").status_code == 403


def test_the_openapi_schema_documents_the_roles_and_the_401_and_403() -> None:
    schema = _app().openapi()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            roles = roles_for(method.upper(), path)
            if roles:
                assert {"401", "403"} <= operation["responses"].keys(), (method, path)
                assert operation["security"] == [{"bearer": []}]
                assert "Credential:" in operation["description"]
            else:
                assert operation["security"] == []
                assert "401" not in operation["responses"]
