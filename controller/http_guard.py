"""What every HTTP request passes before any route reads its body: the size limit and the token.

FastAPI reads and parses a request's body before it runs the route's dependencies, so a 10 MB
malformed body used to be parsed before the bearer token was checked, and any body of any size
was read into memory. This ASGI middleware answers first, from the headers alone:

* 401 for a request that may change state (POST, PUT, PATCH, DELETE) without the token (when
  the controller has one);
* 413 for a body larger than its route's limit, by ``Content-Length`` before a byte of it is
  read, or once a body sent without a length has passed the limit.

The error bodies are the API's (``{"detail": ...}``, see ``controller.api.ErrorBody``).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
"""Largest request body by default (a batch of 1,000 apps is about 150 KB)."""
MAX_GRAPH_REQUEST_BYTES = 32 * 1024 * 1024
"""Largest body of a graph request: its tensors travel as JSON number lists (up to a million
values, ``controller.graphs.api.MAX_VALUES``, at up to ~25 characters each)."""
_GRAPH_REQUEST = re.compile(r"^/v1/graphs/[^/]+/requests$")
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def bearer_ok(headers: Any, expected: str | None) -> bool:
    """Whether ``headers`` carry the bearer token ``expected`` (always, without one)."""
    if not expected:
        return True
    header = headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                              expected.encode())


def body_limit(path: str) -> int:
    """The largest body a request to ``path`` may carry."""
    return MAX_GRAPH_REQUEST_BYTES if _GRAPH_REQUEST.match(path) else MAX_BODY_BYTES


class RequestGuard:
    """ASGI middleware: the token and the body size, checked before the body is read."""

    def __init__(self, app: Any, token: Callable[[], str | None]) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if scope["method"] in MUTATING_METHODS and not bearer_ok(headers, self.token()):
            await _answer(send, 401, "missing or wrong bearer token",
                          [(b"www-authenticate", b"Bearer")])
            return
        limit = body_limit(scope["path"])
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _answer(send, 413, f"request body larger than {limit} bytes")
            return
        await self.app(scope, _counted(receive, limit), send)


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


async def _answer(send: Any, status: int, detail: str,
                  extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *(extra_headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
