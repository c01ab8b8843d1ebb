"""The agent's heartbeat process: a tiny child that beats and answers probes, free of the GIL.

A heartbeat thread inside the agent shares the agent's GIL: while the agent's loop or one of its
worker threads holds it (a load's bookkeeping, a big JSON frame, a C call that does not release
it), the thread cannot send, and on a busy 2-core box that silence reached 100-200 ms, long
enough to look like a stopped server. A separate process has no such wait. It is started once
per agent with ``python -m understudy.wire.heartbeat_process`` (standard library only, so it
starts in milliseconds), at raised priority where permitted, in the agent's process group.

It shares the agent's fate:

* it is killed with the agent (``PR_SET_PDEATHSIG``; and it exits when its stdin closes);
* a signal to the agent's process group (SIGSTOP of the box, SIGKILL) reaches it too;
* the agent's event loop sends ``tick`` every :data:`TICK_S`; after :data:`HANG_S` without one
  the agent is hung and the process stops beating and answering probes, so the server is
  suspected and, unless its Triton still answers, declared.

It also keeps a TCP **liveness stream** to the controller's heartbeat monitor (``hello SLOT
NONCE``, and ``bye`` before it closes the stream on purpose): when the agent's processes are
killed, this small, high-priority process is usually the first to finish dying, and the stream's
close without ``bye`` is an immediate signal, like the websocket's.

The agent drives it with one line per command on its stdin: ``channel HOST PORT SLOT NONCE
INTERVAL_S [TCP_PORT]`` (beat there from now on), ``pause`` (the connection closed), ``triton
0|1``, ``interval S``, ``tick``, ``exit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import time

from understudy.wire.heartbeat import FLAG_TRITON_ALIVE, DatagramError, Kind, decode, encode
from understudy.wire.priority import raise_priority

logger = logging.getLogger(__name__)

TICK_S = 0.5
HANG_S = 5.0
NICE = -10


class HeartbeatProcess:
    """The agent's handle on its heartbeat child process."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HeartbeatProcess:
        """Start the child (idempotent)."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(  # noqa: S603 - our own module
                [sys.executable, "-m", "understudy.wire.heartbeat_process"],
                stdin=subprocess.PIPE, close_fds=True)
        return self

    def _send(self, line: str) -> None:
        process = self.process
        if process is None or process.stdin is None:
            return
        try:
            process.stdin.write((line + "\n").encode())
            process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            logger.error("the heartbeat process is gone; restarting it")
            self.process = None
            self.start()

    def channel(self, host: str, port: int, slot: int, nonce: int, interval_s: float,
                tcp_port: int | None = None) -> None:
        """Beat to ``host:port`` with this connection's slot and nonce.

        With ``tcp_port``, also keep a liveness stream to ``host:tcp_port``.
        """
        self._send(f"channel {host} {port} {slot} {nonce} {interval_s!r} {tcp_port or 0}")

    def pause(self) -> None:
        """Stop beating (the connection is gone; the next one brings a new channel)."""
        self._send("pause")

    def triton(self, alive: bool) -> None:
        """Whether the heartbeats say Triton is alive."""
        self._send(f"triton {int(alive)}")

    def interval(self, seconds: float) -> None:
        """A new heartbeat interval."""
        self._send(f"interval {seconds!r}")

    def tick(self) -> None:
        """The agent's loop is running (see :data:`HANG_S`)."""
        self._send("tick")

    def close(self) -> None:
        """Stop the child and wait for it."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            assert process.stdin is not None  # noqa: S101 - piped
            process.stdin.write(b"exit\n")
            process.stdin.close()
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _Beater:
    """The child's state and loop."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.slot = 0
        self.nonce = 0
        self.interval_s = 0.02
        self.flags = FLAG_TRITON_ALIVE
        self.last_tick = time.monotonic()
        self.seq = 0
        self.due = time.monotonic()
        self.pending = b""
        self.running = True
        self.stream: socket.socket | None = None
        self.stream_address: tuple[str, int] | None = None
        self.stream_retry_at = 0.0

    def apply(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        op = parts[0]
        if op == "channel":
            host, port, slot, nonce, interval = parts[1:6]
            tcp_port = int(parts[6]) if len(parts) > 6 else 0
            self.close_socket()
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_DGRAM)
            self.sock.connect((host, int(port)))
            self.sock.setblocking(False)
            self.slot, self.nonce = int(slot), int(nonce)
            self.interval_s = float(interval)
            self.due = time.monotonic()
            self.stream_address = (host, tcp_port) if tcp_port else None
            self.open_stream()
        elif op == "pause":
            self.close_socket()
        elif op == "triton":
            self.flags = FLAG_TRITON_ALIVE if parts[1] == "1" else 0
        elif op == "interval":
            self.interval_s = max(0.001, float(parts[1]))
        elif op == "tick":
            self.last_tick = time.monotonic()
        elif op == "exit":
            self.close_socket()
            self.running = False

    def close_socket(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None
        self.close_stream(goodbye=True)
        self.stream_address = None

    def open_stream(self) -> None:
        """Connect the liveness stream; a failure is retried a second later.

        Blocking, briefly: the monitor is local to the controller and accepts at once.
        """
        if self.stream_address is None or self.stream is not None:
            return
        host, port = self.stream_address
        try:
            stream = socket.create_connection((host, port), timeout=1.0)
            stream.sendall(f"hello {self.slot} {self.nonce}\n".encode())
        except OSError:
            self.stream_retry_at = time.monotonic() + 1.0
            return
        stream.setblocking(False)
        self.stream = stream

    def close_stream(self, goodbye: bool) -> None:
        stream, self.stream = self.stream, None
        if stream is None:
            return
        with contextlib.suppress(OSError):
            if goodbye:
                stream.setblocking(True)
                stream.settimeout(0.5)
                stream.sendall(b"bye\n")
            stream.close()

    def stream_event(self) -> None:
        """The monitor closed the stream (it restarted): connect again a moment later."""
        assert self.stream is not None  # noqa: S101 - only called when selected
        try:
            data = self.stream.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close_stream(goodbye=False)
            self.stream_retry_at = time.monotonic() + 0.2

    def hung(self) -> bool:
        return time.monotonic() - self.last_tick > HANG_S

    def send(self, kind: Kind, seq: int) -> None:
        if self.sock is None:
            return
        with contextlib.suppress(OSError):  # e.g. ECONNREFUSED for an earlier datagram
            self.sock.send(encode(kind, self.slot, self.nonce, seq, time.time(), self.flags))

    def read_commands(self, fd: int) -> None:
        chunk = os.read(fd, 4096)
        if not chunk:
            self.running = False  # the agent is gone
            return
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            try:
                self.apply(line.decode())
            except (ValueError, IndexError, OSError) as exc:
                logger.error("bad heartbeat command %r: %s", line[:100], exc)

    def answer_probes(self) -> None:
        while self.sock is not None:
            try:
                data = self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                datagram = decode(data)
            except DatagramError:
                continue
            if datagram.kind is Kind.PROBE and datagram.nonce == self.nonce and not self.hung():
                self.send(Kind.ACK, datagram.seq)

    def run(self, fd: int) -> None:
        while self.running:
            now = time.monotonic()
            if now >= self.due:
                if now - self.due > self.interval_s:
                    self.due = now  # resume the schedule instead of bursting
                if not self.hung():
                    self.send(Kind.BEAT, self.seq)
                    self.seq += 1
                self.due += self.interval_s
                continue
            if self.stream is None and self.stream_address is not None and \
                    now >= self.stream_retry_at and not self.hung():
                self.open_stream()
            watched: list[int | socket.socket] = [fd] + [
                s for s in (self.sock, self.stream) if s is not None]
            readable, _, _ = select.select(watched, [], [], self.due - now)
            if fd in readable:
                self.read_commands(fd)
            if self.sock is not None and self.sock in readable:
                self.answer_probes()
            if self.stream is not None and self.stream in readable:
                self.stream_event()


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main() -> int:
    """The child's entry point."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s heartbeat %(levelname)s %(message)s")
    _die_with_parent()
    if os.getppid() == 1:
        return 0  # the agent died before the death signal was armed
    raise_priority(NICE)
    _Beater().run(sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
