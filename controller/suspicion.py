"""Whether a silent server is dead: phi-accrual suspicion, then confirmation by probes.

Pure logic over a clock the caller passes in (``now``, monotonic seconds), so the monitor
process (``controller.heartbeat_monitor``) and the unit tests drive the same code.

**Suspicion.** Each server's heartbeat inter-arrival gaps (the last :data:`WINDOW`) give a mean
and a standard deviation. As in the phi-accrual detector (Hayashibara et al.; Cassandra, Akka),
the suspicion level after a silence ``t`` is ``phi(t) = -log10(1 - F(t))`` with ``F`` the normal
distribution of those gaps (the logistic approximation Akka uses). ``phi`` crosses the
threshold at a fixed number of standard deviations above the mean, so the silence that makes a
server suspect is computed once per few heartbeats, not at every sweep::

    suspect_after = mean + y(phi) * max(std, MIN_STD_FRACTION * T) + T   (at most MAX_SUSPECT_T * T)

The extra T is Akka's "acceptable pause" (one heartbeat may always be late); the floor on the
standard deviation keeps a very regular server from being suspected after 1 ms of jitter; the
cap keeps a noisy server detectable within the bound.

**Confirmation.** A suspect is probed at once, independently of its heartbeats: a PROBE datagram
that the agent's heartbeat thread answers (a stopped or dead agent does not), and an HTTP probe
of its Triton's readiness endpoint. Any heartbeat or probe answer clears the suspicion. A
suspect is declared failed only when ``confirm_s`` passed with neither: so a server that stalls
for less than suspicion + confirmation (a load, a teardown, a burst of clients on its CPU) is
never declared, and a silent one is declared ``suspect_after + confirm_s`` after its last sign
of life. When only the agent is silent and its Triton still answers ready, its clients are
still served: the server is declared only after ``agent_silence_s``.

A false alarm reported by the controller (a declared server that was alive) doubles that
server's suspicion silence, up to :data:`MAX_PENALTY`, halving again after
:data:`PENALTY_DECAY_S` without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

WINDOW = 200
"""Inter-arrival gaps remembered per server (4 s at T = 20 ms)."""
MIN_SAMPLES = 8
"""Below this many gaps the stats are not trusted: the interval T stands in for them."""
RECOMPUTE_EVERY = 8
"""Heartbeats between two recomputations of a server's suspicion silence."""
MIN_STD_FRACTION = 0.25
MAX_SUSPECT_T = 4.5
MAX_PENALTY = 4.0
PENALTY_DECAY_S = 30.0
STALL_FACTOR = 4.0
"""A sweep later than this many sweep intervals means the monitor itself stalled."""


def phi_sigmas(phi: float) -> float:
    """Standard deviations above the mean where the suspicion level reaches ``phi``.

    Inverts Akka's logistic approximation of the normal tail,
    ``1 - F(y) ~ e / (1 + e)`` with ``e = exp(-y (1.5976 + 0.070566 y^2))``, by bisection.
    """
    if not math.isfinite(phi) or phi <= 0:
        raise ValueError("phi must be a positive finite number")
    target = math.log(10 ** phi - 1.0)  # y (1.5976 + 0.070566 y^2) at the threshold
    low, high = 0.0, 50.0
    for _ in range(100):
        mid = (low + high) / 2
        if mid * (1.5976 + 0.070566 * mid * mid) < target:
            low = mid
        else:
            high = mid
    return high


@dataclass(frozen=True)
class SuspicionSettings:
    """The detector's knobs (defaults for T = 20 ms)."""

    interval_s: float = 0.02
    phi: float = 8.0
    confirm_s: float = 0.04
    """How long a suspect's probes have to be answered before it is declared."""
    probe_every_s: float = 0.012
    agent_silence_s: float = 2.0
    """An agent silent this long is declared even though its Triton still answers."""
    sweep_s: float = 0.004


