"""One thread that sends the heartbeats of every simulated agent in a process, and answers probes.

A real agent runs one :class:`~understudy.wire.heartbeat.HeartbeatSender` thread; a thousand of
those would be a thousand threads fighting for the GIL. Here one dedicated thread (not the
asyncio loop, whose websocket work would delay the beats) serves all the agents of a process:

* each agent has its own UDP socket, connected to the controller's heartbeat port, so its
  beats have their own source address and the monitor's PROBEs (sent to that address) come
  back to that socket; all sockets sit in one ``selectors`` selector;
* the heartbeat period T is cut into :data:`BUCKETS` ticks and each agent beats on its own
  tick (agents are spread evenly over the ticks), so a process sends a steady trickle, not a
  burst of every beat at once;
* a PROBE is answered with an ACK (same slot, nonce and seq) at once, unless the agent is
  silenced or stalled.

The asyncio side adds and removes agents through :meth:`HeartbeatPump.add` and
:meth:`HeartbeatPump.remove` (applied by the pump thread at its next tick) and switches an agent
on and off through its :class:`BeatEntry` (``beating``, ``paused_until``): plain attribute
writes, seen by the thread at its next tick.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from understudy.wire.heartbeat import (
    DATAGRAM_SIZE,
    FLAG_TRITON_ALIVE,
    DatagramError,
    Kind,
    decode,
    encode,
    raise_thread_priority,
)

logger = logging.getLogger(__name__)

BUCKETS = 10
"""Ticks per heartbeat period; each agent beats on one of them."""


@dataclass(eq=False)
class BeatEntry:
    """One agent connection's heartbeat channel, as the pump thread sees it."""

    server_id: str
    address: tuple[str, int]
    slot: int
    nonce: int
    beating: bool = True
    """False: neither beats nor probe answers (a crashed or silenced agent)."""
    paused_until: float = 0.0
    """Monotonic time before which the agent neither beats nor answers (a stall)."""
    seq: int = 0
    sent: int = 0
    acks: int = 0
    probes_ignored: int = 0
    sock: socket.socket | None = field(default=None, repr=False)

    def active(self, now: float) -> bool:
        """Whether the agent beats and answers probes at ``now`` (monotonic)."""
        return self.beating and now >= self.paused_until


class HeartbeatPump:
    """The heartbeat thread of one simulated-agent process (see the module docstring)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        """The period T; the controller may change it (``configure``), for every agent here."""
        self.late_ticks = 0
        """Ticks the thread reached more than one period late (this process stalled)."""
        self._buckets: list[list[BeatEntry]] = [[] for _ in range(BUCKETS)]
        self._next_bucket = 0
        self._pending: list[tuple[bool, BeatEntry]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name="sim-heartbeats", daemon=True)

    def start(self) -> HeartbeatPump:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close every socket."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        for bucket in self._buckets:
            for entry in bucket:
                _close(entry)
        with self._lock:
            for _, entry in self._pending:
                _close(entry)
            self._pending.clear()

    def add(self, entry: BeatEntry) -> BeatEntry:
        """Start beating for ``entry`` (its socket is opened here, registered by the thread)."""
        family = socket.AF_INET6 if ":" in entry.address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.connect(entry.address)
        entry.sock = sock
        with self._lock:
            self._pending.append((True, entry))
        return entry

    def remove(self, entry: BeatEntry) -> None:
        """Stop beating for ``entry`` now and close its socket at the thread's next tick."""
        entry.beating = False
        with self._lock:
            self._pending.append((False, entry))

    @property
    def entries(self) -> int:
        """Agents the thread beats for now."""
        return sum(len(bucket) for bucket in self._buckets)

    # --- the thread -------------------------------------------------------------------------

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for adding, entry in pending:
            if adding:
                if entry.sock is None:
                    continue
                bucket = min(self._buckets, key=len)
                bucket.append(entry)
                self._selector.register(entry.sock, selectors.EVENT_READ, entry)
                continue
            for bucket in self._buckets:
                if entry in bucket:
                    bucket.remove(entry)
                    with contextlib.suppress(KeyError, ValueError):
                        self._selector.unregister(entry.sock)  # type: ignore[arg-type]
            _close(entry)

    def _run(self) -> None:
        raise_thread_priority()
        due = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            tick = self.interval_s / BUCKETS
            if now >= due:
                if now - due > self.interval_s:
                    self.late_ticks += 1
                    due = now  # resume the schedule instead of bursting
                self._apply_pending()
                self._beat(self._buckets[self._next_bucket], now)
                self._next_bucket = (self._next_bucket + 1) % BUCKETS
                due += tick
                continue
            try:
                ready = self._selector.select(due - now)
            except (OSError, ValueError):
                ready = []
            for key, _ in ready:
                self._answer(key.data)

    def _beat(self, bucket: list[BeatEntry], now: float) -> None:
        wall = time.time()
        for entry in bucket:
            if not entry.active(now) or entry.sock is None:
                continue
            try:
                entry.sock.send(encode(Kind.BEAT, entry.slot, entry.nonce, entry.seq, wall,
                                       FLAG_TRITON_ALIVE))
            except OSError as exc:  # e.g. ECONNREFUSED for an earlier datagram: keep going
                logger.debug("beat of %s failed: %s", entry.server_id, exc)
                continue
            entry.seq += 1
            entry.sent += 1

    def _answer(self, entry: BeatEntry) -> None:
        sock = entry.sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(DATAGRAM_SIZE + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. ECONNREFUSED reported for an earlier send
            try:
                datagram = decode(data)
            except DatagramError:
                continue
            if datagram.kind is not Kind.PROBE or datagram.nonce != entry.nonce:
                continue
            if not entry.active(time.monotonic()):
                entry.probes_ignored += 1  # a stopped box reads nothing
                continue
            with contextlib.suppress(OSError):
                sock.send(encode(Kind.ACK, entry.slot, entry.nonce, datagram.seq, time.time(),
                                 FLAG_TRITON_ALIVE))
                entry.acks += 1


def _close(entry: BeatEntry) -> None:
    if entry.sock is not None:
        with contextlib.suppress(OSError):
            entry.sock.close()
