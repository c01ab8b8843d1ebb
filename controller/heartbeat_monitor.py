"""The heartbeat monitor: a small process beside the controller that receives and times heartbeats.

``python -m controller.heartbeat_monitor --host H --port P`` binds the UDP heartbeat port and runs
one ``selectors`` loop: it reads every pending datagram (``understudy.wire.heartbeat``), feeds the
:class:`~controller.suspicion.SuspicionTable`, sweeps it every few milliseconds, sends PROBE
datagrams and Triton readiness probes to suspects, and reports to the controller only what
matters: declarations, servers alive again, and once a second its counters.

Each agent's heartbeat process also keeps a TCP **liveness stream** open to the monitor (``hello
SLOT NONCE``, then ``bye`` when it stops on purpose). A stream that closes without ``bye`` means
the agent's processes died: an immediate signal, declared at once like a closed websocket, and
usually seen first, because the heartbeat process is the smallest of the server's processes and
runs at raised priority, so it is the first to finish dying when a box or a site is killed.

It runs in its own process so that the controller's event loop (plans, events, API calls) never
delays a heartbeat's timing and the heartbeats never take that loop's CPU or GIL; it asks for a
raised priority (root only). It talks to the controller over its stdin and stdout, one JSON
object per line; stdin closing (the controller died) ends it.

Controller -> monitor: ``admit`` (server, slot, nonce, triton "host:port"), ``watch`` (server,
generation, grace_s), ``unwatch``, ``forget``, ``false_alarm`` (server), ``configure``
(settings).  Monitor -> controller: ``ready`` (port), ``declare`` (server, generation, reason,
silent_s, last_seen wall time), ``alive`` (server), ``stats`` (counters).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import selectors
import socket
import sys
import time
from dataclasses import asdict, fields
from typing import Any

from controller.suspicion import Declaration, ServerWatch, SuspicionSettings, SuspicionTable
from understudy.wire.heartbeat import DATAGRAM_SIZE, MAGIC, VERSION, Kind, encode, unpack_from
from understudy.wire.priority import raise_priority

logger = logging.getLogger(__name__)

STATS_EVERY_S = 1.0
RECEIVE_BUFFER = 8 * 1024 * 1024
MONITOR_NICE = -10
BATCH_S = 0.002
_BEAT, _ACK = int(Kind.BEAT), int(Kind.ACK)


class _TritonProbe:
    """One non-blocking ``GET /v2/health/ready`` to a suspect's Triton."""

    def __init__(self, server_id: str, address: tuple[str, int]) -> None:
        self.server_id = server_id
        self.address = address
        self.sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET,
                                  socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sent = False
        self.reply = b""

    def start(self) -> bool:
        """Begin connecting; False when that failed at once (nothing listens, no route)."""
        code = self.sock.connect_ex(self.address)
        return code in (0, errno.EINPROGRESS, errno.EWOULDBLOCK)

    def on_event(self, mask: int) -> bool | None:
        """Progress on readiness; True/False when the probe has its answer, None to go on."""
        if mask & selectors.EVENT_WRITE and not self.sent:
            if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                return False
            host, port = self.address
            self.sock.send(f"GET /v2/health/ready HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n"
                           .encode())
            self.sent = True
            return None
        if mask & selectors.EVENT_READ:
            chunk = self.sock.recv(256)
            self.reply += chunk
            if b"\r\n" in self.reply or not chunk:
                status = self.reply.split(b" ", 2)
                return len(status) > 1 and status[1] == b"200"
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _parse_endpoint(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return None


class _Stream:
    """One agent heartbeat process's liveness stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        self.slot: int | None = None
        self.nonce = 0
        self.said_bye = False

    def feed(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == b"hello" and self.slot is None:
                with contextlib.suppress(ValueError):
                    self.slot, self.nonce = int(parts[1]), int(parts[2])
            elif parts == [b"bye"]:
                self.said_bye = True
        if len(self.pending) > 1024:
            self.pending = b""  # not our protocol; the nonce check still guards


class Monitor:
    """The monitor's loop and its I/O (see the module docstring)."""

    def __init__(self, sock: socket.socket, settings: SuspicionSettings,
                 commands: Any, reports: Any, listener: socket.socket | None = None) -> None:
        self.sock = sock
        self.table = SuspicionTable(settings)
        self.commands = commands
        self.reports = reports
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ, "udp")
        self.selector.register(commands, selectors.EVENT_READ, "commands")
        if listener is not None:
            self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.listener = listener
        self.streams_lost = 0
        self.probes: dict[str, _TritonProbe] = {}
        self.buffer = bytearray(DATAGRAM_SIZE + 1)
        self.pending_input = b""
        self.heartbeats = 0
        self.acks = 0
        self.rejected = 0
        self.declarations = 0
        self.running = True

    def report(self, message: dict[str, Any]) -> None:
        self.reports.write(json.dumps(message) + "\n")
        self.reports.flush()

    def run(self) -> None:
        """Loop until stdin closes."""
        next_sweep = time.monotonic()
        next_stats = next_sweep + STATS_EVERY_S
        while self.running:
            timeout = max(0.0, next_sweep - time.monotonic())
            received = False
            for key, mask in self.selector.select(timeout):
                if key.data == "udp":
                    self.receive(time.monotonic())
                    received = True
                elif key.data == "commands":
                    self.read_commands()
                elif key.data == "accept":
                    self.accept()
                elif isinstance(key.data, _Stream):
                    self.read_stream(key.data)
                else:
                    self.progress_probe(key.data, mask)
            now = time.monotonic()
            if now >= next_sweep:
                self.receive(now)  # nothing already in the socket is mistaken for silence
                self.sweep(now)
                next_sweep = now + self.table.settings.sweep_s
            if received and next_sweep - now > BATCH_S:
                # Let datagrams gather for a moment instead of waking for each one: a thousand
                # servers send fifty thousand a second, and each wake-up costs more than the
                # datagram. Arrival times are then accurate to BATCH_S, far below T.
                time.sleep(BATCH_S)
            if now >= next_stats:
                next_stats = now + STATS_EVERY_S
                self.report({"op": "stats", **self.counters()})

    def counters(self) -> dict[str, Any]:
        """What the controller exports as metrics."""
        return {"heartbeats": self.heartbeats, "acks": self.acks, "rejected": self.rejected,
                "suspicions": self.table.suspicions, "cleared": self.table.cleared,
                "declarations": self.declarations, "streams_lost": self.streams_lost,
                "cpu_s": time.process_time(),
                "servers": len(self.table.by_slot)}

    def receive(self, now: float) -> None:
        """Handle every datagram waiting in the socket (the hot path: no allocation but one)."""
        table, buffer, sock = self.table, self.buffer, self.sock
        by_slot, add_gap = table.by_slot, table.add_gap
        beats = 0
        try:
            while True:
                try:
                    size, address = sock.recvfrom_into(buffer)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    continue  # e.g. an ICMP error queued for an earlier probe
                if size != DATAGRAM_SIZE:
                    self.rejected += 1
                    continue
                magic, version, kind, flags, slot, nonce, _seq, _sent = unpack_from(buffer)
                if magic != MAGIC or version != VERSION:
                    self.rejected += 1
                elif kind == _BEAT:
                    beats += 1
                    watch = by_slot.get(slot)
                    if watch is not None and watch.nonce == nonce and watch.armed and \
                            watch.beats and watch.suspect_since is None:
                        # The usual beat, inlined: SuspicionTable.beat does the same.
                        watch.address = address
                        watch.beats += 1
                        add_gap(watch, now - watch.last_arrival)
                        watch.last_arrival = now
                        continue
                    revived = table.beat(slot, nonce, bool(flags & 1), address, now)
                    if revived is not None:
                        self.report({"op": "alive", "server": revived})
                elif kind == _ACK:
                    self.acks += 1
                    table.ack(slot, nonce, now)
                else:
                    self.rejected += 1
        finally:
            self.heartbeats += beats

    def accept(self) -> None:
        assert self.listener is not None  # noqa: S101 - registered only with one
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError, OSError):
            return
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, _Stream(conn))

    def read_stream(self, stream: _Stream) -> None:
        try:
            data = stream.sock.recv(256)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset: as good as closed
        if data:
            known = stream.slot is not None
            stream.feed(data)
            if not known and stream.slot is not None:
                self.table.stream_opened(stream.slot, stream.nonce)
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(stream.sock)
        stream.sock.close()
        if stream.said_bye or stream.slot is None:
            return
        # Heartbeats the agent sent before it died may still wait in the socket (this loop
        # can see the close first): they count as what they are, beats before the death.
        self.receive(time.monotonic())
        declaration = self.table.stream_closed(stream.slot, stream.nonce, time.monotonic())
        if declaration is not None:
            self.streams_lost += 1
            self.declare(declaration)

    def declare(self, declaration: Declaration) -> None:
        self.declarations += 1
        self.cancel_probe(declaration.server_id)
        self.report({"op": "declare", "server": declaration.server_id,
                     "generation": declaration.generation, "reason": declaration.reason,
                     "silent_s": declaration.silent_s,
                     "last_seen": time.time() - declaration.silent_s, "at": time.time()})

    def sweep(self, now: float) -> None:
        result = self.table.sweep(now)
        for watch in result.probes:
            self.send_probe(watch)
        for watch in result.triton_probes:
            self.start_triton_probe(watch)
        for declaration in result.declarations:
            self.declare(declaration)
        for server_id in result.suspected:
            logger.info("suspecting %s; probing", server_id)

    def send_probe(self, watch: ServerWatch) -> None:
        if watch.address is None:
            return
        with contextlib.suppress(OSError):
            self.sock.sendto(encode(Kind.PROBE, watch.slot, watch.nonce, watch.probe_seq,
                                    time.time()), watch.address)

    def start_triton_probe(self, watch: ServerWatch) -> None:
        if watch.triton is None or watch.server_id in self.probes:
            return
        probe = _TritonProbe(watch.server_id, watch.triton)
        if not probe.start():
            probe.close()
            self.table.triton_result(watch.server_id, False)
            return
        self.probes[watch.server_id] = probe
        self.selector.register(probe.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, probe)

    def progress_probe(self, probe: _TritonProbe, mask: int) -> None:
        try:
            answer = probe.on_event(mask)
        except OSError:
            answer = False
        if answer is None:
            if probe.sent:
                self.selector.modify(probe.sock, selectors.EVENT_READ, probe)
            return
        self.table.triton_result(probe.server_id, answer)
        self.cancel_probe(probe.server_id)

    def cancel_probe(self, server_id: str) -> None:
        probe = self.probes.pop(server_id, None)
        if probe is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(probe.sock)
            probe.close()

    def read_commands(self) -> None:
        try:
            chunk = os.read(self.commands.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.running = False  # the controller is gone
            return
        self.pending_input += chunk
        *lines, self.pending_input = self.pending_input.split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    self.apply(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    logger.error("bad command from the controller: %s (%r)", exc, line[:200])

    def apply(self, command: dict[str, Any]) -> None:
        """One command from the controller."""
        op = command["op"]
        table, now = self.table, time.monotonic()
        if op == "admit":
            table.admit(command["server"], int(command["slot"]), int(command["nonce"]),
                        _parse_endpoint(command.get("triton")))
        elif op == "watch":
            table.watch(command["server"], int(command["generation"]),
                        float(command["grace_s"]), now)
        elif op == "unwatch":
            table.unwatch(command["server"])
            self.cancel_probe(command["server"])
        elif op == "forget":
            table.forget(command["server"])
            self.cancel_probe(command["server"])
        elif op == "false_alarm":
            table.false_alarm(command["server"], now)
        elif op == "configure":
            known = {f.name for f in fields(SuspicionSettings)}
            update = {k: float(v) for k, v in command["settings"].items() if k in known}
            table.configure(SuspicionSettings(**{**asdict(table.settings), **update}))
        else:
            raise KeyError(f"unknown op {op!r}")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the controller dies (stdin EOF covers the rest)."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _listen(family: int, host: str, port: int) -> socket.socket:
    """The liveness streams' TCP listener: on the UDP port's number when it is free."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.bind((host, 0))
    listener.listen(1024)
    listener.setblocking(False)
    return listener


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--settings", default="{}", help="SuspicionSettings as JSON")
    options = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("UNDERSTUDY_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s heartbeat-monitor %(levelname)s %(message)s",
                        stream=sys.stderr)
    _die_with_parent()
    logger.info("scheduling: %s", raise_priority(MONITOR_NICE))
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # root may exceed net.core.rmem_max: room for a stall's worth of datagrams
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE,  # type: ignore[attr-defined]
                        RECEIVE_BUFFER)
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind((options.host, options.port))
    sock.setblocking(False)
    listener = _listen(family, options.host, sock.getsockname()[1])
    os.set_blocking(sys.stdin.fileno(), False)
    settings = SuspicionSettings(**json.loads(options.settings))
    monitor = Monitor(sock, settings, sys.stdin, sys.stdout, listener)
    monitor.report({"op": "ready", "port": sock.getsockname()[1],
                    "tcp_port": listener.getsockname()[1], "pid": os.getpid()})
    try:
        monitor.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
