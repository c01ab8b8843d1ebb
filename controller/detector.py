"""Failure detector: immediate signals here, heartbeat timing in the monitor process.

Two kinds of evidence, two paths:

* **Crashes are immediate signals**, handled on the controller's loop: the agent's websocket
  closing (:meth:`FailureDetector.connection_closed`) and the agent's own report that its Triton
  died (:meth:`FailureDetector.declare`). No waiting: a dead process cannot send anything more.
* **A dead agent's heartbeat process** closes its TCP liveness stream to the monitor without a
  goodbye: also immediate, declared by the monitor (usually before the websocket closes).
* **Silence is a suspicion**, judged by the heartbeat monitor (``controller.heartbeat_monitor``,
  a separate process reading UDP heartbeats): phi-accrual over each server's own inter-arrival
  distribution, then probes of the agent and of its Triton, and only then a declaration, which
  comes back here (``controller.suspicion`` has the rule). Slow is not dead.

This class owns the monitor process (started by :meth:`start`, restarted if it dies, with every
admitted server sent again), gives each agent connection its heartbeat channel
(:meth:`admit`), and calls the listeners once per declaration. A new :meth:`watch` (the agent's
next hello, or its revival) re-arms a server. Each watch has a generation number, so a
declaration the monitor made for an older watch is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from controller.suspicion import SuspicionSettings
from understudy.wire.heartbeat import new_nonce
from understudy.wire.protocol import HeartbeatChannel

logger = logging.getLogger(__name__)

FailureCallback = Callable[[str, str, float, float], None]
"""(server_id, reason, detected_at wall time, last sign of life wall time)."""
AliveCallback = Callable[[str], None]
"""A server declared failed sent a heartbeat (its Triton alive): it is back."""

MONITOR_START_TIMEOUT_S = 20.0
FALSE_ALARM_WINDOW_S = 1.0
"""A declared server heard from within this long was a false alarm (see false_alarm)."""
MONITOR_RESTART_GRACE_S = 1.0
"""After a monitor restart, how long every server has to be heard again."""


@dataclass
class MonitorStats:
    """The monitor's counters (cumulative since the controller started)."""

    heartbeats: int = 0
    acks: int = 0
    rejected: int = 0
    suspicions: int = 0
    cleared: int = 0
    declarations: int = 0
    streams_lost: int = 0
    cpu_s: float = 0.0
    servers: int = 0
    restarts: int = 0


@dataclass
class _Admission:
    slot: int
    nonce: int
    triton: str | None


