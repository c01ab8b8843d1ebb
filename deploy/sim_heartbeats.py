"""The heartbeats of every simulated agent of a process, sent by one dedicated thread of its own.

A real agent runs one :class:`~understudy.wire.heartbeat.HeartbeatSender` thread beside its
asyncio loop; a thousand of those would be a thousand threads. Here the agents of a
``sim-agents`` process share one sender: the single thread of a small child process
(``python -m deploy.sim_heartbeats``, started by :class:`HeartbeatPump`). It is a process, not a
thread of the agents' process, because a thread there shares the GIL with an asyncio loop doing
the websocket work of hundreds of agents: on a loaded machine the loop's thread, holding the
GIL, is descheduled and the heartbeat thread waits behind it, so whole processes of agents fell
silent for 150 ms at once and were declared failed (an artefact of packing 250 agents into one
process; a real agent's loop has one agent's work). The child asks for a raised priority (root
only), runs with the garbage collector off (it allocates nothing that lives), and:

* gives each agent its own UDP socket, connected to the controller's heartbeat port, so its
  beats have their own source address and the monitor's PROBEs (sent there) come back to it;
  every socket sits in one ``selectors`` selector;
* cuts the period T into :data:`BUCKETS` ticks and beats each agent on its own tick, so a
  process sends a steady trickle, not a burst of every beat at once;
* answers a PROBE at once with an ACK (same slot, nonce and seq), unless the agent is off
  (crashed, silenced, stalled);
* keeps each agent's TCP **liveness stream** to the monitor where the channel names one
  (``tcp_port``; ``hello SLOT NONCE``, then ``bye`` before a close on purpose), as a real
  agent's heartbeat process does: a crash closes it without ``bye`` (the monitor declares that
  at once), a silence keeps it open; a stream the monitor closes is opened again;
* reads its orders on stdin, one per line (``add SERVER SLOT NONCE HOST PORT ON [TCP_PORT]``,
  ``remove SERVER bye|kill``, ``on SERVER``, ``off SERVER``, ``interval SECONDS``), and prints its
  counters every :data:`STATS_EVERY_S` as one JSON line (``late_ticks``, ``max_late_ms``,
  ``reports_skipped``, and per server ``[sent, acks, probes_ignored]``) without ever blocking
  on it: a report the reader has no room for waits, and the next ones are skipped meanwhile;
  stdin closing ends it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import logging
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from understudy.wire.heartbeat import (
    DATAGRAM_SIZE,
    FLAG_TRITON_ALIVE,
    DatagramError,
    Kind,
    decode,
    encode,
)

logger = logging.getLogger(__name__)

BUCKETS = 10
"""Ticks per heartbeat period; each agent beats on one of them."""
STATS_EVERY_S = 1.0
STREAM_RETRY_S = 1.0
PUMP_NICE = -10
START_TIMEOUT_S = 30.0


# --- the asyncio side ---------------------------------------------------------------------------


@dataclass(eq=False)
class BeatEntry:
    """One agent connection's heartbeat channel, as the agents' process sees it."""

    server_id: str
    address: tuple[str, int]
    slot: int
    nonce: int
    beating: bool = True
    """False: neither beats nor probe answers (a crashed, silenced or stalled agent)."""
    tcp_port: int | None = None
    """The monitor's liveness-stream port (None: no stream)."""


