"""The heartbeat channel: compact UDP datagrams beside the command websocket.

Heartbeats do not travel on the websocket. A JSON frame through the controller's event loop cost
tens of microseconds each and waited behind whatever that loop was doing; here each heartbeat is
one fixed-size datagram that a separate monitor process reads and times
(``controller.heartbeat_monitor``), and that the agent sends from a tiny child process
(``understudy.wire.heartbeat_process``), so neither side's busy event loop, nor the agent's GIL,
delays it.

After an agent's ``hello`` the controller answers with a ``heartbeat_channel`` frame: the UDP
port, a slot number and a random 64-bit nonce for this connection. Every datagram carries the
slot and the nonce; the monitor drops datagrams whose nonce does not match the slot's current
connection, so a stale agent or a forger who does not see the websocket cannot keep a server
alive.

Datagram (network byte order, :data:`DATAGRAM_SIZE` bytes)::

    magic 2s "UH" | version B | kind B | flags B | pad 3x | slot I | nonce Q | seq Q | sent_at d

``kind``: BEAT (agent -> controller, every T), PROBE (controller -> agent, when the monitor
suspects the server), ACK (agent -> controller, the answer to a probe, echoing its ``seq``).
``flags`` bit 0: the agent's Triton is alive.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from enum import IntEnum

MAGIC = b"UH"
VERSION = 1
_FORMAT = struct.Struct("!2sBBB3xIQQd")
DATAGRAM_SIZE = _FORMAT.size
FLAG_TRITON_ALIVE = 1


class Kind(IntEnum):
    """What a datagram is."""

    BEAT = 1
    PROBE = 2
    ACK = 3


@dataclass(frozen=True, slots=True)
class Datagram:
    """One decoded datagram."""

    kind: Kind
    slot: int
    nonce: int
    seq: int
    sent_at: float
    flags: int = 0

    @property
    def triton_alive(self) -> bool:
        """Whether the sender's Triton was alive when it sent this."""
        return bool(self.flags & FLAG_TRITON_ALIVE)


class DatagramError(ValueError):
    """Bytes that are not a heartbeat datagram of this version."""


def encode(kind: Kind, slot: int, nonce: int, seq: int, sent_at: float, flags: int = 0) -> bytes:
    """The bytes of one datagram."""
    return _FORMAT.pack(MAGIC, VERSION, int(kind), flags, slot, nonce, seq, sent_at)


def decode(data: bytes | memoryview) -> Datagram:
    """Decode and check one datagram (:class:`DatagramError` when it is not one)."""
    if len(data) != DATAGRAM_SIZE:
        raise DatagramError(f"{len(data)} bytes, expected {DATAGRAM_SIZE}")
    magic, version, kind, flags, slot, nonce, seq, sent_at = _FORMAT.unpack(data)
    if magic != MAGIC or version != VERSION:
        raise DatagramError("not a heartbeat datagram of this version")
    try:
        return Datagram(Kind(kind), slot, nonce, seq, sent_at, flags)
    except ValueError as exc:
        raise DatagramError(f"unknown kind {kind}") from exc


unpack_from = _FORMAT.unpack_from
"""The raw fields at the start of a buffer, unchecked: the monitor's hot path checks them itself
(the struct's own method, not a wrapper: each call is paid fifty thousand times a second)."""


def new_nonce() -> int:
    """A random 64-bit connection nonce (never 0, which means "no channel")."""
    return secrets.randbits(64) or 1
