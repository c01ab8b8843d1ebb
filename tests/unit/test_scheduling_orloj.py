"""Orloj's scheduler: batch choice, priority order, early drops, no starvation, refreshes."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scheduling.distribution import Distribution
from scheduling.orloj import Orloj
from scheduling.orloj_config import OURS as OUR_DEPARTURES
from scheduling.orloj_config import OrlojConfig
from scheduling.profile import ModelProfile
from scheduling.types import UNREACHABLE, BatchDone, BatchLaw, QueuedRequest

LAW = BatchLaw(slope=0.1)
SOLO = Distribution.from_knots([0.010, 0.012, 0.030, 0.034], [0.0, 0.5, 0.5, 1.0])
"""Half the requests take 10-12 ms alone, half 30-34 ms."""

PAPER = OrlojConfig(batch_sizes=(1, 2, 4))
OURS = OrlojConfig(batch_sizes=(1, 2, 4), **OUR_DEPARTURES)


def request(key: int, arrival: float, deadline: float, app: str = "default") -> QueuedRequest:
    return QueuedRequest(key, app, arrival, deadline)


def scheduler(config: OrlojConfig = PAPER, solo: Distribution = SOLO) -> Orloj:
    return Orloj(ModelProfile.single(solo, LAW), config)


@pytest.mark.parametrize("config", [PAPER, OURS])
def test_hopeless_request_is_dropped_early_with_its_reason(config: OrlojConfig) -> None:
    orloj = scheduler(config)
    orloj.enqueue(request(1, 0.0, 0.005), 0.0)  # needs >= 10 ms even alone
    decision = orloj.next_batch(0.0)
    assert decision.batch == ()
    assert [(d.request.key, d.reason) for d in decision.drops] == [(1, UNREACHABLE)]
    assert len(orloj) == 0


def test_a_request_that_nearly_surely_misses_is_dropped_by_ours_and_sent_by_the_papers(
        ) -> None:
    # 10.2 ms of slack: 5 % of requests finish that fast alone (under ours' 10 %)
    for config, sent in ((PAPER, True), (OURS, False)):
        orloj = scheduler(config)
        orloj.enqueue(request(1, 0.0, 0.0102), 0.0)
        decision = orloj.next_batch(0.0)
        assert (decision.batch != ()) is sent
        assert [d.reason for d in decision.drops] == ([] if sent else [UNREACHABLE])
    # 10.8 ms: 20 %, worth the worker's time
    orloj = scheduler(OURS)
    orloj.enqueue(request(2, 0.0, 0.0108), 0.0)
    assert [r.key for r in orloj.next_batch(0.0).batch] == [2]


@pytest.mark.parametrize("config", [PAPER, OURS])
def test_request_dropped_once_its_deadline_is_out_of_reach(config: OrlojConfig) -> None:
    orloj = scheduler(config)
    orloj.enqueue(request(1, 0.0, 0.100), 0.0)
    orloj.enqueue(request(2, 0.0, 0.050), 0.0)
    # the worker was busy until 45 ms: request 2 has 5 ms left, less than any execution
    decision = orloj.next_batch(0.045)
    assert [d.request.key for d in decision.drops] == [2]
    assert [r.key for r in decision.batch] == [1]


@pytest.mark.parametrize("config", [PAPER, OURS])
def test_an_arrival_to_an_idle_queue_goes_alone_and_one_behind_a_batch_waits(
        config: OrlojConfig) -> None:
    orloj = scheduler(config)
    orloj.enqueue(request(1, 0.0, 0.100), 0.0)
    assert len(orloj) == 1
    first = orloj.next_batch(0.0)
    assert [r.key for r in first.batch] == [1] and first.drops == ()
    assert len(orloj) == 0
    # while its batch runs, two arrive: they are placed (one hopeless) when the worker asks
    orloj.enqueue(request(2, 0.001, 0.200), 0.001)
    orloj.enqueue(request(3, 0.002, 0.015), 0.002)
    assert len(orloj) == 2
    second = orloj.next_batch(0.010)  # request 3 has 5 ms left: under any execution time
    assert [r.key for r in second.batch] == [2]
    assert [(d.request.key, d.reason) for d in second.drops] == [(3, UNREACHABLE)]
    assert len(orloj) == 0


def test_priority_order_picks_the_urgent_request_first() -> None:
    orloj = scheduler(OrlojConfig(batch_sizes=(1,)))
    orloj.enqueue(request(1, 0.0, 0.500), 0.0)  # relaxed
    orloj.enqueue(request(2, 0.0, 0.060), 0.0)  # urgent, can still make it
    orloj.enqueue(request(3, 0.0, 0.200), 0.0)
    order = [orloj.next_batch(0.0).batch[0].key for _ in range(3)]
    assert order == [2, 3, 1]


def test_nearly_hopeless_request_yields_to_one_that_will_make_it() -> None:
    """Only an 11 ms execution would save request 1; request 2 finishes whatever happens."""
    orloj = scheduler(OrlojConfig(batch_sizes=(1,)))
    orloj.enqueue(request(1, 0.0, 0.011), 0.0)
    orloj.enqueue(request(2, 0.0, 0.045), 0.0)
    assert orloj.next_batch(0.0).batch[0].key == 2


def test_batch_of_the_largest_size_holding_the_earliest_deadline() -> None:
    orloj = scheduler()
    for key in range(5):
        orloj.enqueue(request(key, 0.0, 0.5 + key * 0.01), 0.0)
    decision = orloj.next_batch(0.0)
    assert len(decision.batch) == 4 and 0 in {r.key for r in decision.batch}
    assert decision.expected_latency_s == pytest.approx(
        LAW.latency(4, SOLO.expected_max(4)), rel=5e-3)
    assert [r.key for r in orloj.next_batch(0.0).batch] == [4]


def test_tight_deadline_limits_the_batch_size() -> None:
    """A batch of 4 takes at least 13 ms; a deadline 12 ms away allows only one or two."""
    orloj = scheduler()
    orloj.enqueue(request(0, 0.0, 0.0125), 0.0)
    for key in range(1, 5):
        orloj.enqueue(request(key, 0.0, 1.0), 0.0)
    first = orloj.next_batch(0.0).batch
    assert 0 in {r.key for r in first} and len(first) <= 2


@pytest.mark.parametrize("config", [PAPER, OURS])
def test_no_starvation_under_sustained_load(config: OrlojConfig) -> None:
    """Urgent requests keep coming faster than single batches drain them; the relaxed one,
    lowest in priority at first, is still served before its deadline."""
    orloj = scheduler(config)
    relaxed = request(0, 0.0, 0.400)
    orloj.enqueue(relaxed, 0.0)
    now, key, served_at = 0.0, 1, None
    rng = np.random.default_rng(0)
    while now < 0.6 and served_at is None:
        for _ in range(3):  # three urgent arrivals per batch, each due in 60 ms
            orloj.enqueue(request(key, now, now + 0.060), now)
            key += 1
        decision = orloj.next_batch(now)
        assert relaxed not in [d.request for d in decision.drops]
        longest = max(float(SOLO.sample(rng, 1)[0]) for _ in decision.batch)
        now += LAW.latency(len(decision.batch), longest)
        if relaxed in decision.batch:
            served_at = now
        orloj.completed(BatchDone(decision.batch, now, 0.0))
    assert served_at is not None and served_at <= relaxed.deadline_s


def test_static_model_goes_through_the_same_path() -> None:
    orloj = scheduler(OURS, Distribution.point(0.005))
    for key in range(6):
        orloj.enqueue(request(key, 0.0, 0.100), 0.0)
    decision = orloj.next_batch(0.0)
    assert len(decision.batch) == 4
    assert decision.expected_latency_s == pytest.approx(LAW.latency(4, 0.005))
    orloj.enqueue(request(9, 0.0, 0.004), 0.0)  # shorter than the constant: hopeless
    decision = orloj.next_batch(0.0)
    assert [d.request.key for d in decision.drops] == [9]
    assert len(decision.batch) == 2  # a partial batch: two left, more than a batch of one


def test_a_static_models_spread_is_one_draw_per_batch_not_the_longest_of_n() -> None:
    """A static model's solo times vary with the machine: a batch of 4 draws once."""
    noisy = Distribution.from_knots([0.005, 0.006, 0.012], [0.0, 0.9, 1.0])
    dynamic = ModelProfile.single(noisy, LAW)
    static = ModelProfile({"default": noisy}, {"default": 1.0}, LAW, per_batch=True)
    for app in (None, "default"):
        assert static.batch_latency(4, app).mean() == pytest.approx(
            LAW.latency(4, noisy.mean()), rel=1e-3)
        assert static.batch_latency(4, app).quantile(0.5) < dynamic.batch_latency(
            4, app).quantile(0.5)
    # 7.5 ms left: a batch of 4 is in time when its one draw is under 5.8 ms (7 times in 10);
    # were it the longest of four draws, 2 times in 10, and Orloj would send 2 instead
    for profile, size in ((static, 4), (dynamic, 2)):
        orloj = Orloj(profile, OURS)
        for key in range(4):
            orloj.enqueue(request(key, 0.0, 0.0075), 0.0)
        assert len(orloj.next_batch(0.0).batch) == size
    refreshed = Orloj(static, OrlojConfig(batch_sizes=(1, 2), refresh_every=5))
    for key in range(6):
        refreshed.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.005, {key: 0.005}))
    assert refreshed.profile.per_batch  # a refresh keeps the model's kind