class HeartbeatPump:
    """The handle on the heartbeat process of one ``sim-agents`` process."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self.late_ticks = 0
        """Ticks the sender reached more than one period late (its process stalled)."""
        self.max_late_ms = 0.0
        """The latest tick the sender reached, after its due time."""
        self.reports_skipped = 0
        self.counters: dict[str, list[int]] = {}
        """Per server: beats sent, probes answered, probes ignored (current channel)."""
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    @property
    def interval_s(self) -> float:
        """The period T (the controller may change it, for every agent of the process)."""
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        if value != self._interval_s:
            self._interval_s = value
            self._order(f"interval {value!r}")

    def start(self) -> HeartbeatPump:
        """Start the heartbeat process and wait until it runs; returns self."""
        process = subprocess.Popen(  # noqa: S603 - our own module
            [sys.executable, "-m", "deploy.sim_heartbeats", "--interval-s",
             repr(self._interval_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None  # noqa: S101 - piped
        ready = process.stdout.readline()
        if not ready.startswith("{"):
            process.kill()
            raise RuntimeError(f"the heartbeat process did not start (code {process.poll()})")
        self._process = process
        threading.Thread(target=self._read_counters, args=(process,), daemon=True,
                         name="sim-heartbeat-counters").start()
        return self

    def stop(self) -> None:
        """End the heartbeat process (closing its stdin ends it)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def add(self, entry: BeatEntry) -> BeatEntry:
        """Beat for ``entry`` from now on (replacing the server's earlier channel)."""
        host, port = entry.address
        self._order(f"add {entry.server_id} {entry.slot} {entry.nonce} {host} {port} "
                    f"{int(entry.beating)} {entry.tcp_port or 0}")
        return entry

    def remove(self, entry: BeatEntry, goodbye: bool = True) -> None:
        """Stop beating for ``entry``; close its socket and stream (no ``bye``: a crash)."""
        entry.beating = False
        self._order(f"remove {entry.server_id} {'bye' if goodbye else 'kill'}")

    def set_beating(self, entry: BeatEntry, beating: bool) -> None:
        """Switch beats and probe answers of ``entry`` on or off."""
        entry.beating = beating
        self._order(f"{'on' if beating else 'off'} {entry.server_id}")

    def _order(self, line: str) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return  # not started (tests of the agent's logic), or stopping
        with self._lock, contextlib.suppress(OSError, ValueError):
            process.stdin.write(line + "\n")
            process.stdin.flush()

    def _read_counters(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None  # noqa: S101 - piped
        for line in process.stdout:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                report = json.loads(line)
                self.late_ticks = int(report["late_ticks"])
                self.max_late_ms = float(report["max_late_ms"])
                self.reports_skipped = int(report["reports_skipped"])
                self.counters = report["servers"]


# --- the heartbeat process ----------------------------------------------------------------------


@dataclass(eq=False)
class _Channel:
    server_id: str
    slot: int
    nonce: int
    sock: socket.socket
    beating: bool
    stream_address: tuple[str, int] | None = None
    stream: socket.socket | None = None
    stream_connected: bool = False
    stream_retry_at: float = 0.0
    seq: int = 0
    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Beats sent, probes answered, probes ignored."""


@dataclass(eq=False)
class _StreamKey:
    """Selector data of a channel's liveness stream."""

    channel: _Channel


class _Sender:
    """The heartbeat process's loop (see the module docstring)."""

    def __init__(self, interval_s: float, orders: Any, reports: Any) -> None:
        self.interval_s = interval_s
        self.orders = orders
        self.reports = reports
        self.selector = selectors.DefaultSelector()
        self.selector.register(orders, selectors.EVENT_READ, None)
        self.channels: dict[str, _Channel] = {}
        self.buckets: list[list[_Channel]] = [[] for _ in range(BUCKETS)]
        self.late_ticks = 0
        self.max_late_s = 0.0
        self.reports_skipped = 0
        self.unsent = b""
        self.pending = b""
        self.running = True

    def run(self) -> None:
        due = time.monotonic()
        next_report = due + STATS_EVERY_S
        bucket = 0
        while self.running:
            now = time.monotonic()
            if now >= due:
                self.max_late_s = max(self.max_late_s, now - due)
                if now - due > self.interval_s:
                    self.late_ticks += 1
                    logger.warning("heartbeat tick %.1f ms late (this process did not run)",
                                   1000 * (now - due))
                    due = now  # resume the schedule instead of bursting
                self.beat(self.buckets[bucket])
                bucket = (bucket + 1) % BUCKETS
                due += self.interval_s / BUCKETS
                if now >= next_report:
                    next_report = now + STATS_EVERY_S
                    self.report()
                continue
            for key, _ in self.selector.select(due - now):
                if key.data is None:
                    self.read_orders()
                elif isinstance(key.data, _StreamKey):
                    self.stream_event(key.data.channel)
                else:
                    self.answer(key.data)

    def beat(self, bucket: list[_Channel]) -> None:
        wall = time.time()
        for channel in bucket:
            if channel.stream is None and channel.stream_address is not None and \
                    time.monotonic() >= channel.stream_retry_at:
                self.open_stream(channel)
            if not channel.beating:
                continue
            try:
                channel.sock.send(encode(Kind.BEAT, channel.slot, channel.nonce, channel.seq,
                                         wall, FLAG_TRITON_ALIVE))
            except OSError:
                continue  # e.g. ECONNREFUSED for an earlier datagram: keep going
            channel.seq += 1
            channel.counts[0] += 1

    def answer(self, channel: _Channel) -> None:
        while True:
            try:
                data = channel.sock.recv(DATAGRAM_SIZE + 1)
            except OSError:
                return  # nothing more, or ECONNREFUSED reported for an earlier send
            try:
                datagram = decode(data)
            except DatagramError:
                continue
            if datagram.kind is not Kind.PROBE or datagram.nonce != channel.nonce:
                continue
            if not channel.beating:
                channel.counts[2] += 1  # a stopped box reads nothing
                continue
            with contextlib.suppress(OSError):
                channel.sock.send(encode(Kind.ACK, channel.slot, channel.nonce, datagram.seq,
                                         time.time(), FLAG_TRITON_ALIVE))
                channel.counts[1] += 1

    def read_orders(self) -> None:
        try:
            chunk = os.read(self.orders.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.running = False  # the agents' process is gone
            return
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            try:
                self.apply(line.decode().split())
            except (ValueError, IndexError, KeyError, OSError) as exc:
                logger.error("bad order %r: %s", line[:200], exc)

    def apply(self, words: list[str]) -> None:
        op = words[0]
        if op == "interval":
            self.interval_s = float(words[1])
        elif op == "add":
            server, slot, nonce, host, port, on, tcp_port = words[1:8]
            self.drop(server, goodbye=True)
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                 socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.connect((host, int(port)))
            channel = _Channel(server, int(slot), int(nonce), sock, on == "1",
                               (host, int(tcp_port)) if int(tcp_port) else None)
            self.channels[server] = channel
            min(self.buckets, key=len).append(channel)
            self.selector.register(sock, selectors.EVENT_READ, channel)
            self.open_stream(channel)
        elif op == "remove":
            self.drop(words[1], goodbye=words[2] == "bye")
        elif op in ("on", "off"):
            found = self.channels.get(words[1])
            if found is not None:
                found.beating = op == "on"
        else:
            raise ValueError(f"unknown order {op!r}")

    def drop(self, server: str, goodbye: bool) -> None:
        channel = self.channels.pop(server, None)
        if channel is None:
            return
        for bucket in self.buckets:
            if channel in bucket:
                bucket.remove(channel)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(channel.sock)
        channel.sock.close()
        self.close_stream(channel, goodbye)
        channel.stream_address = None

    # --- liveness streams ---------------------------------------------------------------------

    def open_stream(self, channel: _Channel) -> None:
        """Start connecting the channel's liveness stream (non-blocking)."""
        if channel.stream_address is None or channel.stream is not None:
            return
        host, port = channel.stream_address
        stream = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                               socket.SOCK_STREAM)
        stream.setblocking(False)
        if stream.connect_ex((host, port)) not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            stream.close()
            channel.stream_retry_at = time.monotonic() + STREAM_RETRY_S
            return
        channel.stream, channel.stream_connected = stream, False
        self.selector.register(stream, selectors.EVENT_WRITE, _StreamKey(channel))

    def stream_event(self, channel: _Channel) -> None:
        """The stream connected (say hello), or the monitor closed it (open it again later)."""
        stream = channel.stream
        if stream is None:
            return
        if not channel.stream_connected:
            if stream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                with contextlib.suppress(OSError):
                    stream.send(f"hello {channel.slot} {channel.nonce}\n".encode())
                    channel.stream_connected = True
                    self.selector.modify(stream, selectors.EVENT_READ, _StreamKey(channel))
                    return
            self.close_stream(channel, goodbye=False)
            channel.stream_retry_at = time.monotonic() + STREAM_RETRY_S
            return
        try:
            data = stream.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close_stream(channel, goodbye=False)
            channel.stream_retry_at = time.monotonic() + STREAM_RETRY_S

    def close_stream(self, channel: _Channel, goodbye: bool) -> None:
        stream, channel.stream = channel.stream, None
        if stream is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(stream)
        with contextlib.suppress(OSError):
            if goodbye and channel.stream_connected:
                stream.send(b"bye\n")  # a few bytes: the socket's buffer takes them at once
            stream.close()
        channel.stream_connected = False

    def report(self) -> None:
        """Write the counters without blocking (a slow reader must never stop the beats)."""
        if not self.unsent:
            self.unsent = (json.dumps({
                "late_ticks": self.late_ticks, "max_late_ms": round(1000 * self.max_late_s, 3),
                "reports_skipped": self.reports_skipped,
                "servers": {server: channel.counts for server, channel in self.channels.items()}
            }) + "\n").encode()
        else:
            self.reports_skipped += 1
            logger.warning("counters not read by the agents' process; report skipped")
        try:
            written = os.write(self.reports.fileno(), self.unsent)
        except BlockingIOError:
            return
        self.unsent = self.unsent[written:]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the heartbeat process (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-s", type=float, default=0.02)
    options = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("UNDERSTUDY_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s sim-heartbeats %(levelname)s %(message)s",
                        stream=sys.stderr)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PUMP_NICE)
    gc.disable()  # nothing here makes cycles; a collection would only be a pause
    os.set_blocking(sys.stdin.fileno(), False)
    os.set_blocking(sys.stdout.fileno(), False)
    sender = _Sender(options.interval_s, sys.stdin, sys.stdout)
    sender.report()  # the "ready" line
    with contextlib.suppress(KeyboardInterrupt):
        sender.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
