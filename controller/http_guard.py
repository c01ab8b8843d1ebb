"""What every request passes before any route reads its body: the credential and the size limit.

FastAPI reads and parses a request's body before it runs the route's dependencies, so a 10 MB
malformed body used to be parsed before the bearer token was checked, and any body of any size
was read into memory. This ASGI middleware answers first, from the headers alone:

* 401 for a call without a credential the controller knows, 403 for one whose role may not
  make it (``controller.access``: the one table of routes and roles); a websocket is refused
  the same way, before it is accepted. The caller's :class:`~controller.credentials.Identity`
  is left in the scope (:func:`identity_of`) for the routes that need it (an agent's server);
* 413 for a body larger than its route's limit, by ``Content-Length`` before a byte of it is
  read, or once a body sent without a length has passed the limit;
* 503 with ``Retry-After`` for a ``/v1`` call while Redis is unreachable
  (``controller.redis_health``), before any work starts; and for one in flight when the outage
  began that has not answered :data:`~controller.redis_health.CUT_OFF_S` later. Artifact
  downloads and graph requests, which need no Redis, are served through an outage.

Every HTTP request runs in a request scope, in which a Redis command fails at once in an outage
instead of waiting for Redis to return. The error bodies are the API's (``{"detail": ...}``, see
``controller.api.ErrorBody``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from controller.access import WEBSOCKET, Decision, Gate
from controller.credentials import Identity
from controller.redis_health import RETRY_AFTER_S, RedisHealth, RequestScope, request_scope

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
"""Largest request body by default (a batch of 1,000 apps is about 150 KB)."""
MAX_GRAPH_REQUEST_BYTES = 32 * 1024 * 1024
"""Largest body of a graph request: its tensors travel as JSON number lists (up to a million
values, ``controller.graphs.api.MAX_VALUES``, at up to ~25 characters each)."""
_GRAPH_REQUEST = re.compile(r"^/v1/graphs/[^/]+/requests$")
_NEEDS_NO_REDIS = re.compile(r"^/v1/(artifacts/|graphs/[^/]+/requests$)")
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REDIS_DOWN = "redis is unreachable: the controller cannot serve this now"
IDENTITY_KEY = "understudy.identity"
"""Where the guard leaves the caller's identity in the ASGI scope."""


def identity_of(scope: Any) -> Identity | None:
    """The identity the guard found for this request or websocket (None on an open route)."""
    identity = scope.get(IDENTITY_KEY)
    return identity if isinstance(identity, Identity) else None


def body_limit(path: str) -> int:
    """The largest body a request to ``path`` may carry."""
    return MAX_GRAPH_REQUEST_BYTES if _GRAPH_REQUEST.match(path) else MAX_BODY_BYTES


def needs_redis(path: str) -> bool:
    """Whether a call to ``path`` is refused while Redis is unreachable."""
    return path.startswith("/v1/") and not _NEEDS_NO_REDIS.match(path)


class RequestGuard:
    """ASGI middleware: credential, body size and Redis outages, checked before the body is read."""

    def __init__(self, app: Any, gate: Gate,
                 health: Callable[[], RedisHealth | None] = lambda: None) -> None:
        self.app = app
        self.gate = gate
        self.health = health

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        decision = self.gate.check(scope["method"], scope["path"], headers.get("authorization"))
        if not decision.allowed:
            await answer(send, decision.status, decision.detail,
                         extra_headers=_challenge(decision))
            return
        scope[IDENTITY_KEY] = decision.identity
        limit = body_limit(scope["path"])
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await answer(send, 413, f"request body larger than {limit} bytes")
            return
        health = self.health()
        with request_scope() as request:
            if health is None or not needs_redis(scope["path"]):
                await self.app(scope, _counted(receive, limit), send)
            elif health.down:
                await answer(send, 503, REDIS_DOWN, retry_after=RETRY_AFTER_S)
            else:
                await self._cut_off_in_an_outage(health, request, scope,
                                                 _counted(receive, limit), send)

    async def _websocket(self, scope: Any, receive: Any, send: Any) -> None:
        """Refuse a websocket the caller may not open (an HTTP answer instead of the upgrade)."""
        from starlette.responses import JSONResponse
        from starlette.websockets import WebSocket

        headers = Headers(scope=scope)
        decision = self.gate.check(WEBSOCKET, scope["path"], headers.get("authorization"))
        if decision.allowed:
            scope[IDENTITY_KEY] = decision.identity
            await self.app(scope, receive, send)
            return
        logger.info("websocket %s refused: %s", scope["path"][:200], decision.detail)
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await websocket.send_denial_response(JSONResponse(
                {"detail": decision.detail}, status_code=decision.status,
                headers={k.decode(): v.decode() for k, v in _challenge(decision)}))
        else:  # a server without the denial extension: a close before accept is a 403
            await websocket.close(code=1008, reason=decision.detail[:120])

    async def _cut_off_in_an_outage(self, health: RedisHealth, request: RequestScope,
                                    scope: Any, receive: Any, send: Any) -> None:
        """Serve the request; a 503 instead when an outage began and it is still not answering.

        It may be waiting for a lock that work waiting for Redis holds: it would hang until
        Redis returned, and then go on with what its client gave up on.
        """
        async def answering(message: Any) -> None:
            if message["type"] == "http.response.start" and request.deadline is not None:
                request.answered = True
                request.deadline.reschedule(None)
            await send(message)

        try:
            async with asyncio.timeout(None) as deadline:
                request.deadline = deadline
                health.track(request)  # an outage from now on reschedules the deadline
                await self.app(scope, receive, answering)
        except TimeoutError:
            if request.deadline is None or not request.deadline.expired() or request.answered:
                raise
            logger.warning("%s %s cut off: redis became unreachable while it ran",
                           scope["method"], scope["path"][:200])
            await answer(send, 503, REDIS_DOWN, retry_after=RETRY_AFTER_S)
        finally:
            health.untrack(request)


def _challenge(decision: Decision) -> list[tuple[bytes, bytes]]:
    """The ``WWW-Authenticate`` header a 401 carries (RFC 6750)."""
    return [(b"www-authenticate", b"Bearer")] if decision.status == 401 else []


def _counted(receive: Any, limit: int) -> Any:
    """``receive`` that stops a body sent without a length once it passes ``limit``."""
    seen = 0

    async def receive_counted() -> Any:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                # FastAPI turns an HTTPException raised while it reads the body into its answer.
                raise HTTPException(413, f"request body larger than {limit} bytes")
        return message

    return receive_counted


async def answer(send: Any, status: int, detail: str, *,
                 errors: list[dict[str, str]] | None = None, retry_after: int | None = None,
                 extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send an error answer (an ``ErrorBody``) straight from a middleware."""
    body = json.dumps({"detail": detail, **({"errors": errors} if errors else {})}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *(extra_headers or [])]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
