"""NSPB end to end on the deterministic simulator: real cores and torch operators on a virtual
clock, a lossy reordering network, crashes injected at protocol steps (HAMS §IV-E, §IV-F)."""

from __future__ import annotations

import random
import statistics
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful.core.backup import BackupRole
from stateful.messages import Mode, NoiseSpec, RuntimeOptions
from stateful.services import ol_graph, request_maker, service_graph
from stateful.simulation import NetParams, SimCluster


def finished(c: SimCluster, requests: int) -> bool:
    return len(c.replies) == requests and c.idle()


Kill = tuple[int, str, str]
"""(step, operator, role) with role "primary", "backup" or "stateless"."""


def cluster(service: str, mode: Mode, *, seed: int = 0, batch: int = 4, drop: float = 0.0,
            max_delay_s: float = 0.002, noise: bool = True, wire: bool = False) -> SimCluster:
    options = RuntimeOptions(mode=mode, observe=True,
                             noise=NoiseSpec(seed=seed) if noise else None)
    net = NetParams(drop=drop, delay_s=(0.0001, max_delay_s), wire=wire)
    return SimCluster(service_graph(service, batch), options, seed=seed, net=net)


def drive(c: SimCluster, service: str, requests: int, kills: list[Kill] = (),  # type: ignore[assignment]
          seed: int = 0) -> bool:
    plan = sorted(kills)

    def inject(step: int) -> None:
        while plan and plan[0][0] <= step:
            _, op, role = plan.pop(0)
            node = c.node_of(op, "primary" if role == "stateless" else role)
            if node is not None and c.can_fail(node):
                c.kill(node)

    c.on_step = inject
    make = request_maker(service, seed=seed)
    for i in range(requests):
        c.submit(make(i))
    return c.run(lambda: len(c.replies) == requests and c.idle(), timeout_s=30.0)


@pytest.mark.parametrize("service", ["sp", "ol"])
@pytest.mark.parametrize("mode", list(Mode))
def test_every_mode_serves_every_request_without_failures(service: str, mode: Mode) -> None:
    c = cluster(service, mode, drop=0.1)
    assert drive(c, service, 30)
    report = c.report()
    assert report.ok, report.summary()
    assert report.replied == 30


def test_remus_adds_latency_nspb_hides_it() -> None:
    def mean_latency(mode: Mode) -> float:
        c = cluster("sp", mode, noise=False)
        assert drive(c, "sp", 40)
        return statistics.mean(c.reply_times[r] - c.submit_times[r] for r in c.replies)

    bare, nspb, remus = (mean_latency(m) for m in (Mode.BARE, Mode.NSPB, Mode.REMUS))
    assert remus > nspb * 1.1
    assert nspb < bare * 1.1


def test_messages_survive_the_transport_frame_format() -> None:
    c = cluster("ol", Mode.NSPB, wire=True)
    assert drive(c, "ol", 12, [(150, "tracker", "primary")])
    assert c.report().ok and c.recoveries


def test_figure_6_strawman_is_inconsistent_and_nspb_is_not() -> None:
    """HAMS Fig. 6: a's state is slow to reach its backup, b's backup applies a state built on
    a's speculative output, then a's primary fails and re-executes non-deterministically."""
    results = {}
    for mode in (Mode.NSPB, Mode.STRAWMAN):
        c = SimCluster(ol_graph(4), RuntimeOptions(mode=mode, observe=True,
                                                   noise=NoiseSpec(seed=3)), seed=3)
        c.slow[("tracker.p0", "tracker.b0")] = 0.05
        make = request_maker("ol")
        for i in range(24):
            c.submit(make(i))
        c.run(timeout_s=0.065)
        backup = c.nodes["classifier.b0"].core.role
        assert isinstance(backup, BackupRole)
        results[mode] = backup.applied_seq
        c.kill("tracker.p0")
        c.run(partial(finished, c, 24), timeout_s=5.0)
        report = c.report()
        if mode is Mode.NSPB:
            assert report.ok, report.summary()
        else:
            kinds = {i.kind for i in report.inconsistencies}
            assert kinds == {"conflicting_output"}, report.summary()
    assert results[Mode.STRAWMAN] > results[Mode.NSPB], "NSPB's classifier backup waited"


def test_correlated_failure_rolls_the_downstream_primary_back() -> None:
    """An upstream primary and a downstream backup fail together (§IV-C)."""
    c = cluster("ol", Mode.NSPB, seed=5, max_delay_s=0.004)
    c.slow[("tracker.p0", "tracker.b0")] = 0.03
    make = request_maker("ol", seed=5)
    for i in range(30):
        c.submit(make(i))
    c.run(timeout_s=0.04)
    c.kill("tracker.p0")
    c.kill("classifier.b0")
    assert c.run(lambda: len(c.replies) == 30 and c.idle(), timeout_s=10.0)
    assert c.report().ok, c.report().summary()
    done = c.recoveries[0]
    assert "tracker" in done.promoted
    assert "classifier" in done.rolled_back


