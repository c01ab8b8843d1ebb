"""Idempotency keys: a mutating call retried with the same key is applied once.

A client that did not get the answer to a ``POST``, ``PUT``, ``PATCH`` or ``DELETE`` on
``/v1/...`` (a timeout, a dropped connection) cannot tell whether it was applied. Sent with an
``Idempotency-Key`` header (1 to 255 visible ASCII characters, e.g. a UUID), the first request
with that key runs and its answer is kept in Redis for :data:`IDEMPOTENCY_TTL_S`; a retry with
the same key and the same request (method, path, query and body) gets the stored answer, marked
``Idempotent-Replayed: true``, without running again. The same key on a different request is a
422; a retry while the first is still running a 409 (``Retry-After``).

Answers of 500 and more are not kept (the key is freed: a retry runs the request again), nor
answers larger than :data:`MAX_STORED_BYTES`. A request cut off by a Redis outage may have been
partly applied before it; its retry runs it again (a registration then answers 409: registered).

Redis key (under the store's prefix): ``idempotency:<key>`` string, JSON: ``state`` (``running``
or ``done``), the request's ``fingerprint``, the controller process (``boot``) that ran it, and
once done the answer's ``status``, ``headers`` and ``body`` (base64). A ``running`` record left
by a controller that stopped, or by a request whose answer could not be stored, is taken over by
the next request with its key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from controller.http_guard import MUTATING_METHODS, answer
from controller.quarantine import json_object
from controller.redis_health import RETRY_AFTER_S, RedisUnavailableError
from controller.redis_scripts import CLAIM_LUA, REPLACE_LUA

logger = logging.getLogger(__name__)

HEADER = "idempotency-key"
REPLAYED_HEADER = "idempotent-replayed"
IDEMPOTENCY_TTL_S = 24 * 3600
MAX_STORED_BYTES = 1024 * 1024
KEY_PATTERN = re.compile(r"^[!-~]{1,255}$")
"""What a key may be: 1 to 255 visible ASCII characters."""
TAKE_OVER_TRIES = 3

Outcome = Literal["new", "replay", "other_request", "in_progress"]


@dataclass(frozen=True)
class StoredAnswer:
    """An answer as sent: status, headers, body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Claim:
    """What the log says about a key: run the request (``new``), or answer without running."""

    outcome: Outcome
    answer: StoredAnswer | None = None


class IdempotencyLog:
    """The keys' records in Redis; one per controller process."""

    def __init__(self, redis: Any, prefix: str = "us:", ttl_s: int = IDEMPOTENCY_TTL_S) -> None:
        self.redis = redis
        self.prefix = f"{prefix}idempotency:"
        self.ttl_s = ttl_s
        self.boot = uuid.uuid4().hex
        self._claim = redis.register_script(CLAIM_LUA)
        self._replace = redis.register_script(REPLACE_LUA)
        self._running: dict[str, str] = {}
        """Keys this process is running a request for -> the marker it stored."""

    async def claim(self, key: str, fingerprint: str) -> Claim:
        """Claim ``key`` for a request (``new``), or say why the request must not run."""
        marker = json.dumps({"state": "running", "fingerprint": fingerprint,
                             "boot": self.boot, "at": time.time()})
        current = await self._claim(keys=[self.prefix + key], args=[marker, self.ttl_s])
        for _ in range(TAKE_OVER_TRIES):
            if current is None:
                self._running[key] = marker
                return Claim("new")
            record = json_object(current) or {}
            if record.get("fingerprint", fingerprint) != fingerprint:
                return Claim("other_request")
            stored = _answer_of(record) if record.get("state") == "done" else None
            if stored is not None:
                return Claim("replay", stored)
            if record.get("boot") == self.boot and key in self._running:
                return Claim("in_progress")
            # Left running by a controller that stopped, or by a request of this one whose
            # answer could not be stored: this request runs it again.
            if await self._replace(keys=[self.prefix + key],
                                   args=[current, marker, self.ttl_s]):
                current = None
                continue
            current = await self.redis.get(self.prefix + key)
            if current is None:
                current = await self._claim(keys=[self.prefix + key],
                                            args=[marker, self.ttl_s])
        return Claim("in_progress")

    async def finish(self, key: str, fingerprint: str, answer: StoredAnswer) -> None:
        """Keep the answer of the request that claimed ``key``."""
        marker = self._running.pop(key, None)
        record = json.dumps({"state": "done", "fingerprint": fingerprint, "boot": self.boot,
                             "at": time.time(), "status": answer.status,
                             "headers": answer.headers,
                             "body": base64.b64encode(answer.body).decode()})
        if marker is not None:
            await self._replace(keys=[self.prefix + key], args=[marker, record, self.ttl_s])

    async def release(self, key: str) -> None:
        """Free ``key`` without an answer (the next request with it runs)."""
        marker = self._running.pop(key, None)
        if marker is not None:
            await self._replace(keys=[self.prefix + key], args=[marker, "", self.ttl_s])