@dataclass(slots=True)
class ServerWatch:
    """What the monitor knows of one server's current connection."""

    server_id: str
    slot: int
    nonce: int
    triton: tuple[str, int] | None
    armed: bool = False
    """A deadline is running (watched); False after a declaration, until the next watch."""
    generation: int = 0
    last_arrival: float = 0.0
    gaps: list[float] = field(default_factory=list)
    gap_pos: int = 0
    gap_sum: float = 0.0
    gap_sq: float = 0.0
    since_recompute: int = 0
    suspect_after: float = 0.0
    grace_until: float = 0.0
    suspect_since: float | None = None
    last_probe: float = 0.0
    probe_seq: int = 0
    triton_ready: bool | None = None
    address: tuple[str, int] | None = None
    """Where this agent's datagrams come from (probes go there)."""
    penalty: float = 1.0
    penalty_at: float = 0.0
    alive_reported_at: float = -math.inf
    beats: int = 0
    stream_lost: bool = False
    """The connection's liveness stream closed without a goodbye: its processes died. A
    heartbeat of this connection that arrives afterwards was sent before (reordered, or read
    late from the socket) and revives nothing; a new stream hello for it clears this."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """A server the monitor declares failed."""

    server_id: str
    generation: int
    reason: str
    silent_s: float


@dataclass(slots=True)
class SweepResult:
    """What one sweep asks the caller to do."""

    probes: list[ServerWatch] = field(default_factory=list)
    """Send each a PROBE (its ``probe_seq`` is already advanced)."""
    triton_probes: list[ServerWatch] = field(default_factory=list)
    """Start a readiness probe of each one's Triton."""
    declarations: list[Declaration] = field(default_factory=list)
    suspected: list[str] = field(default_factory=list)
    """Servers that became suspect in this sweep (for counting; not a declaration)."""


