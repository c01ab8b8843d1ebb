"""Pooled keep-alive HTTP/1.1 to the servers' Tritons (the only module that talks to them).

A small client on asyncio's protocol API instead of aiohttp's: on the request path it is the
gateway's largest fixed cost, and aiohttp's client spends most of it on features Triton does
not need (cookies, redirects, tracing, multi-step streams). It sends the body bytes as they are
and returns the reply's status, headers and body; it understands ``Content-Length``, chunked
replies and ``Connection: close``. Idle connections are kept per ``host:port``; a reused one
that turns out closed by the peer before any reply is retried once on a fresh connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.arriving import ArrivingBody
from gateway.http_server import write_parts

logger = logging.getLogger(__name__)

MAX_REPLY_BYTES = 1 << 30
MAX_HEAD_BYTES = 64 * 1024
NO_BODY_STATUSES = frozenset({204, 304})
JOIN_MAX_BYTES = 64 * 1024


class UpstreamError(Exception):
    """No reply: connection refused, reset or closed, connect timeout, malformed reply."""


@dataclass(slots=True)
class UpstreamReply:
    """One Triton reply: status, headers (lower-case names) and the body as it came."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._buffer = bytearray()
        self._waiter: asyncio.Future[UpstreamReply] | None = None
        self._head: tuple[int, dict[str, str]] | None = None
        self._length = -1  # body bytes expected; -1: until close; -2: chunked
        self._chunks = bytearray()
        self._received = False
        self._no_body = False

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._received = True
        self._buffer += data
        if self._waiter is not None and not self._waiter.done():
            try:
                self._parse()
            except UpstreamError as exc:
                self._fail(exc)

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._head is not None and self._length == -1:
            self._finish(bytes(self._buffer))  # a body delimited by the close
            return
        self._fail(UpstreamError(f"connection closed by the server"
                                 f"{f': {exc}' if exc else ''}"))

    # --- request -------------------------------------------------------------------------

    async def request(self, head: bytes, body: bytes | bytearray, no_body: bool,
                      arriving: ArrivingBody | None = None) -> UpstreamReply:
        """Send one request; its reply (UpstreamError when none comes).

        With ``arriving`` (the body still coming in from the client), what is in goes now and
        each later part as it arrives.
        """
        transport = self.transport
        assert transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._no_body = no_body
        self._received = False
        forward = None
        if arriving is not None and not arriving.complete:
            write_parts(transport, head, memoryview(body)[:arriving.received])

            def forward(start: int, end: int) -> None:
                if not transport.is_closing():
                    transport.write(memoryview(body)[start:end])

            arriving.listen(forward)
        elif len(body) <= JOIN_MAX_BYTES:
            transport.write(head + body if body else head)
        else:
            # Not joined: a copy of a large body costs more than a vectored write.
            write_parts(transport, head, body)
        try:
            reply = await self._waiter
            if arriving is not None and not arriving.complete:
                self.reusable = False  # answered before the whole body went: not reusable
            return reply
        except BaseException:
            # Cancelled (deadline, a move) or failed mid-reply: the stream's position is
            # unknown, so the connection cannot carry another request.
            self.reusable = False
            transport.close()
            raise
        finally:
            self._waiter = None
            if forward is not None:
                assert arriving is not None
                arriving.unlisten(forward)

    @property
    def answered_nothing(self) -> bool:
        """Whether the last request failed before any byte of reply came back."""
        return not self._received

    def _parse(self) -> None:
        if self._head is None and not self._parse_head():
            return
        if self._length >= 0:
            if len(self._buffer) == self._length:
                body = bytes(self._buffer)  # the usual case: one copy, not two
                self._buffer.clear()
                self._finish(body)
            elif len(self._buffer) > self._length:
                body = bytes(self._buffer[:self._length])
                del self._buffer[:self._length]
                self._finish(body)
        elif self._length == -2:
            self._parse_chunks()
        elif len(self._buffer) > MAX_REPLY_BYTES:
            raise UpstreamError("reply too large")

    def _parse_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise UpstreamError("reply header too large")
            return False
        raw = bytes(self._buffer[:end])
        del self._buffer[:end + 4]
        status, headers, closes = _read_head(raw)
        if closes:
            self.reusable = False
        if 100 <= status < 200:
            return self._parse_head() if self._buffer else False  # skip 100 Continue
        self._head = (status, headers)
        if self._no_body or status in NO_BODY_STATUSES:
            self._length = 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._length = -2
        elif "content-length" in headers:
            try:
                self._length = int(headers["content-length"])
            except ValueError as exc:
                raise UpstreamError("malformed Content-Length") from exc
            if not 0 <= self._length <= MAX_REPLY_BYTES:
                raise UpstreamError(f"reply of {self._length} bytes refused")
        else:
            self._length = -1
            self.reusable = False
        return True

    def _parse_chunks(self) -> None:
        while True:
            end = self._buffer.find(b"\r\n")
            if end < 0:
                return
            try:
                size = int(bytes(self._buffer[:end]).split(b";", 1)[0], 16)
            except ValueError as exc:
                raise UpstreamError("malformed chunk size") from exc
            if size == 0:
                trailer = self._buffer.find(b"\r\n\r\n", end)
                if trailer < 0:
                    return
                del self._buffer[:trailer + 4]
                self._finish(bytes(self._chunks))
                return
            if len(self._buffer) < end + 2 + size + 2:
                return
            self._chunks += self._buffer[end + 2:end + 2 + size]
            if len(self._chunks) > MAX_REPLY_BYTES:
                raise UpstreamError("reply too large")
            del self._buffer[:end + 2 + size + 2]

    def _finish(self, body: bytes) -> None:
        assert self._head is not None
        status, headers = self._head
        self._head, self._length = None, -1
        self._chunks = bytearray()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(UpstreamReply(status, headers, body))

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


