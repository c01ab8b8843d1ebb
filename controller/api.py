"""The REST and websocket API: decode, call the core, encode. Nothing else lives here.

Every route and websocket needs a credential whose role ``controller.access``'s table allows
(health and the schema excepted), checked before a body is read (``controller.http_guard``,
which also bounds the body's size and answers 503 while Redis is unreachable). Mutating calls
take an ``Idempotency-Key`` (``controller.idempotency``). Errors map to HTTP statuses in one place
(:func:`_install_error_handlers`), every error body is an :class:`ErrorBody` (bad input: 422
with pydantic's message per field), and the OpenAPI schema says so (:func:`_document_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.access import roles_for, uncovered
from controller.api_contract import allowed_methods, document_route_errors, routed
from controller.declarations import Declaration
from controller.errors import (
    ControllerError,
    InvalidBatchError,
    NotFoundError,
)
from controller.events import Subscription
from controller.graphs.api import graph_routes
from controller.http_guard import MUTATING_METHODS, RequestGuard, identity_of, needs_redis
from controller.idempotency import IdempotencyGuard
from controller.record_cache import RecordsView
from controller.records import (
    AppSpec,
    AppStatus,
    ConfigPatch,
    Event,
    RuntimeConfig,
    ServerRecord,
    ServerState,
)
from controller.redis_health import RETRY_AFTER_S, RedisUnavailableError
from controller.service import Controller
from controller.views import (
    DEFAULT_PAGE,
    MAX_PAGE,
    AppBatch,
    AppFilter,
    AppView,
    BatchResult,
    RenderedViews,
    ServerFilter,
    app_view,
    batch_result,
    next_headers,
    page,
    page_of,
)
from policies.errors import PolicyError
from stateful.errors import ReplicaUnavailableError, StatefulError
from understudy.wire.bounds import MAX_ID_CHARS, NAME_PATTERN

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
ARTIFACT_MEDIA_TYPES = {MANIFEST_NAME: "application/json"}
"""Media types of a variant's files; its one artifact file (weights.pt, model.onnx, ...) is
application/octet-stream."""
OCTET_STREAM = "application/octet-stream"
READY_CHECK_S = 2.0
"""How long /readyz waits for the records before it says not ready."""
Name = Annotated[str | None, Query(max_length=MAX_ID_CHARS)]
"""A filter's id or name (bounded like every id)."""
IdInPath = Annotated[str, Path(max_length=MAX_ID_CHARS)]
"""An app or server id in a path (an overlong one is a 422, not echoed back in a 404)."""
MAX_SEQ = 2**63 - 1
"""Largest sequence number (an event's is its Redis stream entry id, a 64-bit number: a
larger ``since`` made Redis refuse the range, a 500)."""
STREAM_END_S = 2.0
"""How long an ended event stream waits for its tasks (they end at once; see _stream_events)."""
Since = Annotated[int, Query(ge=0, le=MAX_SEQ)]


class FieldError(BaseModel):
    """What is wrong with one field of a request."""

    field: str = Field(description="where, e.g. body.apps.2.app_id")
    message: str


class ErrorBody(BaseModel):
    """Every error the API answers: what went wrong, and for bad input, each field's problem."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class Readiness(BaseModel):
    """Whether the controller can serve: started, Redis answering, the records readable."""

    ready: bool


def create_app(controller: Controller) -> FastAPI:
    """The FastAPI application over ``controller`` (started by the lifespan)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await controller.start()
        try:
            yield
        finally:
            await controller.stop()

    app = FastAPI(title="Understudy controller", version="1", lifespan=lifespan,
                  description="Failover control plane for ML model serving at the edge.")
    _install_error_handlers(app)
    # The last one added runs first: the credential, size and Redis checks before the key's
    # lookup.
    app.add_middleware(IdempotencyGuard,
                       log=lambda: getattr(controller.store, "idempotency", None),
                       routed=lambda scope: routed(app.router.routes, scope))
    app.add_middleware(RequestGuard, gate=controller.gate,
                       health=lambda: getattr(controller.store, "health", None))

    _routes(app, controller)
    missing = uncovered(app.routes)
    if missing:  # a route the access table does not name would be open by omission
        raise RuntimeError(f"routes missing from controller.access.ACCESS: {missing}")
    _document_errors(app)
    return app


