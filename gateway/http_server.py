"""A small HTTP/1.1 server on asyncio's buffered protocol, for the gateway's request path.

Why not aiohttp's server: a request body is read by the kernel straight into one buffer of its
``Content-Length`` (``recv_into``), where aiohttp's stream copies it chunk by chunk and joins it
again, which for an image-sized body cost more than the rest of the gateway together; a large
body goes to the handler as soon as its head is read, as an :class:`ArrivingBody` that the
upstream forwards while the rest comes in. What it
does: keep-alive and pipelined requests (answered in order, one at a time per connection),
``Content-Length`` and chunked bodies, ``Expect: 100-continue``, ``HEAD``, bounded heads and
bodies (431 and 413), and a clean close. What it does not: TLS, HTTP/2, upgrades; a
request's handler is cancelled when its client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

from gateway.arriving import ArrivingBody

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_PIPELINED_BYTES = 1024 * 1024
"""Bytes of later requests read ahead while one is answered; reading pauses above this."""
READ_CHUNK = 64 * 1024
"""Reads of heads and small bodies; a larger body's remainder goes straight to its buffer."""
JOIN_MAX_BYTES = 64 * 1024
STREAM_FROM_BYTES = 128 * 1024
"""A body at least this large that is not all in with its head goes to the handler at once, as
an :class:`ArrivingBody` (forwarded while it arrives); smaller ones are read whole first."""
_REASONS = {s.value: s.phrase for s in HTTPStatus}


@dataclass(slots=True)
class HttpRequest:
    """One request: its method, decoded path, headers (lower-case names) and body."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes | bytearray
    arriving: ArrivingBody | None = None
    """Set when ``body`` is still being filled (see :data:`STREAM_FROM_BYTES`)."""


@dataclass(slots=True)
class HttpResponse:
    """One answer; ``Content-Length`` is added."""

    status: int
    body: bytes = b""
    headers: Sequence[tuple[str, str]] = ()


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class HttpError(Exception):
    """A request that cannot be read: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def write_parts(transport: asyncio.WriteTransport, head: bytes,
                body: bytes | bytearray | memoryview) -> None:
    """Write a head and a large body without joining them (a copy of the body).

    One vectored write where the transport has one (uvloop's); else two writes (the standard
    loop's ``writelines`` joins its parts before Python 3.12).
    """
    if type(transport).writelines is not asyncio.WriteTransport.writelines:
        transport.writelines((head, body))
    else:
        transport.write(head)
        transport.write(body)


def json_error(status: int, message: str) -> HttpResponse:
    """Triton's error shape."""
    return HttpResponse(status, json.dumps({"error": message}).encode(),
                        (("Content-Type", "application/json"),))


@dataclass(slots=True)
class _Head:
    method: str
    target: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


HEAD_CACHE_ENTRIES = 256
HEAD_CACHE_MAX_BYTES = 2048
_heads: dict[bytes, _Head] = {}
"""Heads already parsed, by their bytes: a client sends the same head again and again (the
same path, headers and body length), and parsing it is the largest Python cost of a request."""


def _read_head(raw: bytes) -> _Head:
    """The parsed head (a copy of a cached one when the same bytes came before)."""
    known = _heads.get(raw)
    if known is None:
        known = _parse_head(raw)
        if len(raw) > HEAD_CACHE_MAX_BYTES:
            return known
        if len(_heads) >= HEAD_CACHE_ENTRIES:
            _heads.clear()
        _heads[raw] = known
    return _Head(known.method, known.target, known.version, dict(known.headers))


