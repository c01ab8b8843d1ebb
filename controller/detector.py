"""Failure detector: one deadline per server, reset by each heartbeat (an event-driven timer).

A server is declared failed when no heartbeat arrived for ``misses`` intervals plus half an
interval of slack (so one late-but-arriving heartbeat is not a failure), when its agent's
connection closes, or when the agent reports its Triton dead (both immediate signals, declared
without the confirmation below). Each
declaration fires once; a new ``watch`` (the agent's next hello) re-arms the server.

The timeout adapts to each server, in the spirit of accrual failure detectors: it is the
larger of (k + 1/2) T and 1.5 times the largest heartbeat gap seen in the last 200 heartbeats,
times a penalty that doubles (up to 8x) each time a server declared failed turns out to be
alive and halves after 30 s without such a mistake. On a quiet server that is exactly
(k + 1/2) T; on a saturated one it stops the flapping that a fixed 50 ms produces, where each
false failover adds the load that causes the next. A crash is still seen at once: it closes
the agent's connection.

A deadline that fires is confirmed before it counts, because the controller itself can be the
slow one: a heartbeat may already sit in the socket while the event loop was busy (a warm-plan
solve, a burst of events). If the timer ran late by more than one interval, the loop was
stalled and the server gets one more interval; otherwise the declaration waits two loop turns
(``CONFIRM_S``) so frames already received are processed first. Both add at most a few
milliseconds to a real detection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CONFIRM_S = 0.002
GAP_WINDOW = 200
"""Heartbeat inter-arrival gaps remembered per server (4 s at T = 20 ms)."""
GAP_FACTOR = 1.5
"""The timeout is at least this multiple of the largest recent gap."""
MAX_PENALTY = 8.0
PENALTY_DECAY_S = 30.0

FailureCallback = Callable[[str, str, float, float], None]
"""(server_id, reason, detected_at wall time, last sign of life wall time)."""


@dataclass
class _Watch:
    handle: asyncio.TimerHandle | None
    last_seen: float
    """Wall time of the last heartbeat (or of the watch start)."""
    due: float = 0.0
    """Loop time of the current deadline."""
    fires_at: float = 0.0
    """Loop time the timer handle fires (<= due: a heartbeat only moves ``due``)."""
    stalls: int = 0
    confirming: bool = False
    """The deadline passed and the declaration waits CONFIRM_S (a heartbeat cancels it)."""


class _GapWindow:
    """The last ``size`` heartbeat gaps and their maximum, in O(1) amortised per gap.

    A heartbeat arrives every T per server (300 a second for six agents at T = 20 ms): taking
    ``max`` over 200 gaps on each was a sixth of the controller's heartbeat CPU.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.count = 0
        self._peaks: deque[tuple[int, float]] = deque()  # (index, gap), gaps decreasing

    def add(self, gap: float) -> None:
        """Record one gap (the oldest leaves the window once it is full)."""
        while self._peaks and self._peaks[-1][1] <= gap:
            self._peaks.pop()
        self._peaks.append((self.count, gap))
        self.count += 1
        if self._peaks[0][0] <= self.count - 1 - self.size:
            self._peaks.popleft()

    def max(self) -> float:
        """The largest gap in the window (0.0 when empty)."""
        return self._peaks[0][1] if self._peaks else 0.0