def test_taint_with_a_backup_still_catching_up_rolls_the_primary_back() -> None:
    """The classifier's backup was replaced and has not applied its overwrite yet when the
    tracker's primary fails: the durable point comes from what the old backup announced, so
    the classifier's primary rolls back instead of promoting a backup that is behind it."""
    for seed in range(3):
        c = SimCluster(ol_graph(4), RuntimeOptions(mode=Mode.NSPB, observe=True,
                                                   noise=NoiseSpec(seed=seed)), seed=seed)
        make = request_maker("ol", seed=seed)
        for i in range(20):
            c.submit(make(i))
        c.run(lambda c=c: len(c.replies) >= 10, timeout_s=1.0)
        c.slow[("tracker.p0", "tracker.b0")] = 0.05
        for i in range(20, 40):
            c.submit(make(i))
        c.run(timeout_s=0.005)
        c.kill("classifier.b0")
        c.run(lambda c=c: c.node_of("classifier", "backup") not in (None, "classifier.b0")
              and not c.coordinator.busy, timeout_s=1.0)
        c.run(timeout_s=0.002)
        fresh = c.nodes[c.node_of("classifier", "backup")].core.role  # type: ignore[index]
        assert isinstance(fresh, BackupRole) and fresh.applied_batch < 0
        c.kill("tracker.p0")
        assert c.run(partial(finished, c, 40), timeout_s=10.0)
        assert c.report().ok, c.report().summary()
        assert "classifier" in c.recoveries[-1].rolled_back


def test_old_primary_rejoins_as_backup_by_overwrite() -> None:
    c = cluster("ol", Mode.NSPB, seed=2)
    c.slow[("tracker.p0", "tracker.b0")] = 0.03
    make = request_maker("ol", seed=2)
    for i in range(30):
        c.submit(make(i))
    c.run(timeout_s=0.05)
    c.kill("tracker.p0")
    assert c.run(lambda: len(c.replies) == 30 and c.idle(), timeout_s=10.0)
    assert c.report().ok
    assert "classifier" in c.recoveries[0].promoted
    where = c.coordinator.config.placements["classifier"]  # type: ignore[union-attr]
    assert (where.primary, where.backup) == ("classifier.b0", "classifier.p0")
    rejoined = c.nodes["classifier.p0"].core.role
    assert isinstance(rejoined, BackupRole) and rejoined.applied_batch > 0


def test_stateless_failure_restarts_from_a_warm_standby() -> None:
    c = cluster("sp", Mode.NSPB, seed=4)
    assert drive(c, "sp", 30, [(120, "embed", "stateless"), (400, "predict", "stateless")])
    assert c.report().ok
    assert [r.restarted for r in c.recoveries] == [("embed",), ("predict",)]


ROLES = st.sampled_from(["primary", "primary", "backup", "stateless"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), service=st.sampled_from(["sp", "ol"]),
       mode=st.sampled_from([Mode.NSPB, Mode.REMUS]), batch=st.sampled_from([1, 4, 16]),
       drop=st.sampled_from([0.0, 0.05, 0.2]), max_delay=st.sampled_from([0.001, 0.01]),
       kills=st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 9), ROLES), max_size=3))
def test_random_failures_keep_every_reply_and_global_consistency(
        seed: int, service: str, mode: Mode, batch: int, drop: float, max_delay: float,
        kills: list[tuple[int, int, str]]) -> None:
    c = cluster(service, mode, seed=seed, batch=batch, drop=drop, max_delay_s=max_delay)
    topo = c.graph.topology
    stateful = sorted(topo.stateful)
    stateless = sorted(set(topo.order) - topo.stateful)
    plan = [(step, (stateless if role == "stateless" else stateful)[k % 2], role)
            for step, k, role in kills]
    assert drive(c, service, 24, plan, seed=seed), c.report().summary()
    report = c.report()
    assert report.ok, report.summary()


@pytest.mark.parametrize(("op", "role"), [("tracker", "primary"), ("classifier", "primary"),
                                          ("tracker", "backup"), ("camera", "stateless")])