HEAD_CACHE_ENTRIES = 256
HEAD_CACHE_MAX_BYTES = 2048
_heads: dict[bytes, tuple[int, dict[str, str], bool]] = {}
"""Reply heads already parsed, by their bytes: Triton answers a model's requests with the same
head again and again."""


def _read_head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers with lower-case names, whether the connection closes after)."""
    known = _heads.get(raw)
    if known is None:
        known = _parse_head(raw)
        if len(raw) <= HEAD_CACHE_MAX_BYTES:
            if len(_heads) >= HEAD_CACHE_ENTRIES:
                _heads.clear()
            _heads[raw] = known
    status, headers, closes = known
    return status, dict(headers), closes


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise UpstreamError(f"malformed status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    closes = headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0"
    return int(parts[1]), headers, closes


class HttpUpstream:
    """Keep-alive connections to every Triton the gateway routes to."""

    def __init__(self, connect_timeout_s: float = 1.0, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[str, list[_Connection]] = {}
        self._heads: dict[tuple[str, str, str], bytes] = {}

    async def request(self, hostport: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]] = (),
                      body: bytes | bytearray = b"",
                      arriving: ArrivingBody | None = None) -> UpstreamReply:
        """Send one request to ``hostport`` (``host:port``); UpstreamError without a reply.

        ``arriving``: ``body`` is still being filled by its client (forwarded as it comes).
        """
        head = self._head(hostport, method, path, headers, len(body))
        no_body = method == "HEAD"
        for _ in range(2):
            connection, reused = await self._connection(hostport)
            try:
                reply = await connection.request(head, body, no_body, arriving)
            except UpstreamError:
                if reused and connection.answered_nothing:
                    continue  # the peer closed it while idle: once more on a fresh one
                raise
            if connection.reusable and not connection.closed:
                self._release(hostport, connection)
            elif connection.transport is not None:
                connection.transport.close()
            return reply
        raise UpstreamError("connection closed by the server")  # pragma: no cover

    def _head(self, hostport: str, method: str, path: str,
              headers: Sequence[tuple[str, str]], length: int) -> bytes:
        key = (hostport, method, path)
        prefix = self._heads.get(key)
        if prefix is None:
            if len(self._heads) > 10_000:
                self._heads.clear()  # routes come and go; keep the cache bounded
            prefix = self._heads[key] = (f"{method} {path} HTTP/1.1\r\nHost: {hostport}\r\n"
                                         ).encode("latin-1")
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
        return prefix + f"{extra}Content-Length: {length}\r\n\r\n".encode("latin-1")

    async def _connection(self, hostport: str) -> tuple[_Connection, bool]:
        idle = self._idle.get(hostport)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection, True
        host, _, port = hostport.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(_Connection, host, int(port))
        except (OSError, TimeoutError, ValueError) as exc:
            raise UpstreamError(f"cannot connect to {hostport}: "
                                f"{exc or type(exc).__name__}") from exc
        return connection, False

    def _release(self, hostport: str, connection: _Connection) -> None:
        idle = self._idle.setdefault(hostport, [])
        if len(idle) < self.max_idle_per_host:
            idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()

    def drop(self, hostport: str) -> None:
        """Close the idle connections to one server (it moved away or died)."""
        for connection in self._idle.pop(hostport, []):
            if connection.transport is not None:
                connection.transport.close()

    async def close(self) -> None:
        """Close every idle connection."""
        for hostport in list(self._idle):
            self.drop(hostport)
