"""What the REST API promises beyond what FastAPI derives from its routes.

FastAPI documents a route's success answer and its 422, but not the errors the core raises
behind it (``controller.errors``: 404 for an unknown app, 409 for a conflict, ...):
:data:`ROUTE_ERRORS` names them per operation and :func:`document_route_errors` writes them into
the OpenAPI schema, so that a client learns every status it may get, with the 400 the HTTP
server itself answers to a request it cannot parse. The schemathesis run of
``tests/integration/test_fuzz_api.py`` fails on any status a route answers that is not there.

And routing facts the middlewares and the 405 answer need: :func:`allowed_methods` (a path's
methods across all its routes: Starlette's own 405 names only those of the first route that
matched the path, so ``OPTIONS /v1/config`` said ``Allow: GET``, hiding PATCH) and
:func:`routed` (whether a request reaches a route at all, so that the idempotency guard leaves
a method the path does not have to the router's 405).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.routing import Match

ROUTE_ERRORS: dict[tuple[str, str], dict[int, str]] = {
    ("POST", "/v1/apps"): {409: "An app of this id is registered"},
    ("GET", "/v1/apps/{app_id}"): {404: "No app of this id"},
    ("DELETE", "/v1/apps/{app_id}"): {404: "No app of this id"},
    ("GET", "/v1/servers/{server_id}"): {404: "No server of this id"},
    ("POST", "/v1/servers/{server_id}/drain"): {
        404: "No server of this id", 409: "The server is not up (failed or draining)"},
    ("GET", "/v1/plan"): {404: "No warm plan solved yet"},
    ("GET", "/v1/artifacts/{variant}/{name}"): {
        404: "The store holds no such variant, or the file is not one of its artifacts"},
    ("POST", "/v1/graphs"): {
        409: "A graph of this name is registered, or the live servers cannot host it",
        503: "The graph's replicas could not be started (retryable)"},
    ("GET", "/v1/graphs/{name}"): {404: "No graph of this name"},
    ("DELETE", "/v1/graphs/{name}"): {404: "No graph of this name"},
    ("POST", "/v1/graphs/{name}/requests"): {
        404: "No graph of this name",
        409: "The graph is not serving (still deploying, failed or stopped)",
        503: "The graph's frontend or a replica is not serving now (retryable)",
        504: "No reply within the request's timeout_s"},
    ("GET", "/v1/graphs/{name}/consistency"): {
        404: "No graph of this name",
        409: "The graph is not live, or was not registered with observe=true"},
}
"""(method, path) -> the error statuses its core may answer, each an ``ErrorBody``."""
MALFORMED_HTTP = {
    "description": "The request is not valid HTTP (e.g. a bad Content-Length header); the HTTP "
                   "server answers this before any route sees the request, with a plain-text "
                   "body",
    "content": {"text/plain": {"schema": {"type": "string"}}}}
"""Every operation may get this 400: uvicorn's HTTP parser refuses malformed requests itself."""


def document_route_errors(schema: dict[str, Any], content: dict[str, Any]) -> None:
    """Add :data:`ROUTE_ERRORS` and :data:`MALFORMED_HTTP` to an OpenAPI ``schema``.

    ``content`` is the ErrorBody's.
    """
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.setdefault("responses", {}).setdefault("400", MALFORMED_HTTP)
    for (method, path), statuses in ROUTE_ERRORS.items():
        operation = schema.get("paths", {}).get(path, {}).get(method.lower())
        if operation is None:  # a table out of step with the routes is a bug, not a default
            raise RuntimeError(f"ROUTE_ERRORS names {method} {path}, which is no route")
        responses = operation.setdefault("responses", {})
        for status, description in statuses.items():
            responses.setdefault(str(status), {"description": description,
                                               "content": content})


def allowed_methods(routes: Iterable[Any], path: str) -> list[str]:
    """Every method the routes of ``path`` take (for a 405's ``Allow``).

    As OpenAPI reads paths, a concrete path is matched before a templated one: when a route
    without parameters matches (``/v1/apps/batch``), only such routes count, not the ones that
    would take it as a parameter (``/v1/apps/{app_id}``).
    """
    matching = [route for route in routes if getattr(route, "methods", None)
                and getattr(route, "path_regex", None) is not None
                and route.path_regex.match(path)]
    concrete = [route for route in matching if not getattr(route, "param_convertors", None)]
    return sorted({method for route in concrete or matching for method in route.methods})


def routed(routes: Iterable[Any], scope: Any) -> bool:
    """Whether a route takes this request (its path and its method)."""
    return any(route.matches(scope)[0] is Match.FULL for route in routes)