def test_request_aware_uses_the_apps_own_distribution() -> None:
    short = Distribution.from_knots([0.010, 0.012], [0.0, 1.0])
    long = Distribution.from_knots([0.030, 0.034], [0.0, 1.0])
    profile = ModelProfile({"short": short, "long": long}, {"short": 1.0, "long": 1.0}, LAW)
    orloj = Orloj(profile, OrlojConfig(batch_sizes=(1,), request_aware=True))
    # 20 ms left: only a short request can finish; the paper's mixture would keep both
    orloj.enqueue(request(1, 0.0, 0.020, "long"), 0.0)
    orloj.enqueue(request(2, 0.0, 0.020, "short"), 0.0)
    decision = orloj.next_batch(0.0)
    assert [d.request.key for d in decision.drops] == [1]
    assert [r.key for r in decision.batch] == [2]


def test_request_aware_goodput_weighs_a_batch_of_one_apps_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two urgent long requests rank above four short ones: the top four by priority mix them
    (a batch as long as the long ones); the short four alone run in a third of the time and
    leave the long ones time to finish after them."""
    short = Distribution.from_knots([0.010, 0.012], [0.0, 1.0])
    long = Distribution.from_knots([0.030, 0.034], [0.0, 1.0])
    profile = ModelProfile({"short": short, "long": long}, {"short": 1.0, "long": 1.0}, LAW)

    def first_batch() -> set[str]:
        orloj = Orloj(profile, OrlojConfig(batch_sizes=(1, 2, 4), request_aware=True,
                                           selection="goodput", partial_batches=True,
                                           while_clearable="goodput"))
        for key, app, deadline in [(1, "long", 0.070), (2, "long", 0.070), (3, "short", 0.080),
                                   (4, "short", 0.080), (5, "short", 0.080),
                                   (6, "short", 0.080)]:
            orloj.enqueue(request(key, 0.0, deadline, app), 0.0)
        return {r.app for r in orloj.next_batch(0.0).batch}

    assert first_batch() == {"short"}
    monkeypatch.setattr(Orloj, "_candidates", lambda self, queue, now_s: [
        self._top(queue, now_s)])  # the top by priority only
    assert first_batch() == {"short", "long"}


def test_while_the_queue_can_be_cleared_the_earliest_deadline_goes_first() -> None:
    """Everyone can finish: the earliest deadline goes at once with what it can carry (the
    two long requests and, up to the largest batch, short ones); goodput would send four
    short ones first and leave the long ones their last milliseconds. Overloaded, goodput
    decides."""
    short = Distribution.from_knots([0.010, 0.012], [0.0, 1.0])
    long = Distribution.from_knots([0.030, 0.034], [0.0, 1.0])
    profile = ModelProfile({"short": short, "long": long}, {"short": 1.0, "long": 1.0}, LAW)

    def first_batch(config: OrlojConfig, longs: int) -> list[str]:
        orloj = Orloj(profile, config)
        for key in range(longs):
            orloj.enqueue(request(key, 0.0, 0.080, "long"), 0.0)
        for key in range(10, 14):
            orloj.enqueue(request(key, 0.0, 0.100, "short"), 0.0)
        return sorted(r.app for r in orloj.next_batch(0.0).batch)

    assert first_batch(OURS, 2) == ["long", "long", "short", "short"]
    assert first_batch(OURS.model_copy(update={"while_clearable": "goodput"}), 2) == \
        ["short"] * 4
    # ten long ones cannot all finish by 80 ms: overloaded, the short ones' batch goes
    assert first_batch(OURS, 10) == ["short"] * 4


@pytest.mark.parametrize(("short_deadline", "long_goes"), [(0.080, True), (0.045, False)])
def test_short_requests_do_not_starve_a_long_one_while_they_can_wait(
        short_deadline: float, long_goes: bool) -> None:
    """Four short requests alone finish most per second, but a long request with 40 ms left
    could no longer finish after them. With 80 ms left the short ones can wait for it: it goes
    first. With 45 ms they cannot: four finishes are worth more than one."""
    short = Distribution.from_knots([0.010, 0.012], [0.0, 1.0])
    long = Distribution.from_knots([0.030, 0.034], [0.0, 1.0])
    profile = ModelProfile({"short": short, "long": long}, {"short": 1.0, "long": 1.0}, LAW)
    orloj = Orloj(profile, OURS)
    orloj.enqueue(request(1, 0.0, 0.040, "long"), 0.0)
    for key in range(2, 6):
        orloj.enqueue(request(key, 0.0, short_deadline, "short"), 0.0)
    batch = orloj.next_batch(0.0).batch
    assert (1 in {r.key for r in batch}) is long_goes


def test_choices_survive_reference_time_rebases() -> None:
    """Moving the reference time (§4.4's overflow handling) changes no decision."""

    def decisions(rebase_after: float) -> list[tuple[list[int], list[int]]]:
        orloj = scheduler(OrlojConfig(batch_sizes=(1, 2), delay_s=1e-3,
                                      rebase_after=rebase_after))
        rng = np.random.default_rng(5)
        now, out = 0.0, []
        for key in range(40):
            orloj.enqueue(request(key, now, now + float(rng.uniform(0.02, 0.2))), now)
            decision = orloj.next_batch(now)
            out.append(([int(r.key) for r in decision.batch],  # type: ignore[call-overload]
                        [int(d.request.key) for d in decision.drops]))  # type: ignore
            now += 0.008
        return out

    assert decisions(rebase_after=5.0) == decisions(rebase_after=500.0)


def test_profile_refresh_learns_from_measurements() -> None:
    orloj = scheduler(OrlojConfig(batch_sizes=(1, 2), refresh_every=50))
    old_p99 = orloj.profile.mix.quantile(0.99)
    for key in range(60):
        batch = (request(key, 0.0, 1.0),)
        orloj.completed(BatchDone(batch, 0.0, 0.05, {key: 0.05}))
    assert orloj.profile.mix.quantile(0.99) > old_p99
    assert orloj.profile.apps["default"].quantile(0.5) == pytest.approx(0.05, rel=0.2)


def test_config_is_validated() -> None:
    with pytest.raises(ValidationError):
        OrlojConfig(batch_sizes=(2, 4))
    with pytest.raises(ValidationError):
        OrlojConfig(unknown=1)  # type: ignore[call-arg]
    assert OrlojConfig(batch_sizes=(4, 1, 2)).batch_sizes == (1, 2, 4)


def test_bookkeeping_stays_bounded_over_a_long_run() -> None:
    """Departed requests leave no growing trace (a gateway queue runs for days)."""
    orloj = scheduler(OURS)
    now = 0.0
    for key in range(3000):
        orloj.enqueue(request(key, now, now + 0.2), now)
        if key % 2:
            orloj.next_batch(now)
        now += 0.006
    assert len(orloj) < 50
    for queue in orloj._queues:
        assert len(queue.deadlines) <= 2 * len(queue.members) + 65
        assert len(queue.milestones) < 3000


def test_live_overheads_widen_the_batch_latency_and_lower_the_on_time_chances() -> None:
    rng = np.random.default_rng(3)
    quiet = BatchLaw(slope=0.1, overhead_s=0.002)  # what a quiet warm-up measured
    orloj = Orloj(ModelProfile.single(SOLO, quiet), OrlojConfig(
        batch_sizes=(1, 2, 4), refresh_every=64, request_aware=True, selection="goodput"))
    loaded = rng.gamma(3.0, 0.001, 64) + 0.002  # under load: more, and it varies
    for key, overhead in enumerate(loaded):
        batch = (request(key, 0.0, 1.0),)
        orloj.completed(BatchDone(batch, 0.0, 0.03, {key: float(SOLO.sample(rng, 1)[0])},
                                  overhead_s=float(overhead)))
    profile = orloj.profile
    assert profile.overhead is not None
    assert profile.overhead.mean() == pytest.approx(loaded.mean(), rel=0.1)
    latency = profile.batch_latency(2)
    assert latency.mean() == pytest.approx(
        profile.law.scale(2) * SOLO.expected_max(2) + loaded.mean(), rel=0.05)
    assert latency.quantile(0.99) > profile.law.scale(2) * SOLO.high + quiet.overhead_s
    # a short request with just enough slack for the quiet overhead now has fewer chances
    short = request(1000, 0.0, 0.012 + quiet.overhead_s)
    before = Orloj(ModelProfile.single(SOLO, quiet), orloj.config)
    for o in (orloj, before):
        o._requests[short.key] = short  # as if queued: the chance of a batch of it alone
    chance_now, _ = orloj._on_time([short.key], 0.0)
    chance_quiet, _ = before._on_time([short.key], 0.0)
    assert chance_quiet == pytest.approx(0.5)  # every short one, none of the long ones
    assert chance_now < chance_quiet - 0.2


def test_a_refresh_keeps_the_curves_while_the_distributions_have_not_moved() -> None:
    rng = np.random.default_rng(4)
    config = OrlojConfig(batch_sizes=(1, 2), refresh_every=256, refresh_tolerance=0.05)
    orloj = scheduler(config)
    steady = SOLO.sample(rng, 4096)
    key = 0
    for seconds in steady[:2048]:
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.03, {key: float(seconds)}))
        key += 1
    installed = orloj.profile
    for seconds in steady[2048:]:  # the same distribution: no rebuild
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.03, {key: float(seconds)}))
        key += 1
    assert orloj.profile is installed
    for _ in range(512):  # the model slows down: rebuilt
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.05, {key: 0.05}))
        key += 1
    assert orloj.profile is not installed
    assert orloj.profile.mix.quantile(0.99) == pytest.approx(0.05, rel=0.05)