def _document_errors(app: FastAPI) -> None:
    """Make the OpenAPI schema describe the error bodies the API really answers.

    FastAPI documents every 422 as its own ``HTTPValidationError`` (``detail`` a list), which
    no answer of ours matches: each becomes an :class:`ErrorBody`; the 401 and 403 that
    ``RequestGuard`` answers on every route that needs a credential (with the roles allowed,
    from ``controller.access``), and the 413 on mutating routes, are documented too.
    """
    fastapi_schema = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _use_error_body(fastapi_schema())  # FastAPI keeps it in app.openapi_schema
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def _use_error_body(schema: dict[str, Any]) -> None:
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "a credential of the controller's store (docs/security.md)"}}
    components = schema["components"].setdefault("schemas", {})
    error_schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(error_schema.pop("$defs", {}))
    components["ErrorBody"] = error_schema
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if "422" in responses:
                responses["422"] = {"description": "Invalid request", "content": content}
            if needs_redis(path):
                responses.setdefault("503", {
                    "description": f"Redis is unreachable: retry after Retry-After "
                                   f"({RETRY_AFTER_S} s)", "content": content})
            _document_access(operation, method.upper(), path, content)
            if method.upper() in MUTATING_METHODS:
                responses.setdefault("413", {"description": "Request body too large",
                                             "content": content})
            if method.upper() in MUTATING_METHODS and path.startswith("/v1/"):
                _document_idempotency_key(operation, content)
    document_route_errors(schema, content)


def _document_access(operation: dict[str, Any], method: str, path: str,
                     content: dict[str, Any]) -> None:
    """The roles allowed (``controller.access``), and the 401 and 403 of the others."""
    roles = roles_for(method, path)
    if not roles:
        operation["security"] = []
        return
    names = ", ".join(sorted(r.value for r in roles))
    operation["security"] = [{"bearer": []}]
    operation["description"] = (operation.get("description", "") +
                                f"\n\nCredential: {names}.").strip()
    responses = operation["responses"]
    responses.setdefault("401", {"description": "Missing or unknown credential",
                                 "content": content})
    responses.setdefault("403", {"description": f"The credential's role may not call this "
                                                f"(allowed: {names})", "content": content})


def _document_idempotency_key(operation: dict[str, Any], content: dict[str, Any]) -> None:
    operation.setdefault("parameters", []).append({
        "name": "Idempotency-Key", "in": "header", "required": False,
        "description": "run this call at most once: a retry with the same key and request gets "
                       "the first answer (Idempotent-Replayed: true), kept 24 h",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                   "pattern": "^[!-~]+$"}})
    responses = operation["responses"]
    responses.setdefault("409", {"description": "Conflict (an id taken, a state that forbids "
                                                "it), or the request with this "
                                                "Idempotency-Key still running",
                                 "content": content})
    responses.setdefault("422", {"description": "Invalid request", "content": content})


def _routes(app: FastAPI, controller: Controller) -> None:
    _health_routes(app, controller)
    _apps_routes(app, controller)
    _servers_routes(app, controller)
    _config_and_plan_routes(app, controller)
    _events_routes(app, controller)
    _agents_and_artifacts_routes(app, controller)
    graph_routes(app, controller)


def _health_routes(app: FastAPI, controller: Controller) -> None:

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], response_model=Readiness, responses={
        503: {"model": Readiness, "description": "Not ready: starting, or Redis or the "
                                                 "records unreadable"}})
    async def readyz() -> JSONResponse:
        ok = controller.ready and controller.store is not None and \
            await controller.store.ping() and await _records_readable(controller)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics() -> Response:
        # In a Redis outage the gauges keep their last values; the outage's figures are here.
        with contextlib.suppress(RedisUnavailableError):
            await controller.refresh_gauges()
        return Response(controller.metrics.render(), media_type="text/plain; version=0.0.4")


async def _records_readable(controller: Controller) -> bool:
    """Whether the records can be read now (what every route needs)."""
    try:
        await asyncio.wait_for(controller.store.view(), READY_CHECK_S)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - any failure means "cannot serve"
        logger.exception("not ready: the records cannot be read")
        return False
    return True


