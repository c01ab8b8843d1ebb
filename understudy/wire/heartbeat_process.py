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

The agent drives it with one line per command on its stdin: ``channel HOST PORT SLOT NONCE
INTERVAL_S`` (beat there from now on), ``pause`` (the connection closed), ``triton 0|1``,
``interval S``, ``tick``, ``exit``.
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

    def channel(self, host: str, port: int, slot: int, nonce: int, interval_s: float) -> None:
        """Beat to ``host:port`` with this connection's slot and nonce."""
        self._send(f"channel {host} {port} {slot} {nonce} {interval_s!r}")

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

    def apply(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        op = parts[0]
        if op == "channel":
            host, port, slot, nonce, interval = parts[1:6]
            self.close_socket()
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_DGRAM)
            self.sock.connect((host, int(port)))
            self.sock.setblocking(False)
            self.slot, self.nonce = int(slot), int(nonce)
            self.interval_s = float(interval)
            self.due = time.monotonic()
        elif op == "pause":
            self.close_socket()
        elif op == "triton":
            self.flags = FLAG_TRITON_ALIVE if parts[1] == "1" else 0
        elif op == "interval":
            self.interval_s = max(0.001, float(parts[1]))
        elif op == "tick":
            self.last_tick = time.monotonic()
        elif op == "exit":
            self.running = False

    def close_socket(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None

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
            watched: list[object] = [fd] + ([self.sock] if self.sock is not None else [])
            readable, _, _ = select.select(watched, [], [], self.due - now)
            if fd in readable:
                self.read_commands(fd)
            if self.sock is not None and self.sock in readable:
                self.answer_probes()


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
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    _Beater().run(sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