def test_a_compositions_latency_matches_monte_carlo_with_the_overhead() -> None:
    rng = np.random.default_rng(5)
    short = rng.normal(1e-3, 1e-4, 100_000)
    long = rng.gamma(9.0, 5e-4, 100_000)
    overhead = rng.gamma(4.0, 4e-4, 100_000)
    law = BatchLaw(slope=0.2, overhead_s=0.0)
    profile = ModelProfile(
        {"easy": Distribution.from_samples(short[:4000]),
         "hard": Distribution.from_samples(long[:4000])}, {"easy": 1.0, "hard": 1.0}, law,
        overhead=Distribution.from_samples(overhead[:4000]))
    latency = profile.composition_latency({"easy": 3, "hard": 2})
    draws = (law.scale(5) * np.maximum(rng.choice(short, (50_000, 3)).max(axis=1),
                                        rng.choice(long, (50_000, 2)).max(axis=1))
             + rng.choice(overhead, 50_000))
    assert latency.mean() == pytest.approx(draws.mean(), rel=0.02)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert latency.quantile(q) == pytest.approx(np.quantile(draws, q), rel=0.05)
    # the chance a batch of that composition meets a slack: what goodput selection weighs
    orloj = Orloj(profile, OrlojConfig(batch_sizes=(1, 2, 4, 8), request_aware=True,
                                       selection="goodput"))
    slack = float(np.quantile(draws, 0.7))
    members = [request(k, 0.0, slack, "easy" if k < 3 else "hard") for k in range(5)]
    for r in members:
        orloj._requests[r.key] = r  # as if queued
    on_time, expected = orloj._on_time([r.key for r in members], 0.0)
    assert on_time == pytest.approx(5 * 0.7, abs=5 * 0.03)
    assert expected == pytest.approx(draws.mean(), rel=0.02)