def _apps_routes(app: FastAPI, controller: Controller) -> None:
    rendered = RenderedViews()

    async def views() -> RecordsView:
        return await controller.store.view()  # type: ignore[union-attr]

    @app.post("/v1/apps", status_code=201, tags=["apps"])
    async def register(spec: AppSpec, wait: bool = False) -> AppView:
        record = await controller.orchestrator.register(spec, wait=wait)
        return app_view(record, (await views()).servers)

    @app.post("/v1/apps/batch", tags=["apps"])
    async def register_batch(batch: AppBatch) -> BatchResult:
        created = await controller.orchestrator.register_many(batch.apps)
        return batch_result(batch.apps, created)

    @app.get("/v1/apps", tags=["apps"], response_model=list[AppView])
    async def list_apps(
            request: Request, status: AppStatus | None = None, family: Name = None,
            variant: Name = None, critical: bool | None = None,
            server_id: Name = None, site: Name = None, cursor: Name = None,
            limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE) -> Response:
        view = await views()
        wanted = AppFilter(status, family, variant, critical, server_id, site)
        chosen = page(view.app_ids, cursor, limit, None if wanted.empty else
                      lambda a: wanted.keeps(view.apps[a], view.servers))
        body = rendered.list_json((view.apps[a] for a in chosen.ids), view.servers)
        rendered.prune(view.apps)
        return Response(body, media_type="application/json", headers=next_headers(
            request.url.path, request.query_params, chosen.next_cursor))

    @app.get("/v1/apps/{app_id}", tags=["apps"], response_model=AppView)
    async def get_app(app_id: IdInPath) -> Response:
        view = await views()
        record = view.apps.get(app_id)
        if record is None:
            raise NotFoundError(f"app {app_id!r} is not registered")
        return Response(rendered.json(record, view.servers), media_type="application/json")

    @app.delete("/v1/apps/{app_id}", status_code=204, tags=["apps"])
    async def delete_app(app_id: IdInPath) -> Response:
        await controller.orchestrator.delete(app_id)
        return Response(status_code=204)


def _servers_routes(app: FastAPI, controller: Controller) -> None:

    @app.get("/v1/servers", tags=["servers"])
    async def list_servers(
            response: Response, request: Request, state: ServerState | None = None,
            site: Name = None, cursor: Name = None,
            limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE
    ) -> list[ServerRecord]:
        servers = (await controller.store.view()).servers  # type: ignore[union-attr]
        wanted = ServerFilter(state, site)
        found, next_cursor = page_of(servers, cursor, limit, wanted.keeps)
        response.headers.update(next_headers(request.url.path, request.query_params,
                                             next_cursor))
        return found

    @app.get("/v1/servers/{server_id}", tags=["servers"])
    async def get_server(server_id: IdInPath) -> ServerRecord:
        server = (await controller.store.view()).servers.get(server_id)  # type: ignore[union-attr]
        if server is None:
            raise NotFoundError(f"server {server_id!r} is unknown")
        return server

    @app.post("/v1/servers/{server_id}/drain", status_code=202,
              tags=["servers"])
    async def drain(server_id: IdInPath) -> ServerRecord:
        return await controller.lifecycle.drain(server_id)


def _config_and_plan_routes(app: FastAPI, controller: Controller) -> None:

    @app.get("/v1/config", tags=["config"])
    async def get_config() -> RuntimeConfig:
        return controller.orchestrator.config

    @app.patch("/v1/config", tags=["config"])
    async def patch_config(patch: ConfigPatch) -> RuntimeConfig:
        return await controller.update_config(patch)

    @app.get("/v1/plan", tags=["plan"])
    async def get_plan() -> dict[str, Any]:
        plan = await controller.store.plan()  # type: ignore[union-attr]
        if plan is None:
            raise NotFoundError("no warm plan solved yet")
        return plan

    @app.post("/v1/plan/solve", tags=["plan"])
    async def solve() -> dict[str, Any]:
        return await controller.warm.replan()


