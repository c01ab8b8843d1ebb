"""The suspicion rule (phi-accrual, then confirmation by probes) on a simulated clock."""

from __future__ import annotations

import math
import random

import pytest

from controller.suspicion import (
    MAX_SUSPECT_T,
    SuspicionSettings,
    SuspicionTable,
    phi_sigmas,
)

T = 0.02
SETTINGS = SuspicionSettings(interval_s=T, confirm_s=2 * T, probe_every_s=0.6 * T,
                             sweep_s=0.004)
ADDRESS = ("127.0.0.1", 9)


class Clock:
    """Drives a table: heartbeats every T with jitter, sweeps every sweep_s."""

    def __init__(self, table: SuspicionTable, seed: int = 1) -> None:
        self.table = table
        self.now = 100.0
        self.rng = random.Random(seed)
        self.declared: list[tuple[str, str, float]] = []
        self.probes = 0
        self.triton_probes = 0

    def run(self, seconds: float, beating: set[str], jitter_s: float = 0.0,
            acking: set[str] = frozenset(), triton_ready: dict[str, bool] | None = None) -> None:
        end = self.now + seconds
        next_beat = {s: self.now + self.rng.uniform(0, T) for s in beating}
        while self.now < end:
            self.now += SETTINGS.sweep_s / 4
            for server, due in next_beat.items():
                if self.now >= due:
                    watch = self.table.by_server[server]
                    self.table.beat(watch.slot, watch.nonce, True, ADDRESS, self.now)
                    next_beat[server] = due + T + self.rng.uniform(0, jitter_s)
            if self.table.last_sweep is None or \
                    self.now - self.table.last_sweep >= SETTINGS.sweep_s:
                result = self.table.sweep(self.now)
                self.probes += len(result.probes)
                self.triton_probes += len(result.triton_probes)
                for watch in result.probes:
                    if watch.server_id in acking:
                        self.table.ack(watch.slot, watch.nonce, self.now)
                for watch in result.triton_probes:
                    if triton_ready and watch.server_id in triton_ready:
                        self.table.triton_result(watch.server_id, triton_ready[watch.server_id])
                self.declared += [(d.server_id, d.reason, self.now)
                                  for d in result.declarations]


def _table(*servers: str, triton: bool = False) -> tuple[SuspicionTable, Clock]:
    table = SuspicionTable(SETTINGS)
    clock = Clock(table)
    for slot, server in enumerate(servers, start=1):
        table.admit(server, slot, 1000 + slot, ("127.0.0.1", 8000) if triton else None)
        table.watch(server, generation=slot, grace_s=0.5, now=clock.now)
    return table, clock


def test_phi_threshold_inverts_the_logistic_tail() -> None:
    for phi in (1.0, 3.0, 8.0, 12.0):
        y = phi_sigmas(phi)
        e = math.exp(-y * (1.5976 + 0.070566 * y * y))
        assert -math.log10(e / (1 + e)) == pytest.approx(phi, rel=1e-6)
    with pytest.raises(ValueError):
        phi_sigmas(float("nan"))


def test_steady_heartbeats_with_jitter_are_never_suspected() -> None:
    table, clock = _table("a", "b")
    clock.run(20.0, beating={"a", "b"}, jitter_s=0.004)
    assert clock.declared == [] and table.suspicions == 0


def test_a_silent_server_is_declared_within_the_bound_after_its_last_heartbeat() -> None:
    table, clock = _table("a", "b")
    clock.run(5.0, beating={"a", "b"})
    last = table.by_server["a"].last_arrival
    clock.run(1.0, beating={"b"})
    assert [d[:2] for d in clock.declared] == [("a", "missed heartbeats, probes unanswered")]
    after = clock.declared[0][2] - last
    assert T < after <= MAX_SUSPECT_T * T + SETTINGS.confirm_s + 2 * SETTINGS.sweep_s
    assert clock.probes >= 2  # probed during the confirmation, not declared blind


def test_a_stall_shorter_than_the_confirmation_is_not_declared() -> None:
    table, clock = _table("a")
    clock.run(5.0, beating={"a"})
    clock.run(0.075, beating=set())  # silent past the suspicion, not past the confirmation
    clock.run(2.0, beating={"a"})
    assert clock.declared == []
    assert table.suspicions == 1 and table.cleared == 1


def test_a_probe_answer_clears_the_suspicion_of_a_silent_agent() -> None:
    table, clock = _table("a")
    clock.run(5.0, beating={"a"})
    clock.run(1.0, beating=set(), acking={"a"})  # heartbeats lost, the agent answers probes
    assert clock.declared == []
    assert table.cleared >= 1


def test_a_ready_triton_holds_the_declaration_until_the_agent_silence_limit() -> None:
    table, clock = _table("a", triton=True)
    clock.run(5.0, beating={"a"})
    last = table.by_server["a"].last_arrival
    clock.run(SETTINGS.agent_silence_s + 0.5, beating=set(), triton_ready={"a": True})
    assert [d[:2] for d in clock.declared] == [("a", "agent silent, Triton still ready")]
    assert clock.declared[0][2] - last >= SETTINGS.agent_silence_s
    assert clock.triton_probes >= 2  # asked again while waiting


def test_a_dead_triton_does_not_hold_the_declaration() -> None:
    table, clock = _table("a", triton=True)
    clock.run(5.0, beating={"a"})
    clock.run(1.0, beating=set(), triton_ready={"a": False})
    assert [d[0] for d in clock.declared] == ["a"]