@pytest.mark.parametrize("clear_in_time", [True, False])
def test_long_requests_are_served_in_time_while_everyone_can_be(clear_in_time: bool) -> None:
    """A loose objective, three long requests, and short ones arriving about as fast as they
    are served, on a model that batches poorly (slope 0.5): batches of short ones always
    finish most per second. While the queue can still be cleared in time the long ones are
    served before their deadlines; goodput alone keeps them waiting until they cannot finish
    even alone (dropped)."""
    short = Distribution.from_knots([0.010, 0.012], [0.0, 1.0])
    long = Distribution.from_knots([0.030, 0.034], [0.0, 1.0])
    profile = ModelProfile({"short": short, "long": long}, {"short": 1.0, "long": 1.0},
                           BatchLaw(slope=0.5))
    orloj = Orloj(profile, OURS.model_copy(update={"clear_in_time": clear_in_time}))
    longs = {-1, -2, -3}
    for key in longs:
        orloj.enqueue(request(key, 0.0, 0.150, "long"), 0.0)
    now, key, on_time, dropped = 0.0, 1, set(), set()
    while now < 0.2:
        for _ in range(4):  # each with 150 ms
            orloj.enqueue(request(key, now, now + 0.150, "short"), now)
            key += 1
        decision = orloj.next_batch(now)
        took = decision.expected_latency_s or 0.001
        on_time |= {r.key for r in decision.batch if now + took <= r.deadline_s}
        dropped |= {d.request.key for d in decision.drops}
        now += took
    assert (longs <= on_time) is clear_in_time
    assert (longs <= dropped) is not clear_in_time