def test_a_failure_at_every_protocol_step_is_recovered_consistently(op: str, role: str) -> None:
    """Crash one replica of OL after each event of a run (delivery, completion, timer), one run
    per step, with non-determinism on: every reply arrives and the checker finds nothing."""
    reference = cluster("ol", Mode.NSPB, batch=2)
    assert drive(reference, "ol", 5)
    for step in range(1, reference.steps + 1):
        c = cluster("ol", Mode.NSPB, batch=2)
        assert drive(c, "ol", 5, [(step, op, role)]), step
        report = c.report()
        assert report.ok, f"crash of {op} {role} after step {step}: {report.summary()}"


def test_a_backup_never_applies_a_state_built_on_fenced_speculation() -> None:
    """Regression (hypothesis counterexample): SP's sentiment primary fails, and stock's primary
    ships a state built on sentiment's lost seq 3 just before failing too. The re-executed
    sentiment's new epoch later announces seq 3 durable; that notify covers the new value, not
    the fenced-off one, so stock's backup must not apply the old state (it did: stock then
    promoted a state holding the lost output, a conflicting seq 3 and a lost request)."""
    c = cluster("sp", Mode.NSPB, seed=0, batch=1, drop=0.05, max_delay_s=0.01)
    assert sorted(c.graph.topology.stateful) == ["sentiment", "stock"]
    assert drive(c, "sp", 24, [(347, "sentiment", "primary"), (419, "stock", "primary")])
    report = c.report()
    assert report.ok, report.summary()
    assert report.replied == 24
    assert [r.failed for r in c.recoveries] == [("sentiment.p0",), ("stock.p0",)]


def test_a_rollback_keeps_what_the_lost_backup_applied_unheard() -> None:
    """Regression (sweep counterexample): OL's tracker primary fails, then the classifier's
    backup applies states up to seq 9 and fails before its notify or ack reaches anyone. The
    classifier's primary consumed the tracker's lost speculation and rolls back; rolling back to
    the last durable point anyone heard of (seq 3) re-executed seqs 4-9 with other values than
    the states the backup had applied. It rolls back to its newest retained state that depends
    only on durable tracker outputs (HAMS §IV-C's s_b^{n-1}) instead."""
    c = cluster("ol", Mode.NSPB, seed=3240, batch=16, drop=0.2, max_delay_s=0.01)
    assert drive(c, "ol", 24, [(268, "tracker", "primary"), (346, "classifier", "backup")],
                 seed=3240)
    report = c.report()
    assert report.ok, report.summary()
    assert report.replied == 24
    first = c.recoveries[0]
    assert "tracker" in first.promoted and "classifier" in first.rolled_back
    lost = c.nodes["classifier.b0"]
    assert not lost.alive and isinstance(lost.core.role, BackupRole)
    fences = c.coordinator.config.fences  # type: ignore[union-attr]
    assert fences["classifier"].seq >= lost.core.role.applied_seq > 3


ADJACENT = {"sp": ("sentiment", "stock"), "ol": ("tracker", "classifier")}
"""Each service's upstream and downstream stateful operator (adjacent: only stateless between)."""


@pytest.mark.parametrize("service", ["sp", "ol"])
@pytest.mark.parametrize(("first", "second"), [
    (("up", "primary"), ("down", "primary")), (("down", "primary"), ("up", "primary")),
    (("up", "primary"), ("down", "backup")), (("down", "primary"), ("up", "backup"))],
    ids=["primaries", "primaries-downstream-first", "primary-then-downstream-backup",
         "primary-then-upstream-backup"])
def test_correlated_failures_of_adjacent_stateful_operators(
        service: str, first: tuple[str, str], second: tuple[str, str]) -> None:
    """Two replicas of adjacent stateful operators crash close together (HAMS §IV-E correlated
    failures), on a lossy, reordering network, over a fixed sweep of seeds, crash steps, gaps,
    batch sizes and delays: every request is answered and the checker finds nothing."""
    ops = dict(zip(("up", "down"), ADJACENT[service], strict=True))
    rng = random.Random(f"{service}-{first}-{second}")
    both = 0
    runs = 60
    for seed in range(runs):
        step, gap = rng.randint(100, 1000), rng.choice([0, 20, 60, 150])
        batch, drop = rng.choice([1, 4, 16]), rng.choice([0.05, 0.2])
        c = cluster(service, Mode.NSPB, seed=seed, batch=batch, drop=drop,
                    max_delay_s=rng.choice([0.002, 0.01]))
        kills = [(step, ops[first[0]], first[1]), (step + gap, ops[second[0]], second[1])]
        where = f"seed {seed}, kills {kills}, batch {batch}, drop {drop}"
        assert drive(c, service, 24, kills, seed=seed), f"{where}: {c.report().summary()}"
        report = c.report()
        assert report.ok, f"{where}: {report.summary()}"
        both += len({n for r in c.recoveries for n in r.failed}) == 2
    assert both >= runs // 3, "most runs should crash both replicas"