def _answer_of(record: dict[str, Any]) -> StoredAnswer | None:
    try:
        return StoredAnswer(int(record["status"]),
                            [(str(k), str(v)) for k, v in record["headers"]],
                            base64.b64decode(record["body"]))
    except (KeyError, TypeError, ValueError):
        return None


def fingerprint_of(scope: Any, body: bytes) -> str:
    """What makes two requests the same request: method, path, query string and body."""
    digest = hashlib.sha256()
    for part in (scope["method"].encode(), scope["path"].encode(), scope["query_string"], body):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


@dataclass
class _Recorder:
    """Keeps the app's answer, to store it before it is sent."""

    start: dict[str, Any] | None = None
    body: list[bytes] = field(default_factory=list)

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.start = message
        elif message["type"] == "http.response.body":
            self.body.append(message.get("body", b""))

    def stored(self) -> StoredAnswer | None:
        """The answer, when it is one to keep (see the module's docstring)."""
        body = b"".join(self.body)
        if self.start is None or self.start["status"] >= 500 or len(body) > MAX_STORED_BYTES:
            return None
        headers = [(k.decode("latin-1"), v.decode("latin-1"))
                   for k, v in self.start.get("headers", [])]
        return StoredAnswer(self.start["status"], headers, body)

    async def replay_to(self, send: Any) -> None:
        if self.start is not None:
            await send(self.start)
        await send({"type": "http.response.body", "body": b"".join(self.body)})


class IdempotencyGuard:
    """ASGI middleware: mutating ``/v1`` calls with an ``Idempotency-Key`` run at most once."""

    def __init__(self, app: Any, log: Callable[[], IdempotencyLog | None],
                 routed: Callable[[Any], bool] = lambda scope: True) -> None:
        self.app = app
        self.log = log
        self.routed = routed
        """Whether a route takes the request: one that none takes (a method its path does not
        have: 405) is the router's to answer, whatever its key; and it applies nothing."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        log = self.log()
        key = Headers(scope=scope).get(HEADER) if scope["type"] == "http" else None
        if key is None or log is None or scope["method"] not in MUTATING_METHODS or \
                not scope["path"].startswith("/v1/") or not self.routed(scope):
            await self.app(scope, receive, send)
            return
        if not KEY_PATTERN.match(key):
            await answer(send, 422, "invalid request", errors=[{
                "field": "header.idempotency-key",
                "message": "must be 1 to 255 visible ASCII characters"}])
            return
        try:
            body = await _whole_body(receive)
        except HTTPException as exc:  # the body passed the size limit while it was read
            await answer(send, exc.status_code, str(exc.detail))
            return
        await self._once(log, key, fingerprint_of(scope, body), scope, body, receive, send)

    async def _once(self, log: IdempotencyLog, key: str, fingerprint: str, scope: Any,
                    body: bytes, receive: Any, send: Any) -> None:
        try:
            claim = await log.claim(key, fingerprint)
        except RedisUnavailableError as exc:
            await answer(send, 503, str(exc), retry_after=RETRY_AFTER_S)
            return
        if claim.outcome != "new":
            await _refuse(claim, send)
            return
        recorder = _Recorder()
        try:
            await self.app(scope, _replaying(body, receive), recorder.send)
        except BaseException:
            await _quietly(log.release(key))
            raise
        stored = recorder.stored()
        if stored is None:
            await _quietly(log.release(key))
        elif not await _quietly(log.finish(key, fingerprint, stored)):
            logger.warning("the answer to idempotency key %r could not be stored; a retry "
                           "with it runs the request again", key[:64])
        await recorder.replay_to(send)


async def _refuse(claim: Claim, send: Any) -> None:
    if claim.answer is not None:
        stored = claim.answer
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in stored.headers]
        await send({"type": "http.response.start", "status": stored.status,
                    "headers": [*headers, (REPLAYED_HEADER.encode(), b"true")]})
        await send({"type": "http.response.body", "body": stored.body})
    elif claim.outcome == "in_progress":
        await answer(send, 409, "a request with this Idempotency-Key is still running; "
                                "retry later for its answer", retry_after=RETRY_AFTER_S)
    else:
        await answer(send, 422, "this Idempotency-Key was used for a different request "
                                "(method, path, query or body); use a new key")


async def _whole_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replaying(body: bytes, receive: Any) -> Any:
    """``receive`` that hands the app the body already read, then the client's messages."""
    replayed = False

    async def receive_replayed() -> Any:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_replayed


async def _quietly(step: Any) -> bool:
    """Await ``step``; False (logged) when Redis failed it: the answer goes out anyway."""
    try:
        await step
    except Exception:  # noqa: BLE001 - Redis down or slow: the key expires or is taken over
        logger.warning("idempotency record not updated", exc_info=True)
        return False
    return True