class SuspicionTable:
    """Every admitted server's heartbeat statistics, suspicion and probes."""

    def __init__(self, settings: SuspicionSettings) -> None:
        self.settings = settings
        self.sigmas = phi_sigmas(settings.phi)
        self.by_slot: dict[int, ServerWatch] = {}
        self.by_server: dict[str, ServerWatch] = {}
        self.suspects: set[int] = set()
        self.last_sweep: float | None = None
        self._scan_from = 0.0
        """No server can become suspect before this instant (see :meth:`sweep`)."""
        self.suspicions = 0
        self.cleared = 0
        """Suspicions cleared by a heartbeat or a probe answer (each one a declaration avoided)."""

    def configure(self, settings: SuspicionSettings) -> None:
        """New settings; each server's silence is recomputed at its next heartbeat."""
        self.settings = settings
        self.sigmas = phi_sigmas(settings.phi)
        self._scan_from = 0.0
        for watch in self.by_slot.values():
            watch.suspect_after = 0.0

    # --- membership -------------------------------------------------------------------------

    def admit(self, server_id: str, slot: int, nonce: int,
              triton: tuple[str, int] | None) -> ServerWatch:
        """A new connection of ``server_id``: its datagrams now carry this slot and nonce."""
        previous = self.by_server.get(server_id)
        if previous is not None and previous.slot != slot:
            self.by_slot.pop(previous.slot, None)
            self.suspects.discard(previous.slot)
        watch = ServerWatch(server_id, slot, nonce, triton)
        if previous is not None:  # what was learnt of the server outlives its connection
            watch.penalty, watch.penalty_at = previous.penalty, previous.penalty_at
            watch.armed, watch.generation = previous.armed, previous.generation
            watch.grace_until, watch.last_arrival = previous.grace_until, previous.last_arrival
        self.by_slot[slot] = watch
        self.by_server[server_id] = watch
        self._scan_from = 0.0
        return watch

    def watch(self, server_id: str, generation: int, grace_s: float, now: float) -> None:
        """Arm the server's deadline; the first heartbeat is due within ``grace_s``."""
        watch = self.by_server.get(server_id)
        if watch is None:
            return
        watch.armed, watch.generation = True, generation
        watch.last_arrival = now
        watch.beats = 0
        watch.grace_until = now + grace_s
        self._clear(watch)
        self._scan_from = 0.0

    def unwatch(self, server_id: str) -> None:
        """Disarm (declared by the controller itself, or drained)."""
        watch = self.by_server.get(server_id)
        if watch is not None:
            watch.armed = False
            self._clear(watch)

    def forget(self, server_id: str) -> None:
        """Drop the server entirely (deleted, or its agent disconnected for good)."""
        watch = self.by_server.pop(server_id, None)
        if watch is not None:
            self.by_slot.pop(watch.slot, None)
            self.suspects.discard(watch.slot)

    def false_alarm(self, server_id: str, now: float) -> None:
        """The controller found a declared server alive: more patience with it for a while."""
        watch = self.by_server.get(server_id)
        if watch is not None:
            watch.penalty = min(MAX_PENALTY, watch.penalty * 2)
            watch.penalty_at = now
            watch.suspect_after = 0.0

    # --- signs of life ----------------------------------------------------------------------

    def beat(self, slot: int, nonce: int, triton_alive: bool,
             address: tuple[str, int], now: float) -> str | None:
        """A heartbeat datagram; returns the server id when a declared server is alive again."""
        watch = self.by_slot.get(slot)
        if watch is None or watch.nonce != nonce:
            return None
        watch.address = address
        watch.beats += 1
        if watch.armed:
            if watch.beats > 1:
                self.add_gap(watch, now - watch.last_arrival)
            watch.last_arrival = now
            if watch.suspect_since is not None:
                self.cleared += 1
                self._clear(watch)
            return None
        if triton_alive and not watch.stream_lost and now - watch.alive_reported_at > 1.0:
            watch.alive_reported_at = now
            return watch.server_id
        return None

    def ack(self, slot: int, nonce: int, now: float) -> bool:
        """A probe answer from the agent: it is alive (not a heartbeat: no gap is recorded)."""
        watch = self.by_slot.get(slot)
        if watch is None or watch.nonce != nonce or watch.suspect_since is None:
            return False
        self.cleared += 1
        watch.last_arrival = now
        self._clear(watch)
        return True

    def stream_closed(self, slot: int, nonce: int, now: float) -> Declaration | None:
        """The agent's liveness stream closed without a goodbye: its process group died.

        An immediate signal, like the agent's websocket closing: declared at once when it is
        the server's current connection and the server is watched.
        """
        watch = self.by_slot.get(slot)
        if watch is None or watch.nonce != nonce:
            return None
        watch.stream_lost = True
        if not watch.armed:
            return None
        watch.armed = False
        self._clear(watch)
        return Declaration(watch.server_id, watch.generation, "agent processes died",
                           now - watch.last_arrival)

    def stream_opened(self, slot: int, nonce: int) -> None:
        """A liveness stream said hello for the connection: its processes live."""
        watch = self.by_slot.get(slot)
        if watch is not None and watch.nonce == nonce:
            watch.stream_lost = False

    def triton_result(self, server_id: str, ready: bool) -> None:
        """The readiness probe of a suspect's Triton answered (or failed)."""
        watch = self.by_server.get(server_id)
        if watch is not None and watch.suspect_since is not None:
            watch.triton_ready = ready

    # --- time -------------------------------------------------------------------------------

    def sweep(self, now: float) -> SweepResult:
        """Check every armed server's silence; suspect, probe and declare as due."""
        result = SweepResult()
        settings = self.settings
        stall_limit = STALL_FACTOR * settings.sweep_s + settings.interval_s
        if self.last_sweep is not None and now - self.last_sweep > stall_limit:
            # This process did not run for a while: datagrams that arrived meanwhile were just
            # read, and probe answers may be in flight. Give every suspect a fresh window.
            for slot in self.suspects:
                self.by_slot[slot].suspect_since = now
        self.last_sweep = now
        if now >= self._scan_from:
            self._scan(now, result)
        for slot in list(self.suspects):
            self._confirm(self.by_slot[slot], now, result)
        return result

    def _scan(self, now: float, result: SweepResult) -> None:
        """Suspect every armed server silent for longer than its limit.

        Also notes when the next scan can first find one: every limit is at least
        :meth:`_least_limit`, and heartbeats only move a server's last arrival later, so no
        server can become suspect before the oldest last arrival plus that floor. A sweep
        every few milliseconds then scans the thousand servers only a few times per
        heartbeat interval. (Arming, admitting or reconfiguring a server scans again.)
        """
        oldest = math.inf
        for watch in self.by_slot.values():
            if not watch.armed or watch.suspect_since is not None:
                continue
            last = watch.last_arrival
            if now >= watch.grace_until and now - last > (watch.suspect_after or
                                                          self._suspect_after(watch, now)):
                watch.suspect_since = now
                self.suspects.add(watch.slot)
                self.suspicions += 1
                result.suspected.append(watch.server_id)
                self._probe(watch, now, result)
                if watch.triton is not None:
                    result.triton_probes.append(watch)
            elif last < oldest:
                oldest = last
        self._scan_from = oldest + self._least_limit()

    def _least_limit(self) -> float:
        """A floor under every server's suspicion limit (see :meth:`_suspect_after`)."""
        t = self.settings.interval_s
        return min(t + self.sigmas * MIN_STD_FRACTION * t, MAX_SUSPECT_T * t)

    def _confirm(self, watch: ServerWatch, now: float, result: SweepResult) -> None:
        """A suspect: probe again, keep waiting, or declare it."""
        settings = self.settings
        assert watch.suspect_since is not None  # noqa: S101 - suspects have a start
        probe_due = now - watch.last_probe >= settings.probe_every_s
        if now - watch.suspect_since < settings.confirm_s:
            if probe_due:
                self._probe(watch, now, result)
            return
        silent = now - watch.last_arrival
        if watch.triton_ready and silent < settings.agent_silence_s:
            if probe_due:
                self._probe(watch, now, result)
                if now - watch.suspect_since >= 2 * settings.confirm_s:
                    # Re-ask Triton now and then (if it dies the agent cannot say so); it has
                    # a fresh confirmation window to answer.
                    watch.suspect_since = now
                    watch.triton_ready = None
                    result.triton_probes.append(watch)
            return
        reason = ("agent silent, Triton still ready" if watch.triton_ready else
                  "missed heartbeats, probes unanswered")
        result.declarations.append(Declaration(watch.server_id, watch.generation, reason,
                                               silent))
        watch.armed = False
        self._clear(watch)

    def suspect_after(self, server_id: str, now: float) -> float | None:
        """The silence that makes the server suspect now (None when unknown)."""
        watch = self.by_server.get(server_id)
        return None if watch is None else self._suspect_after(watch, now)

    # --- internals --------------------------------------------------------------------------

    def _probe(self, watch: ServerWatch, now: float, result: SweepResult) -> None:
        watch.last_probe = now
        watch.probe_seq += 1
        if watch.address is not None:
            result.probes.append(watch)

    def _clear(self, watch: ServerWatch) -> None:
        watch.suspect_since = None
        watch.triton_ready = None
        self.suspects.discard(watch.slot)

    def add_gap(self, watch: ServerWatch, gap: float) -> None:
        """Record one inter-arrival gap in the server's window (the monitor's hot path)."""
        gaps = watch.gaps
        if len(gaps) < WINDOW:
            gaps.append(gap)
        else:
            old = gaps[watch.gap_pos]
            gaps[watch.gap_pos] = gap
            watch.gap_pos = (watch.gap_pos + 1) % WINDOW
            watch.gap_sum -= old
            watch.gap_sq -= old * old
            if watch.gap_pos == 0:
                # Once per window: exact sums again (running sums drift with float error).
                watch.gap_sum = math.fsum(gaps) - gap
                watch.gap_sq = math.fsum(g * g for g in gaps) - gap * gap
        watch.gap_sum += gap
        watch.gap_sq += gap * gap
        watch.since_recompute += 1
        if watch.since_recompute >= RECOMPUTE_EVERY:
            watch.since_recompute = 0
            watch.suspect_after = 0.0  # recomputed lazily by the next sweep

    def _suspect_after(self, watch: ServerWatch, now: float) -> float:
        if watch.suspect_after > 0.0:
            return watch.suspect_after
        t = self.settings.interval_s
        count = len(watch.gaps)
        if count >= MIN_SAMPLES:
            mean = watch.gap_sum / count
            std = math.sqrt(max(0.0, watch.gap_sq / count - mean * mean))
        else:
            mean, std = t, 0.0
        if watch.penalty > 1.0 and now - watch.penalty_at > PENALTY_DECAY_S:
            watch.penalty = max(1.0, watch.penalty / 2)
            watch.penalty_at = now
        limit = mean + self.sigmas * max(std, MIN_STD_FRACTION * t) + t
        watch.suspect_after = min(limit, MAX_SUSPECT_T * t) * watch.penalty
        return watch.suspect_after