def test_a_background_refresh_is_a_frozen_job_installed_when_it_comes_back() -> None:
    config = OURS.model_copy(update={"refresh_every": 50, "background_refresh": True})
    orloj = scheduler(config)
    first = orloj.profile
    for key in range(2):  # decisions build curves and latencies the refresh builds ahead
        orloj.enqueue(request(key, 0.0, 1.0), 0.0)
    orloj.next_batch(0.0)
    in_use = orloj.planning.keys()
    assert in_use.curves and in_use.compositions
    for key in range(10, 60):
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.05, {key: 0.05}))
    assert orloj.profile is first  # due, but left to the caller
    job = orloj.refresh_job()
    assert job is not None
    assert orloj.refresh_job() is None  # one out at a time
    for key in range(60, 200):  # measurements after the job was made are not in it
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.2, {key: 0.2}))
    orloj.enqueue(request(500, 0.0, 1.0), 0.0)  # waiting while the job runs
    planning = job()
    assert planning is not None
    assert planning.profile.mix.quantile(0.99) == pytest.approx(0.05, rel=0.05)
    built = planning.keys()  # everything in use was built ahead
    assert set(in_use.curves) <= set(built.curves)
    assert set(in_use.compositions) <= set(built.compositions)
    assert orloj.profile is first
    orloj.install(planning, 0.01)
    assert orloj.planning is planning
    decision = orloj.next_batch(0.01)  # the request that waited is still served
    assert [r.key for r in decision.batch] == [500]
    job = orloj.refresh_job()  # the slower measurements since are due in turn
    assert job is not None
    orloj.install(None, 0.02)  # a failed or unchanged job keeps the planning in use
    assert orloj.planning is planning
    assert orloj.refresh_job() is None  # not due again until more measurements


def test_an_unmoved_profile_comes_back_as_no_planning() -> None:
    rng = np.random.default_rng(6)
    config = OrlojConfig(batch_sizes=(1, 2), refresh_every=256, refresh_tolerance=0.05,
                         background_refresh=True)
    orloj = scheduler(config)
    for key, seconds in enumerate(SOLO.sample(rng, 512)):
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.03, {key: float(seconds)}))
    job = orloj.refresh_job()
    assert job is not None and job() is None  # the window matches the profile in use
    orloj.install(None, 0.0)
    for key, seconds in enumerate(SOLO.sample(rng, 256), start=1000):
        orloj.completed(BatchDone((request(key, 0.0, 1.0),), 0.0, 0.03, {key: float(seconds)}))
    job = orloj.refresh_job()
    assert job is not None and job() is None