def _parse_head(raw: bytes) -> _Head:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line {lines[0][:100]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {line[:100]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return _Head(parts[0], parts[1], parts[2], headers)


class _Connection(asyncio.BufferedProtocol):
    """One client connection: reads requests, runs the handler, writes answers in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(READ_CHUNK)
        self._pending = bytearray()
        """Bytes read and not yet consumed: a head, a chunked body, later requests."""
        self._head: _Head | None = None
        self._body: bytearray | None = None
        """The body being read into directly (its Content-Length known)."""
        self._arriving: ArrivingBody | None = None
        """The same body when its request was handed over before it was all in."""
        self._got = 0
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self.closed = False

    # --- asyncio.BufferedProtocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._got:]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is not None:
            self._got += nbytes
            arriving = self._arriving
            if arriving is not None:
                arriving.grew(self._got)
            if self._got == len(self._body):
                body, self._body = self._body, None
                if arriving is None:
                    self._dispatch(body)
                else:
                    self._arriving = None
                    if self._task is None:  # answered before its body was all in
                        self._advance()
            return
        self._pending += memoryview(self._scratch)[:nbytes]
        self._advance()

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # nobody is left to answer
        if self._arriving is not None:
            self._arriving.lose()

    # --- requests ------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a request of this connection is being answered."""
        return self._task is not None or self._body is not None

    def _advance(self) -> None:
        """Take the next request out of what was read, if it is complete."""
        try:
            while not self.busy and not self.closed:
                if self._head is None and not self._take_head():
                    return
                if not self._take_body():
                    return
        except HttpError as exc:
            self._refuse(exc)
            return
        if self.busy and len(self._pending) > MAX_PIPELINED_BYTES and not self._paused:
            self._paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def _take_head(self) -> bool:
        end = self._pending.find(b"\r\n\r\n")
        if end < 0:
            if len(self._pending) > MAX_HEAD_BYTES:
                raise HttpError(431, "request head too large")
            return False
        if end > MAX_HEAD_BYTES:
            raise HttpError(431, "request head too large")
        head = _read_head(bytes(self._pending[:end]))
        del self._pending[:end + 4]
        self._head = head
        return True

    def _take_body(self) -> bool:
        head = self._head
        assert head is not None
        headers = head.headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._continue(headers, waiting=not self._pending)
            body = self._take_chunked()
            if body is None:
                return False
            self._dispatch(body)
            return True
        length_text = headers.get("content-length")
        length = 0
        if length_text is not None:
            if not length_text.isdigit():
                raise HttpError(400, "malformed Content-Length")
            length = int(length_text)
            if length > self.server.max_body:
                raise HttpError(413, f"request body of {length} bytes is above the limit of "
                                     f"{self.server.max_body}")
        self._continue(headers, waiting=len(self._pending) < length)
        if len(self._pending) >= length:
            body = self._pending[:length]
            del self._pending[:length]
            self._dispatch(body)
            return True
        # The rest of the body is read by the kernel straight into its final buffer.
        self._body = bytearray(length)
        self._got = len(self._pending)
        self._body[:self._got] = self._pending
        self._pending.clear()
        if length >= self.server.stream_from:
            self._arriving = ArrivingBody(self._body, self._got)
            self._dispatch(self._body, self._arriving)
        return False

    def _continue(self, headers: dict[str, str], waiting: bool) -> None:
        """Ask for the body of a request that waits for it (``Expect: 100-continue``), once."""
        if waiting and headers.get("expect", "").lower() == "100-continue" \
                and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            headers.pop("expect")

    def _take_chunked(self) -> bytearray | None:
        body = bytearray()
        at = 0
        pending = self._pending
        while True:
            end = pending.find(b"\r\n", at)
            if end < 0:
                return None
            try:
                size = int(bytes(pending[at:end]).split(b";", 1)[0], 16)
            except ValueError:
                raise HttpError(400, "malformed chunk size") from None
            if size == 0:
                trailer = pending.find(b"\r\n\r\n", end)
                if trailer < 0:
                    return None
                del pending[:trailer + 4]
                return body
            if len(body) + size > self.server.max_body:
                raise HttpError(413, f"request body above the limit of {self.server.max_body}")
            if len(pending) < end + 2 + size + 2:
                return None
            body += pending[end + 2:end + 2 + size]
            at = end + 2 + size + 2

    def _dispatch(self, body: bytearray, arriving: ArrivingBody | None = None) -> None:
        head = self._head
        assert head is not None
        self._head = None
        target, _, query = head.target.partition("?")
        if not target.startswith("/"):
            self._refuse(HttpError(400, "only origin-form request targets are served"))
            return
        request = HttpRequest(head.method, unquote(target), query, head.headers, body, arriving)
        self._task = asyncio.get_running_loop().create_task(
            self._answer(request, head.keep_alive, head.method == "HEAD"))

    async def _answer(self, request: HttpRequest, keep_alive: bool, head_only: bool) -> None:
        try:
            response = await self.server.handler(request)
        except asyncio.CancelledError:
            if self.closed:
                return  # the client went away: nobody is left to answer
            # Cancelled with its client still waiting (a bug elsewhere): an answer with the
            # reason, never a silence the client can only end with its own timeout.
            logger.error("request %s %s cancelled with its client waiting", request.method,
                         request.path[:200])
            response = json_error(503, "the request was cancelled in the gateway")
            keep_alive = False
        except Exception:  # a handler's bug: the client gets an answer, the log the trace
            logger.exception("handler failed on %s %s", request.method, request.path[:200])
            response = json_error(500, "internal gateway error")
        finally:
            self._task = None
        keep_alive = keep_alive and not self.server.closing
        self._write(response, keep_alive, head_only)
        if not keep_alive:
            self._close()
            return
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._advance()

    def _write(self, response: HttpResponse, keep_alive: bool, head_only: bool = False) -> None:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        body = response.body
        lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
                 f"Content-Length: {len(body)}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in response.headers]
        if not keep_alive:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        if head_only or not body:
            transport.write(head)
        elif len(body) <= JOIN_MAX_BYTES:
            transport.write(head + body)
        else:
            write_parts(transport, head, body)

    def _refuse(self, error: HttpError) -> None:
        self._write(json_error(error.status, error.message), keep_alive=False)
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is written is flushed

    def close_if_idle(self) -> None:
        """Close the connection unless a request of it is being answered."""
        if not self.busy:
            self._close()


class HttpServer:
    """Serves ``handler`` on one TCP listener."""

    def __init__(self, handler: Handler, max_body: int,
                 stream_from: int = STREAM_FROM_BYTES) -> None:
        self.handler = handler
        self.max_body = max_body
        self.stream_from = stream_from
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (a free one when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                reuse_address=True, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    def stop_listening(self) -> None:
        """No new connections; connections open stay, answered requests close them."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()

    async def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the answers being written, then close everything."""
        self.stop_listening()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(c.busy for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout_s)