class FailureDetector:
    """The controller's view of which servers are watched, and the monitor process."""

    def __init__(self, interval_s: float, misses: int, *listeners: FailureCallback,
                 host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None) -> None:
        self.interval_s = interval_s
        self.misses = misses
        self.listeners: list[FailureCallback] = list(listeners)
        """Called in order on each declaration (on the loop, synchronously)."""
        self.alive_listeners: list[AliveCallback] = []
        self.host, self.port, self.advertise_host = host, port, advertise_host
        self.tcp_port = 0
        self.stats = MonitorStats()
        self._base_stats = MonitorStats()
        self._watched: dict[str, int] = {}
        """Watched server -> the generation of its current watch."""
        self._declared_at: dict[str, float] = {}
        self._admitted: dict[str, _Admission] = {}
        self._slots: dict[str, int] = {}
        self._generation = 0
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

    # --- the monitor process ----------------------------------------------------------------

    def settings(self) -> SuspicionSettings:
        """The monitor's settings for the current T."""
        t = self.interval_s
        return SuspicionSettings(interval_s=t, confirm_s=2 * t, probe_every_s=0.6 * t,
                                 sweep_s=min(0.005, t / 4))

    async def start(self) -> None:
        """Start the monitor process and bind the heartbeat port (idempotent)."""
        if self._process is not None and self._process.returncode is None:
            return
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controller.heartbeat_monitor", "--host", self.host,
            "--port", str(self.port), "--settings", json.dumps(asdict(self.settings())),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None  # noqa: S101 - piped
        try:
            line = await asyncio.wait_for(process.stdout.readline(), MONITOR_START_TIMEOUT_S)
            ready = json.loads(line)
        except (TimeoutError, ValueError) as exc:
            process.kill()
            raise RuntimeError(f"the heartbeat monitor did not start: {exc!r}") from exc
        self.port = int(ready["port"])  # a restart binds the same port again
        self.tcp_port = int(ready["tcp_port"])
        self._process = process
        self._reader = asyncio.ensure_future(self._read_reports(process))
        logger.info("heartbeat monitor pid %s on udp %s:%d", ready.get("pid"), self.host,
                    self.port)

    async def _read_reports(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None  # noqa: S101 - piped
        while True:
            line = await process.stdout.readline()
            if not line:
                break
            try:
                self._on_report(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                logger.error("bad report from the heartbeat monitor: %s", exc)
        await process.wait()
        if self._stopping:
            return
        logger.error("heartbeat monitor exited (code %s); restarting it", process.returncode)
        self._base_stats = replace(self.stats, restarts=self.stats.restarts + 1)
        self._process = None
        await self.start()
        for server_id, admission in self._admitted.items():
            self._send_admit(server_id, admission)
        for server_id, generation in self._watched.items():
            self._send({"op": "watch", "server": server_id, "generation": generation,
                        "grace_s": max(MONITOR_RESTART_GRACE_S, 10 * self.interval_s)})

    def _on_report(self, report: dict[str, Any]) -> None:
        op = report["op"]
        if op == "declare":
            server_id = report["server"]
            if self._watched.get(server_id) != report["generation"]:
                return  # about an older watch
            logger.warning("server %s silent for %.0f ms and unanswered probes: %s", server_id,
                           report["silent_s"] * 1000, report["reason"])
            # Detected when the monitor decided, even if this loop was busy for a moment.
            self._declare(server_id, report["reason"], float(report["last_seen"]),
                          float(report.get("at", time.time())))
        elif op == "alive":
            server_id = report["server"]
            if server_id not in self._watched:
                for listener in self.alive_listeners:
                    listener(server_id)
        elif op == "stats":
            # The monitor's counters start at zero in each monitor process: add those of the
            # processes before it. ``servers`` is a level, not a count, and is taken as is.
            base = self._base_stats
            self.stats = MonitorStats(**{
                key: getattr(base, key) + report.get(key, 0)
                for key in asdict(base) if key not in ("restarts", "servers")},
                servers=report.get("servers", 0), restarts=base.restarts)

    def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            return  # re-sent in full when the monitor restarts
        with contextlib.suppress(ConnectionError, RuntimeError):
            process.stdin.write((json.dumps(message) + "\n").encode())

    def _send_admit(self, server_id: str, admission: _Admission) -> None:
        self._send({"op": "admit", "server": server_id, "slot": admission.slot,
                    "nonce": admission.nonce, "triton": admission.triton})

    # --- servers ----------------------------------------------------------------------------

    @property
    def timeout_s(self) -> float:
        """A bound on the silence before a declaration on a quiet server (start-up graces)."""
        return (self.misses + 0.5) * self.interval_s

    def configure(self, interval_s: float, misses: int) -> None:
        """New T and k; sent to the monitor at once."""
        self.interval_s, self.misses = interval_s, misses
        self._send({"op": "configure", "settings": asdict(self.settings())})

    def admit(self, server_id: str, triton_http: str | None) -> HeartbeatChannel:
        """A new connection of ``server_id``: the heartbeat channel its agent must use."""
        slot = self._slots.setdefault(server_id, len(self._slots) + 1)
        admission = _Admission(slot, new_nonce(), triton_http)
        self._admitted[server_id] = admission
        self._send_admit(server_id, admission)
        return HeartbeatChannel(port=self.port, tcp_port=self.tcp_port or None,
                                host=self.advertise_host, slot=slot,
                                nonce=admission.nonce,
                                heartbeat_interval_ms=self.interval_s * 1000.0)

    def watch(self, server_id: str, grace_s: float | None = None) -> None:
        """Start (or restart) watching a server; its first heartbeat is due within ``grace_s``."""
        self._generation += 1
        self._watched[server_id] = self._generation
        grace = grace_s if grace_s is not None else self.timeout_s
        self._send({"op": "watch", "server": server_id, "generation": self._generation,
                    "grace_s": grace})
        if server_id not in self._admitted:
            # The monitor knows only servers whose agent said hello (their heartbeat
            # channel); one that never does (killed while the controller was restarting) is
            # declared here when its grace runs out.
            with contextlib.suppress(RuntimeError):  # no loop: nobody to declare to
                asyncio.get_running_loop().call_later(
                    grace, self._no_hello, server_id, self._generation, time.time())

    def _no_hello(self, server_id: str, generation: int, since: float) -> None:
        if server_id in self._admitted or self._watched.get(server_id) != generation:
            return  # it said hello (the monitor watches it now), or was declared or forgotten
        logger.warning("server %s: no hello within %.1f s", server_id, time.time() - since)
        now = time.time()
        self._declare(server_id, "no hello since the controller started", since, now)

    def false_alarm(self, server_id: str) -> None:
        """A server declared failed was alive: the monitor is more patient with it a while.

        Only when it was heard from soon after the declaration: a server silent for longer
        (a box stopped for seconds) was a real outage for its clients too, and widening its
        suspicion would only slow the next real detection.
        """
        declared = self._declared_at.get(server_id)
        if declared is not None and time.monotonic() - declared > FALSE_ALARM_WINDOW_S:
            logger.info("%s is back after %.1f s of silence: an outage, not a false alarm",
                        server_id, time.monotonic() - declared)
            return
        logger.warning("false alarm on %s", server_id)
        self._send({"op": "false_alarm", "server": server_id})

    def connection_closed(self, server_id: str) -> None:
        """The agent's websocket closed: an immediate signal, declared at once.

        Frames are ordered on the connection, and a connection replaced by the same agent's new
        one does not come here (``AgentHub`` checks that the closed socket is still the
        server's).
        """
        self.declare(server_id, "connection closed")

    def declare(self, server_id: str, reason: str) -> None:
        """Declare the server failed now (e.g. its Triton died)."""
        now = time.time()
        self._declare(server_id, reason, now, now)

    def _declare(self, server_id: str, reason: str, last_seen: float,
                 detected_at: float) -> None:
        if self._watched.pop(server_id, None) is None:
            return
        if self._stopping:
            logger.info("server %s: %s while the controller stops; not declared", server_id,
                        reason)
            return
        self._declared_at[server_id] = time.monotonic()
        self._send({"op": "unwatch", "server": server_id})
        detected_at = min(detected_at, time.time())
        last_seen = min(last_seen, detected_at)
        for listener in self.listeners:
            listener(server_id, reason, detected_at, last_seen)

    def forget(self, server_id: str) -> None:
        """Stop watching (drained or deleted server)."""
        if self._watched.pop(server_id, None) is not None:
            self._send({"op": "unwatch", "server": server_id})

    def watching(self, server_id: str) -> bool:
        """Whether the server is watched (not declared failed since its last watch)."""
        return server_id in self._watched

    def shutting_down(self) -> None:
        """The controller is stopping: nothing is declared from now on.

        Its server closes every agent's connection before it stops (uvicorn's shutdown), and a
        failover begun then would be cut off half-way and resumed by the next controller, which
        watches every server again at its start anyway (``startup_reconcile``).
        """
        self._stopping = True

    async def stop(self) -> None:
        """Stop the monitor process and wait for it (its pipes closed with it)."""
        self._stopping = True
        self._watched.clear()
        process = self._process
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
