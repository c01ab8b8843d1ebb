"""Pre-forked spare workers of the torch runtime: a model load does not wait for a fork.

Forking the runtime (torch imported, about 235 MB resident) cost the runtime ~5.5 ms of CPU
per worker on this machine (less since its heap is in huge pages, ``model_repo.huge_pages``),
and the runtime forks one worker at a time. A failover sends a
server all its interim loads at once, so the third load waited for two forks before its own.
The pool keeps ``target`` idle forked processes; a spawn request is handed to one of them,
together with the requesting connection's file descriptor (``SCM_RIGHTS`` over a private
socket pair), and the spare becomes that model's worker. Spares are forked again only once no
request has come for ``refill_delay_s``, so the forks do not compete with the loads of a burst.

An idle spare costs its page tables and little else (the runtime's heap is frozen before any
fork, see ``runtime._prepare_for_forks``). It exits when its socket to the runtime closes,
i.e. when the runtime exits or dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SPARES = 3
"""Spares kept ready: one per Triton model-load thread of the agent's default configuration."""
REFILL_DELAY_S = 0.25
"""Quiet time after the last spawn request before missing spares are forked again."""

ServeFn = Callable[[socket.socket, dict[str, Any]], None]
"""Runs a worker on a connection for a spawn request (never returns into the runtime)."""
RecvFrameFn = Callable[[socket.socket], tuple[dict[str, Any], bytearray]]
SendFrameFn = Callable[[socket.socket, dict[str, Any]], None]


@dataclass
class _Spare:
    pid: int
    control: socket.socket
    """The runtime's end of the spare's private socket pair."""


class SparePool:
    """Idle forked workers waiting for a spawn request (single-threaded runtime only)."""

    def __init__(self, target: int, serve: ServeFn, send_frame: SendFrameFn,
                 recv_frame: RecvFrameFn, close_in_child: Callable[[], None],
                 refill_delay_s: float = REFILL_DELAY_S) -> None:
        if target < 0:
            raise ValueError("the number of spares cannot be negative")
        self.target = target
        self._serve = serve
        self._send_frame = send_frame
        self._recv_frame = recv_frame
        self._close_in_child = close_in_child
        self._refill_delay_s = refill_delay_s
        self._spares: deque[_Spare] = deque()
        self._last_request = 0.0

    @property
    def pids(self) -> list[int]:
        """Process ids of the idle spares."""
        return [spare.pid for spare in self._spares]

    def control_sockets(self) -> list[socket.socket]:
        """The runtime's ends of the spares' sockets (a forked child must close them)."""
        return [spare.control for spare in self._spares]

    def hand_over(self, conn: socket.socket, request: dict[str, Any]) -> int | None:
        """Give ``conn`` and its spawn request to a spare; its pid, or None if none took it.

        The caller still owns ``conn`` and closes its copy either way.
        """
        self._last_request = time.monotonic()
        while self._spares:
            spare = self._spares.popleft()
            try:
                socket.send_fds(spare.control, [b"\x01"], [conn.fileno()])
                self._send_frame(spare.control, request)
            except OSError as exc:  # it died idle: try the next one
                logger.warning("spare worker %d is gone (%s)", spare.pid, exc)
                spare.control.close()
                continue
            spare.control.close()  # the spare is a worker now; its socket is no longer needed
            return spare.pid
        return None

    def refill_in(self) -> float | None:
        """Seconds until a missing spare may be forked (0: now); None when the pool is full."""
        if len(self._spares) >= self.target:
            return None
        return max(0.0, self._last_request + self._refill_delay_s - time.monotonic())

    def refill(self) -> None:
        """Fork every missing spare (call when :meth:`refill_in` says 0)."""
        while len(self._spares) < self.target:
            self._spares.append(self._fork())

    def forget(self, pid: int) -> bool:
        """Drop a spare that exited (reaped by the runtime); whether it was one."""
        for spare in list(self._spares):
            if spare.pid == pid:
                self._spares.remove(spare)
                spare.control.close()
                return True
        return False

    def close(self) -> None:
        """Stop every idle spare (they exit on their socket's end of file)."""
        while self._spares:
            spare = self._spares.popleft()
            spare.control.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare.pid, signal.SIGKILL)

    def fork_worker(self, conn: socket.socket, request: dict[str, Any]) -> int:
        """Fork a worker for ``conn`` now (no spare was left); its pid."""
        return self._fork_child(lambda: self._serve(conn, request))

    def _fork(self) -> _Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = self._fork_child(lambda: self._wait_and_serve(theirs), close=(ours,))
        theirs.close()
        return _Spare(pid=pid, control=ours)

    def _fork_child(self, body: Callable[[], None],
                    close: tuple[socket.socket, ...] = ()) -> int:
        """Fork a child that runs ``body`` and exits; the child's pid.

        The child first drops the runtime's sockets and signal handlers, and it never returns
        into the runtime's loop.
        """
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for sock in (*close, *self.control_sockets()):
                    sock.close()
                self._close_in_child()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                body()
            except BaseException:  # noqa: BLE001 - never return into the runtime's loop
                code = 1
            os._exit(code)
        return pid

    def _wait_and_serve(self, control: socket.socket) -> None:
        """In the spare: block until handed a connection, then become its worker."""
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not fds:
            return  # end of file: the runtime is gone or stopped us
        conn = socket.socket(fileno=fds[0])
        request, _ = self._recv_frame(control)
        control.close()
        self._serve(conn, request)
