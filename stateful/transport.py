"""TCP transport for the cores: length-prefixed frames over asyncio streams.

A frame is a JSON envelope followed by the raw bytes of its tensors
(``stateful.messages.encode_frame``).

One ``Transport`` per process: a listening socket and one outgoing connection per peer address,
for any number of local nodes (the runtime hosts the manager and the frontend together). Frames
go through the same ``Links`` as in the simulator: numbered per (source, destination), acked
cumulatively, and re-sent when a connection is re-established, so a dropped connection to a
live peer loses nothing. A peer that cannot be reached for ``give_up_s`` is gone for good
(replica ids are never reused): its queue and retransmission state are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from stateful.errors import WireFormatError
from stateful.link import Frame, Links
from stateful.messages import Envelope, LinkAck, decode_frame, encode_frame

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(_LENGTH.size)
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise WireFormatError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    return await reader.readexactly(size)


def frame_bytes(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class _Peer:
    address: str
    queue: asyncio.Queue[tuple[str, str, Frame]] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    free_at: float = 0.0
    """With an emulated link, when the link finishes sending what was written so far."""


Deliver = Callable[[str, str, object], None]
"""(src node, dst node, message) for a message that arrived in order."""


class Transport:
    def __init__(self, deliver: Deliver, *, host: str = "127.0.0.1", port: int = 0,
                 give_up_s: float = 1.0) -> None:
        self.deliver = deliver
        self.host = host
        self.port = port
        self.give_up_s = give_up_s
        self.local: dict[str, Links] = {}
        self.addresses: dict[str, str] = {}
        self.peers: dict[str, _Peer] = {}
        self._server: asyncio.base_events.Server | None = None
        self._acks: dict[tuple[str, str], int] = {}
        self._ack_scheduled = False
        self._closing = False
        self.link_bps: float | None = None
        """Emulated bandwidth per peer link (benchmarks on one machine; None: loopback speed)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.address

    def add_node(self, node: str) -> None:
        self.local[node] = Links()

    def learn(self, addresses: dict[str, str]) -> None:
        self.addresses.update(addresses)

    async def close(self) -> None:
        self._closing = True
        for peer in self.peers.values():
            if peer.task is not None:
                peer.task.cancel()
        for peer in self.peers.values():
            if peer.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await peer.task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- sending -----------------------------------------------------------------------------

    def send(self, src: str, dst: str, msg: BaseModel) -> None:
        frame = self.local[src].send(dst, msg)
        self._enqueue(src, dst, frame)

    def _enqueue(self, src: str, dst: str, frame: Frame) -> None:
        if dst in self.local:  # same process: skip the socket, keep the ordering
            asyncio.get_running_loop().call_soon(self._on_envelope, src, dst, frame.seq,
                                                 frame.msg)
            return
        address = self.addresses.get(dst)
        if address is None:
            logger.warning("no address for %s; dropping %s", dst, type(frame.msg).__name__)
            return
        peer = self.peers.get(address)
        if peer is None:
            peer = self.peers[address] = _Peer(address)
            peer.task = asyncio.get_running_loop().create_task(self._pump(peer))
        peer.queue.put_nowait((src, dst, frame))

    async def _pump(self, peer: _Peer) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            while not self._closing:
                if writer is None:
                    writer = await self._connect(peer)
                    if writer is None:
                        return
                src, dst, frame = await peer.queue.get()
                msg = frame.msg if isinstance(frame.msg, BaseModel) else LinkAck(upto=frame.seq)
                link = frame.seq if frame.msg is not None else 0
                data = frame_bytes(encode_frame(src, dst, msg, link))
                if self.link_bps:
                    await self._pace(peer, len(data))
                try:
                    writer.write(data)
                    if peer.queue.empty():
                        await writer.drain()
                except (ConnectionError, OSError):
                    writer = None
        finally:
            if writer is not None:
                writer.close()

    async def _pace(self, peer: _Peer, size: int) -> None:
        """Hold a frame until an emulated link of ``link_bps`` would have sent it."""
        assert self.link_bps
        now = asyncio.get_running_loop().time()
        peer.free_at = max(now, peer.free_at) + size * 8 / self.link_bps
        if peer.free_at > now:
            await asyncio.sleep(peer.free_at - now)

    async def _connect(self, peer: _Peer) -> asyncio.StreamWriter | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_s
        host, port = parse_address(peer.address)
        while not self._closing:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                if loop.time() > deadline:
                    self._give_up(peer)
                    return None
                await asyncio.sleep(0.02)
                continue
            self._resend(peer)
            return writer
        return None

    def _resend(self, peer: _Peer) -> None:
        """After a (re)connect, queue every unacknowledged frame for nodes at that address."""
        for src, links in self.local.items():
            for dst, frames in links.pending().items():
                if self.addresses.get(dst) == peer.address:
                    for frame in frames:
                        peer.queue.put_nowait((src, dst, frame))

    def _give_up(self, peer: _Peer) -> None:
        gone = [n for n, a in self.addresses.items() if a == peer.address]
        logger.info("peer %s (%s) unreachable; dropping what was queued for it", peer.address,
                    gone)
        for links in self.local.values():
            for node in gone:
                links.forget(node)
        self.peers.pop(peer.address, None)

    # -- receiving ---------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                env = decode_frame(await read_frame(reader))
                self._on_frame(env)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except WireFormatError:
            logger.exception("closing a connection that sent an undecodable frame")
        finally:
            writer.close()

    def _on_frame(self, env: Envelope) -> None:
        if isinstance(env.msg, LinkAck):
            self._on_envelope(env.src, env.dst, env.msg.upto, None)
        else:
            self._on_envelope(env.src, env.dst, env.link, env.msg)

    def _on_envelope(self, src: str, dst: str, seq: int, msg: object | None) -> None:
        links = self.local.get(dst)
        if links is None:
            logger.warning("frame for %s, which is not hosted here", dst)
            return
        delivered, ack = links.receive(src, Frame(seq, msg))
        if ack is not None:
            self._acks[(dst, src)] = ack.seq
            if not self._ack_scheduled:
                self._ack_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_acks)
        for item in delivered:
            self.deliver(src, dst, item)

    def _flush_acks(self) -> None:
        """One cumulative ack per link per loop iteration, not one per frame."""
        self._ack_scheduled = False
        acks, self._acks = self._acks, {}
        for (local, remote), upto in acks.items():
            self._enqueue(local, remote, Frame(upto))