class FailureDetector:
    """Deadlines per server on the running event loop."""

    def __init__(self, interval_s: float, misses: int,
                 *listeners: FailureCallback) -> None:
        self.interval_s = interval_s
        self.misses = misses
        self.listeners: list[FailureCallback] = list(listeners)
        """Called in order on each declaration (on the loop, synchronously)."""
        self._watches: dict[str, _Watch] = {}
        self._gaps: dict[str, _GapWindow] = {}
        self._last_beat: dict[str, float] = {}
        self._penalty: dict[str, tuple[float, float]] = {}

    @property
    def timeout_s(self) -> float:
        """Silence after which a server is declared failed."""
        return (self.misses + 0.5) * self.interval_s

    def configure(self, interval_s: float, misses: int) -> None:
        """New T and k; applied at each server's next heartbeat."""
        self.interval_s, self.misses = interval_s, misses

    def watch(self, server_id: str, grace_s: float | None = None) -> None:
        """Start (or restart) watching a server; the first deadline is ``grace_s`` away."""
        self._last_beat.pop(server_id, None)  # a gap across a reconnection is not jitter
        self._arm(server_id, grace_s if grace_s is not None else self.timeout_for(server_id),
                  time.time())

    def timeout_for(self, server_id: str) -> float:
        """The current silence limit of one server (see the module docstring)."""
        gaps = self._gaps.get(server_id)
        base = max(self.timeout_s, GAP_FACTOR * gaps.max()) if gaps else self.timeout_s
        penalty, since = self._penalty.get(server_id, (1.0, 0.0))
        now = time.monotonic()
        if penalty > 1.0 and now - since > PENALTY_DECAY_S:
            penalty = max(1.0, penalty / 2)
            self._penalty[server_id] = (penalty, now)
        return base * penalty

    def false_alarm(self, server_id: str) -> None:
        """A server declared failed was alive: be more patient with it for a while."""
        penalty, _ = self._penalty.get(server_id, (1.0, 0.0))
        penalty = min(MAX_PENALTY, penalty * 2)
        self._penalty[server_id] = (penalty, time.monotonic())
        logger.warning("false alarm on %s; its timeout is now %.0f ms", server_id,
                       self.timeout_for(server_id) * 1000)

    def beat(self, server_id: str) -> None:
        """A heartbeat arrived: record the gap and push the deadline out.

        The timer is not re-armed: only the deadline moves, and the timer, when it fires
        before the deadline, re-arms itself for it (one timer per timeout, not two heap
        operations per heartbeat).
        """
        now = time.monotonic()
        last = self._last_beat.get(server_id)
        self._last_beat[server_id] = now
        if last is not None:
            self._gaps.setdefault(server_id, _GapWindow(GAP_WINDOW)).add(now - last)
        watch = self._watches.get(server_id)
        if watch is None:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + self.timeout_for(server_id)
        if watch.confirming or due < watch.fires_at:
            # A declaration already confirming, or a shorter timeout than the armed one.
            self._arm(server_id, due - loop.time(), time.time())
            return
        watch.due, watch.last_seen, watch.stalls = due, time.time(), 0

    def connection_closed(self, server_id: str) -> None:
        """The agent's websocket closed: an immediate signal, declared at once.

        No confirmation wait: frames are ordered on the connection, so every heartbeat sent
        before the close was handled before the close was seen, and a connection replaced by
        the same agent's new one does not come here (``AgentHub`` checks that the closed socket
        is still the server's).
        """
        self.declare(server_id, "connection closed")

    def declare(self, server_id: str, reason: str) -> None:
        """Declare the server failed now (e.g. its Triton died)."""
        watch = self._watches.pop(server_id, None)
        if watch is None:
            return
        if watch.handle is not None:
            watch.handle.cancel()
        detected_at = time.time()
        for listener in self.listeners:
            listener(server_id, reason, detected_at, watch.last_seen)

    def forget(self, server_id: str) -> None:
        """Stop watching (drained or deleted server)."""
        watch = self._watches.pop(server_id, None)
        if watch is not None and watch.handle is not None:
            watch.handle.cancel()

    def watching(self, server_id: str) -> bool:
        """Whether a deadline is armed for the server."""
        return server_id in self._watches

    def _arm(self, server_id: str, delay_s: float, last_seen: float,
             why: str = "missed heartbeats") -> None:
        loop = asyncio.get_running_loop()
        watch = self._watches.get(server_id)
        if watch is not None and watch.handle is not None:
            watch.handle.cancel()
        due = loop.time() + delay_s
        watch = _Watch(None, last_seen, due, due)
        watch.handle = loop.call_at(due, self._expired, server_id, watch, why)
        self._watches[server_id] = watch

    def _expired(self, server_id: str, watch: _Watch, why: str) -> None:
        loop = asyncio.get_running_loop()
        if self._watches.get(server_id) is not watch:
            return  # re-armed meanwhile
        if loop.time() < watch.due:  # heartbeats moved the deadline: wait for it
            watch.fires_at = watch.due
            watch.handle = loop.call_at(watch.due, self._expired, server_id, watch, why)
            return
        late = loop.time() - watch.due
        if late > self.interval_s and watch.stalls < 3:
            watch.stalls += 1
            logger.warning("detector for %s ran %.0f ms late (controller stalled); "
                           "extending its deadline", server_id, late * 1000)
            watch.due = watch.fires_at = loop.time() + self.interval_s
            watch.handle = loop.call_at(watch.due, self._expired, server_id, watch, why)
            return
        watch.confirming = True  # a heartbeat now re-arms (see beat)
        watch.handle = loop.call_later(CONFIRM_S, self._confirm, server_id, watch, why)

    def _confirm(self, server_id: str, watch: _Watch, why: str) -> None:
        if self._watches.get(server_id) is watch:
            self.declare(server_id, why)

    def stop(self) -> None:
        """Cancel every deadline."""
        for watch in self._watches.values():
            if watch.handle is not None:
                watch.handle.cancel()
        self._watches.clear()
