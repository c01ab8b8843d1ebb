"""Cut-through of large bodies over real sockets: the gateway's HTTP server hands a request to
its handler when the head is in, and the upstream forwards the body while it arrives.

A plain asyncio server stands in for Triton: it records how much of each body it has when the
client has sent only part of it, and answers with the length and a digest of what it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.http_server import HttpRequest, HttpResponse, HttpServer, json_error
from gateway.upstream import HttpUpstream, UpstreamError

BODY = bytes(range(256)) * 2048  # 512 KiB, above STREAM_FROM_BYTES
HALF = len(BODY) // 2


class FakeTriton:
    """Reads one request per connection; answers ``<length> <sha256>`` of the body.

    ``close_after``: close the connection once that many body bytes are in (a server that dies
    mid-request). ``seen`` gets each connection's body bytes as they come.
    """

    def __init__(self, close_after: int | None = None) -> None:
        self.close_after = close_after
        self.seen: list[bytearray] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = bytearray()
        self.seen.append(got)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                got.clear()
                while len(got) < length:
                    chunk = await reader.read(min(65536, length - len(got)))
                    if not chunk:
                        return
                    got += chunk
                    if self.close_after is not None and len(got) >= self.close_after:
                        writer.close()
                        return
                answer = f"{len(got)} {hashlib.sha256(got).hexdigest()}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer)
                             + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


async def _serve(handler: Handler) -> tuple[HttpServer, int]:
    server = HttpServer(handler, max_body=8 << 20)
    return server, await server.start("127.0.0.1", 0)


def _forwarding(upstream: HttpUpstream, *ports: int) -> Handler:
    """A handler that sends the body to each port in turn until one answers."""

    async def handler(request: HttpRequest) -> HttpResponse:
        if request.path != "/forward":
            return json_error(404, "no such path")
        for port in ports:
            try:
                reply = await upstream.request(f"127.0.0.1:{port}", "POST", "/x", (),
                                               request.body, request.arriving)
            except UpstreamError:
                continue
            return HttpResponse(reply.status, reply.body)
        return json_error(502, "no upstream answered")

    return handler


async def _read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status = int(head.split(b" ")[1])
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return status, await asyncio.wait_for(reader.readexactly(length), 5)


def _head(path: str, length: int) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Length: {length}\r\n\r\n".encode()


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _expected() -> bytes:
    return f"{len(BODY)} {hashlib.sha256(BODY).hexdigest()}".encode()


@contextlib.asynccontextmanager
async def _gateway(*tritons: FakeTriton) -> AsyncIterator[tuple[int, HttpServer]]:
    """The gateway's HTTP server forwarding to ``tritons`` in turn: its port and itself."""
    for triton in tritons:
        await triton.start()
    upstream = HttpUpstream()
    server, port = await _serve(_forwarding(upstream, *(t.port for t in tritons)))
    try:
        yield port, server
    finally:
        await server.close(1.0)
        await upstream.close()
        for triton in tritons:
            triton.close()


async def _send_half(port: int, path: str = "/forward"
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_head(path, len(BODY)) + BODY[:HALF])
    await writer.drain()
    return reader, writer


def _has_half(triton: FakeTriton) -> Callable[[], bool]:
    return lambda: bool(triton.seen) and len(triton.seen[-1]) >= HALF


def test_the_upstream_gets_the_body_before_the_client_has_sent_it_all() -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with _gateway(triton) as (port, _):
            reader, writer = await _send_half(port)
            for request in range(2):  # the same keep-alive connections carry a second one
                if request:
                    writer.write(_head("/forward", len(BODY)) + BODY[:HALF])
                # Forwarded while the client holds the rest back: cut-through, not stored.
                await _until(_has_half(triton))
                writer.write(BODY[HALF:])
                assert await _read_reply(reader) == (200, _expected())
            assert len(triton.seen) == 1  # one upstream connection, reused
            writer.close()

    asyncio.run(scenario())


def test_a_body_arriving_is_sent_whole_to_the_next_server_when_the_first_dies() -> None:
    async def scenario() -> None:
        dying, alive = FakeTriton(close_after=HALF // 2), FakeTriton()
        async with _gateway(dying, alive) as (port, _):
            reader, writer = await _send_half(port)
            await _until(_has_half(alive))
            writer.write(BODY[HALF:])
            assert await _read_reply(reader) == (200, _expected())
            writer.close()

    asyncio.run(scenario())


def test_an_answer_before_the_body_is_in_keeps_the_connection_in_step(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with _gateway(FakeTriton()) as (port, _):
            reader, writer = await _send_half(port, "/elsewhere")
            status, _ = await _read_reply(reader)  # answered with half the body unread
            assert status == 404
            writer.write(BODY[HALF:] + _head("/forward", len(BODY)) + BODY)
            assert await _read_reply(reader) == (200, _expected())
            writer.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.name.startswith("gateway")]


def test_a_client_leaving_mid_body_closes_the_upstream_request_and_nothing_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        triton = FakeTriton()
        async with _gateway(triton) as (port, server):
            _, writer = await _send_half(port)
            await _until(_has_half(triton))
            writer.transport.abort()
            # The half-sent upstream request is abandoned: its connection is closed, not
            # pooled with half a body in it, and the server answers the next client.
            await _until(lambda: not server.connections)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_head("/forward", len(BODY)) + BODY)
            assert await _read_reply(reader) == (200, _expected())
            assert len(triton.seen) == 2
            writer.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.name.startswith("gateway")]


def test_a_request_cancelled_with_its_client_waiting_is_answered_with_the_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    async def cancelled(request: HttpRequest) -> HttpResponse:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # as a stray cancel would, while the handler awaits
        await asyncio.sleep(1)
        return HttpResponse(200)

    async def scenario() -> None:
        server, port = await _serve(cancelled)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_head("/anything", 2) + b"{}")
            status, body = await _read_reply(reader)
            assert status == 503 and b"cancelled in the gateway" in body
            assert await asyncio.wait_for(reader.read(), 5) == b""  # then it is closed
            writer.close()
        finally:
            await server.close(1.0)

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert any("cancelled with its client waiting" in r.getMessage() for r in caplog.records)