def test_a_noisy_server_gets_a_wider_but_bounded_silence() -> None:
    table, clock = _table("quiet", "noisy")
    clock.run(10.0, beating={"quiet"})
    quiet_limit = table.suspect_after("quiet", clock.now)
    table2, clock2 = _table("noisy")
    clock2.run(10.0, beating={"noisy"}, jitter_s=0.015)
    noisy_limit = table2.suspect_after("noisy", clock2.now)
    assert quiet_limit is not None and noisy_limit is not None
    assert quiet_limit < noisy_limit <= MAX_SUSPECT_T * T + 1e-9


def test_stale_nonces_and_unknown_slots_are_ignored() -> None:
    table, clock = _table("a")
    watch = table.by_server["a"]
    assert table.beat(watch.slot, watch.nonce + 1, True, ADDRESS, clock.now) is None
    assert table.beat(999, 1, True, ADDRESS, clock.now) is None
    assert watch.beats == 0


def test_a_declared_server_that_beats_again_is_reported_alive_once() -> None:
    table, clock = _table("a")
    clock.run(1.0, beating={"a"})
    clock.run(0.5, beating=set())
    assert [d[0] for d in clock.declared] == ["a"]
    watch = table.by_server["a"]
    assert table.beat(watch.slot, watch.nonce, True, ADDRESS, clock.now) == "a"
    assert table.beat(watch.slot, watch.nonce, True, ADDRESS, clock.now + 0.1) is None
    table.watch("a", generation=9, grace_s=0.1, now=clock.now)
    clock.run(2.0, beating={"a"})
    assert len(clock.declared) == 1


def test_a_stalled_monitor_gives_suspects_a_fresh_window() -> None:
    table, clock = _table("a")
    clock.run(2.0, beating={"a"})
    clock.now += 0.08
    table.sweep(clock.now)  # suspect now
    assert table.suspects
    clock.now += 1.0  # the monitor itself did not run for a second
    result = table.sweep(clock.now)
    assert result.declarations == []  # not declared on stale evidence


def test_a_false_alarm_widens_that_server_only_and_decays() -> None:
    table, clock = _table("a", "b")
    clock.run(3.0, beating={"a", "b"})
    before = table.suspect_after("a", clock.now)
    table.false_alarm("a", clock.now)
    assert table.suspect_after("a", clock.now) == pytest.approx(2 * before)
    assert table.suspect_after("b", clock.now) == pytest.approx(before, rel=0.2)
    clock.run(31.0, beating={"a", "b"})
    assert table.suspect_after("a", clock.now) < 1.5 * before


def test_a_closed_liveness_stream_declares_the_current_connection_only() -> None:
    table, clock = _table("a", "b")
    clock.run(1.0, beating={"a", "b"})
    a = table.by_server["a"]
    assert table.stream_closed(a.slot, a.nonce + 1, clock.now) is None  # an older connection
    declaration = table.stream_closed(a.slot, a.nonce, clock.now)
    assert declaration is not None and declaration.reason == "agent processes died"
    assert declaration.silent_s < T
    assert table.stream_closed(a.slot, a.nonce, clock.now) is None  # declared once
    clock.run(1.0, beating={"b"})
    assert clock.declared == []  # not declared again by silence


def test_a_heartbeat_read_after_the_stream_closed_revives_nothing() -> None:
    """A beat the agent sent before it was killed can be read after its stream's close: the
    server is dead all the same (a revival would cancel its failover as a false alarm)."""
    table, clock = _table("a")
    clock.run(1.0, beating={"a"})
    a = table.by_server["a"]
    assert table.stream_closed(a.slot, a.nonce, clock.now) is not None
    assert table.beat(a.slot, a.nonce, True, ADDRESS, clock.now + 0.001) is None
    assert table.beat(a.slot, a.nonce, True, ADDRESS, clock.now + 2.0) is None
    # The same processes saying hello on a new stream are alive: their beats revive it.
    table.stream_opened(a.slot, a.nonce + 1)  # not this connection's
    assert table.beat(a.slot, a.nonce, True, ADDRESS, clock.now + 4.0) is None
    table.stream_opened(a.slot, a.nonce)
    assert table.beat(a.slot, a.nonce, True, ADDRESS, clock.now + 6.0) == "a"


def test_sweeps_skip_the_full_scan_until_a_server_could_be_suspect_yet_miss_none() -> None:
    servers = [f"s{i}" for i in range(50)]
    table, clock = _table(*servers)
    scans = 0
    real_scan = table._scan  # noqa: SLF001 - counting the full scans

    def counted(now: float, result: object) -> None:
        nonlocal scans
        scans += 1
        real_scan(now, result)  # type: ignore[arg-type]

    table._scan = counted  # type: ignore[method-assign]  # noqa: SLF001
    clock.run(2.0, beating=set(servers))
    sweeps = 2.0 / SETTINGS.sweep_s
    assert 0 < scans < sweeps / 3, (scans, sweeps)  # most sweeps did not scan
    # A server that goes silent is still suspected as soon as its limit passes.
    last = table.by_server["s7"].last_arrival
    limit = table.suspect_after("s7", clock.now)
    assert limit is not None
    clock.run(1.0, beating=set(servers) - {"s7"})
    assert [d[0] for d in clock.declared] == ["s7"]
    suspected_at = clock.declared[0][2] - SETTINGS.confirm_s
    assert last + limit <= suspected_at <= last + limit + 2 * SETTINGS.sweep_s
