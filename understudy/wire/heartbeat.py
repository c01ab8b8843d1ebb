"""The heartbeat channel: compact UDP datagrams beside the command websocket.

Heartbeats do not travel on the websocket. A JSON frame through the controller's event loop cost
tens of microseconds each and waited behind whatever that loop was doing; here each heartbeat is
one fixed-size datagram that a separate monitor process reads and times
(``controller.heartbeat_monitor``), and that the agent sends from a dedicated thread
(:class:`HeartbeatSender`), so neither side's busy event loop delays it.

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

import contextlib
import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

logger = logging.getLogger(__name__)

MAGIC = b"UH"
VERSION = 1
_FORMAT = struct.Struct("!2sBBB3xIQQd")
DATAGRAM_SIZE = _FORMAT.size
FLAG_TRITON_ALIVE = 1
SENDER_NICE = -10
"""Niceness asked for the sending thread (only root may lower it; otherwise it stays as is)."""


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


def raise_thread_priority(nice: int = SENDER_NICE) -> bool:
    """Lower the calling thread's niceness (Linux: per thread); False where not permitted."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):
        return False
    return True


class HeartbeatSender:
    """A daemon thread that sends BEATs every interval and answers PROBEs at once.

    It shares its process's fate (a stopped or killed agent stops beating), but not its event
    loop: the thread sleeps in ``select`` on its own socket, at raised priority where allowed,
    and needs the GIL only for the few microseconds of each send.
    """

    def __init__(self, address: tuple[str, int], slot: int, nonce: int,
                 interval_s: Callable[[], float], triton_alive: Callable[[], bool]) -> None:
        self.address = address
        self.slot = slot
        self.nonce = nonce
        self.interval_s = interval_s
        self.triton_alive = triton_alive
        self.sent = 0
        self.probes_answered = 0
        self.late = 0
        """Beats sent more than one interval after their due time (this host stalled)."""
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.connect(address)
        self._socket.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{slot}", daemon=True)

    def start(self) -> HeartbeatSender:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending (the thread ends within one interval)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        with contextlib.suppress(OSError):
            self._socket.close()

    def _flags(self) -> int:
        return FLAG_TRITON_ALIVE if self.triton_alive() else 0

    def _send(self, kind: Kind, seq: int) -> None:
        try:
            self._socket.send(encode(kind, self.slot, self.nonce, seq, time.time(),
                                     self._flags()))
        except OSError as exc:  # e.g. ECONNREFUSED from an earlier datagram: keep going
            logger.debug("heartbeat send failed: %s", exc)

    def _run(self) -> None:
        raise_thread_priority()
        seq = 0
        due = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= due:
                if now - due > self.interval_s():
                    self.late += 1
                    due = now  # resume the schedule instead of bursting
                self._send(Kind.BEAT, seq)
                seq += 1
                self.sent += 1
                due += self.interval_s()
                continue
            try:
                readable, _, _ = select.select([self._socket], [], [], due - now)
            except (OSError, ValueError):
                return  # socket closed by stop()
            if readable:
                self._answer_probes()

    def _answer_probes(self) -> None:
        while True:
            try:
                data = self._socket.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. ECONNREFUSED reported for an earlier send
            try:
                datagram = decode(data)
            except DatagramError:
                continue
            if datagram.kind is Kind.PROBE and datagram.nonce == self.nonce:
                self._send(Kind.ACK, datagram.seq)
                self.probes_answered += 1
