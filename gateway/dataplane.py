"""The gateway's core, under its HTTP and gRPC front ends: validate, queue, dispatch, rename.

The front ends only decode a request into an :class:`InferRequest`, call this, and encode the
answer. Replies keep Triton's bytes; only the model's name is changed back from the Triton model
(``<app_id>__<variant>``) to the app the client asked for.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from dataclasses import dataclass

from gateway.board import RouteBoard
from gateway.config import GatewayConfig, valid_app_id
from gateway.errors import BadRequestError, StoppingError, UnavailableError, UnknownAppError
from gateway.exchange import Answer, Dispatcher, InferRequest
from gateway.metrics import GatewayMetrics
from gateway.queue import Queues

MODEL_CALLS_DEADLINE_S = 5.0
"""Metadata, config and readiness calls wait at most this long across a failover."""
VERSION_MAX_CHARS = 19


@dataclass(frozen=True)
class Renamed:
    """A reply body with the model's name changed, and its new JSON header length."""

    body: bytes
    header_length: int | None


class DataPlane:
    """Requests in, answers out: what both front ends call."""

    def __init__(self, config: GatewayConfig, board: RouteBoard, dispatcher: Dispatcher,
                 queues: Queues, metrics: GatewayMetrics) -> None:
        self.config = config
        self.board = board
        self.dispatcher = dispatcher
        self.queues = queues
        self.metrics = metrics
        self.closing = False
        """Set when the gateway starts stopping: new requests are refused with a reason."""
        self.in_flight = 0
        self.idle = asyncio.Event()
        """Set while no request is being answered (the shutdown waits for it)."""
        self.idle.set()

    # --- validation ----------------------------------------------------------------------

    def check_app(self, app_id: str) -> None:
        """BadRequestError for a name that cannot be an app id."""
        if not valid_app_id(app_id):
            raise BadRequestError(f"{app_id[:80]!r} is not an app id (letters, digits, "
                                  "_ . -; at most 63; no '__')")

    @staticmethod
    def check_version(version: str) -> str:
        """A model version as Triton names them (digits), or BadRequestError."""
        if version and (not version.isdigit() or len(version) > VERSION_MAX_CHARS):
            raise BadRequestError(f"model version {version[:40]!r} is not a number")
        return version

    def deadline(self, timeout_ms: str | None) -> float:
        """The loop time a request is due by, from its optional timeout in milliseconds."""
        seconds = self.config.default_deadline_s
        if timeout_ms is not None:
            try:
                seconds = float(timeout_ms) / 1000.0
            except ValueError:
                raise BadRequestError(f"timeout {timeout_ms[:40]!r} is not a number of "
                                      "milliseconds") from None
            if not math.isfinite(seconds) or seconds <= 0:
                raise BadRequestError("timeout must be a finite number of milliseconds > 0")
            if seconds > self.config.max_deadline_s:
                raise BadRequestError(f"timeout above the maximum of "
                                      f"{self.config.max_deadline_s * 1000:.0f} ms")
        return asyncio.get_running_loop().time() + seconds

    # --- requests ------------------------------------------------------------------------

    async def infer(self, request: InferRequest) -> Answer:
        """Through the app's queue; GatewayError with the reason when there is no answer."""
        if self.board.loaded.is_set() and self.board.route(request.app_id) is None:
            self.metrics.rejected(UnknownAppError.reason)
            raise UnknownAppError(f"app {request.app_id!r} is not registered")
        self._begin()
        try:
            return await self.queues.get(request.app_id).submit(request)
        finally:
            self._end()

    async def model_call(self, app_id: str, suffix: str, version: str = "",
                         protocol: str = "http", message: bytes = b"") -> Answer:
        """A metadata, config or readiness call to the app's serving replica.

        ``suffix`` is the path after the model's (HTTP) or the method's name (gRPC, whose
        request is ``message``).
        """
        route = self.board.route(app_id)
        if self.board.loaded.is_set() and route is None:
            raise UnknownAppError(f"app {app_id!r} is not registered")
        if route is not None and route.serving is None:
            raise UnavailableError(f"{app_id} is served nowhere"
                                   f"{f': {route.reason}' if route.reason else ''}")
        due = asyncio.get_running_loop().time() + min(MODEL_CALLS_DEADLINE_S,
                                                      self.config.default_deadline_s)
        self._begin()
        try:
            return await self.dispatcher.send(InferRequest(
                app_id, due, message, method="GET", suffix=suffix, version=version,
                protocol=protocol))
        finally:
            self._end()

    def _begin(self) -> None:
        if self.closing:
            raise StoppingError("the gateway is stopping")
        self.in_flight += 1
        self.idle.clear()

    def _end(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.idle.set()

    def ready(self) -> bool:
        """Whether the gateway can route: it has a table and is not stopping."""
        return self.board.loaded.is_set() and not self.closing


def rename_infer_reply(body: bytes, model_name: str, app_id: str,
                       header_length: int | None) -> Renamed:
    """Triton's infer reply with ``"model_name"`` saying the app, bytes otherwise untouched.

    Only the JSON header is searched (the whole body without the binary extension; Triton
    writes ``model_name`` first), and the binary header length grows or shrinks with the name.
    """
    needle, replacement = _names(model_name, app_id)
    limit = len(body) if header_length is None else min(header_length, len(body))
    at = body.find(needle, 0, min(limit, 4096))
    if at < 0:
        return Renamed(body, header_length)
    renamed = b"".join((body[:at], replacement, body[at + len(needle):]))
    if header_length is not None:
        header_length += len(replacement) - len(needle)
    return Renamed(renamed, header_length)


@functools.lru_cache(maxsize=1024)
def _names(model_name: str, app_id: str) -> tuple[bytes, bytes]:
    """The model's name as Triton writes it in a reply, and the app's that replaces it."""
    return (b'"model_name":"' + model_name.encode() + b'"',
            b'"model_name":' + json.dumps(app_id).encode())


def rename_metadata(body: bytes, app_id: str) -> bytes:
    """A model metadata or config reply (small JSON) with ``name`` saying the app."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    if isinstance(doc, dict):
        if "name" in doc:
            doc["name"] = app_id
        if isinstance(doc.get("config"), dict) and "name" in doc["config"]:
            doc["config"]["name"] = app_id
    return json.dumps(doc, separators=(",", ":")).encode()
