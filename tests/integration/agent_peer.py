"""A small websocket peer that stands in for the controller when testing the agent.

It accepts agent connections on ``AGENT_WS_PATH`` (checking the bearer token when given),
answers each hello with a heartbeat channel to its own UDP socket, records every frame and
datagram with its arrival time, and lets a test send commands, probe the agent's heartbeat
thread and await results.
Everything runs on an event loop in a background thread, so synchronous tests can drive it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from understudy.wire import heartbeat
from understudy.wire.protocol import (
    AGENT_WS_PATH,
    CommandResult,
    HeartbeatChannel,
    Hello,
    encode,
    parse_agent_message,
)

NONCE = 0x5EED_0000_0001


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, peer: AgentPeer) -> None:
        self.peer = peer

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            datagram = heartbeat.decode(data)
        except heartbeat.DatagramError:
            return
        self.peer.agent_address = addr
        target = self.peer.beats if datagram.kind is heartbeat.Kind.BEAT else self.peer.acks
        target.append(Received(time.time(), datagram))


@dataclass
class Received:
    """One frame from the agent, with the peer's clock at arrival."""

    at: float
    message: Any


class LoopThread:
    """An asyncio loop in a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class AgentPeer:
    """The fake controller. Start it with ``await peer.start()`` on the loop thread."""

    token: str | None = None
    frames: list[Received] = field(default_factory=list)
    connections: int = 0
    _ws: ServerConnection | None = None
    _changed: asyncio.Condition | None = None
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    port: int = 0
    beats: list[Received] = field(default_factory=list)
    acks: list[Received] = field(default_factory=list)
    agent_address: Any = None
    udp_port: int = 0

    async def start(self, port: int = 0) -> None:
        self._changed = asyncio.Condition()
        self._udp, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Datagrams(self), local_addr=("127.0.0.1", 0))
        self.udp_port = self._udp.get_extra_info("sockname")[1]
        self._server = await serve(self._handle, "127.0.0.1", port, compression=None,
                                   process_request=self._check, ping_interval=None)
        self.port = self._server.sockets[0].getsockname()[1]  # type: ignore[index]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path != AGENT_WS_PATH:
            return connection.respond(404, "not found\n")
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return Response(401, "Unauthorized", Headers(), b"missing or bad token\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        self._ws = ws
        self.connections += 1
        try:
            async for raw in ws:
                message = parse_agent_message(raw)
                if isinstance(message, Hello):
                    await ws.send(encode(HeartbeatChannel(
                        port=self.udp_port, slot=1, nonce=NONCE,
                        heartbeat_interval_ms=message.heartbeat_interval_ms)))
                assert self._changed is not None
                async with self._changed:
                    self.frames.append(Received(time.time(), message))
                    self._changed.notify_all()
        except Exception:  # noqa: BLE001 - a dropped agent is an expected event here
            pass
        finally:
            if self._ws is ws:
                self._ws = None

    async def wait_for(self, predicate: Callable[[list[Received]], Any],
                       timeout: float = 30.0) -> Any:
        """Wait until ``predicate(frames)`` is truthy; return its value."""
        assert self._changed is not None

        async def check() -> Any:
            async with self._changed:
                while not (value := predicate(self.frames)):
                    await self._changed.wait()
                return value

        return await asyncio.wait_for(check(), timeout)

    async def send_raw(self, text: str) -> None:
        await self.wait_for(lambda _: self._ws is not None)
        assert self._ws is not None
        await self._ws.send(text)

    async def command(self, kind: str, timeout: float = 120.0, **fields: Any) -> CommandResult:
        """Send one command and wait for its result."""
        from understudy.wire.protocol import InventoryCommand, LoadCommand, UnloadCommand

        command_id = f"c{next(self._ids)}"
        types = {"load": LoadCommand, "unload": UnloadCommand, "inventory": InventoryCommand}
        await self.send_raw(encode(types[kind](command_id=command_id, **fields)))
        return await self.result(command_id, timeout)

    async def result(self, command_id: str, timeout: float = 120.0) -> CommandResult:
        return await self.wait_for(lambda frames: next(
            (f.message for f in frames if isinstance(f.message, CommandResult)
             and f.message.command_id == command_id), None), timeout)

    def of_type(self, kind: str) -> list[Received]:
        return [f for f in self.frames if getattr(f.message, "type", None) == kind]

    def probe(self, seq: int) -> None:
        """Send a PROBE to the agent's heartbeat thread (it answers with an ACK)."""
        self._udp.sendto(heartbeat.encode(heartbeat.Kind.PROBE, 1, NONCE, seq, time.time()),
                         self.agent_address)

    async def close(self) -> None:
        self._udp.close()
        self._server.close(close_connections=True)
        await self._server.wait_closed()