def _events_routes(app: FastAPI, controller: Controller) -> None:

    @app.get("/v1/events", tags=["events"])
    async def events(since: Since = 0, app_id: Name = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[Event]:
        return await controller.store.events(since, app_id, limit)  # type: ignore[union-attr]

    @app.websocket("/v1/events/ws")
    async def event_stream(websocket: WebSocket,
                           since: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
                           app_id: Name = None) -> None:
        await websocket.accept()
        await _stream_events(websocket, controller.events.subscribe(app_id, since))

    @app.get("/v1/declarations", tags=["servers"])
    async def declarations(since: Since = 0,
                           limit: Annotated[int, Query(ge=1, le=1000)] = 1000
                           ) -> list[Declaration]:
        """Every failure declaration (true or false), oldest first, with the apps it moved."""
        return await controller.declarations.list(since, limit)


async def _stream_events(websocket: WebSocket, events: Subscription) -> None:
    """Send ``events`` until the client leaves; a client that sends a frame is closed (1008).

    The stream takes no frames, so one is refused rather than left queued by the server; and a
    client that left ends the stream now, not at the next event sent to nobody. The
    subscription is closed as well as its sender cancelled: a cancellation that arrives during
    the replay's Redis read can be lost (see Subscription), and the handler must end anyway.
    """
    async def send() -> None:
        async for event in events:
            await websocket.send_text(event.model_dump_json())

    async def listen() -> None:
        message = await websocket.receive()
        if message["type"] != "websocket.disconnect":
            await websocket.close(code=1008, reason="the event stream takes no frames")

    tasks = [asyncio.ensure_future(send()), asyncio.ensure_future(listen())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        events.close()
        for task in tasks:
            task.cancel()
        # A send to a client that left fails (WebSocketDisconnect, RuntimeError): it is gone.
        _, pending = await asyncio.wait(tasks, timeout=STREAM_END_S)
        for task in pending:
            logger.error("event stream task %s did not end %.0f s after it was cancelled",
                         task.get_name(), STREAM_END_S)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the client left, nothing to report


def _agents_and_artifacts_routes(app: FastAPI, controller: Controller) -> None:

    @app.websocket("/v1/agents/connect")
    async def agent_socket(websocket: WebSocket) -> None:
        # The guard let only agent credentials through (any caller with --insecure); an agent
        # credential names the one server its holder may speak for.
        identity = identity_of(websocket.scope)
        await websocket.accept()
        await controller.agents.serve(websocket, identity.server_id if identity else None)

    @app.get("/v1/artifacts/{variant}/{name}", tags=["artifacts"],
             response_class=FileResponse, responses={200: {
                 "description": "The file", "content": {"application/json": {}, OCTET_STREAM: {}}}})
    async def artifact(
            variant: Annotated[str, Path(max_length=MAX_ID_CHARS, pattern=NAME_PATTERN)],
            name: str) -> FileResponse:
        from model_repo.artifacts import ArtifactError

        try:
            entry = await controller.artifacts.entry(variant)
        except ArtifactError as exc:
            # The store's message may name its directory; the caller learns only "unknown".
            logger.info("artifact %s/%s not served: %s", variant, name, exc)
            raise NotFoundError(f"unknown variant {variant!r}") from exc
        # Only the manifest and the one artifact file it names (weights.pt, model.onnx, ...).
        if name not in (MANIFEST_NAME, entry.manifest.weights_file):
            raise NotFoundError(f"no artifact named {name[:MAX_ID_CHARS]!r}")
        return FileResponse(entry.directory / name,
                            media_type=ARTIFACT_MEDIA_TYPES.get(name, OCTET_STREAM))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's 405 lists the methods of the first route that matched the path only.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(app.router.routes, request.url.path))
        if exc.status_code == 400:
            # FastAPI's answer to a body it could not parse at all (not UTF-8, nested past the
            # recursion limit): bad input like any other, so the same 422 and body.
            return JSONResponse({"detail": "invalid request", "errors": [
                {"field": "body", "message": str(exc.detail)}]}, status_code=422)
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=headers)
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(ControllerError)
    async def controller_error(_: Request, exc: ControllerError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else \
            {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, RedisUnavailableError) \
            else None
        body: dict[str, Any] = {"detail": str(exc)}
        if isinstance(exc, InvalidBatchError):
            body["errors"] = exc.errors
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(PolicyError)
    async def policy_error(_: Request, exc: PolicyError) -> JSONResponse:
        # Input the policies reject (a variant too large for every server ...): the caller's.
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(StatefulError)
    async def stateful_error(_: Request, exc: StatefulError) -> JSONResponse:
        # A graph spec or request the caller can fix (ValueError branch), or a graph that is
        # not serving yet or any more (retryable).
        status = 422 if isinstance(exc, ValueError) else \
            503 if isinstance(exc, ReplicaUnavailableError) else 500
        return JSONResponse({"detail": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg")}
                   for e in exc.errors()]
        return JSONResponse({"detail": "invalid request", "errors": details}, status_code=422)
