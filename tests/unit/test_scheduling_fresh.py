"""Arrivals to an idle queue: ranked without the size queues, batched as the queues would."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

import scheduling.orloj
from scheduling.distribution import Distribution, mixture
from scheduling.fresh import FreshQueue, fresh_queues
from scheduling.hull import SMALL
from scheduling.orloj import Orloj
from scheduling.orloj_config import OURS, OrlojConfig
from scheduling.priority import DEAD, Curve
from scheduling.profile import ModelProfile
from scheduling.size_queue import Member, SizeQueue
from scheduling.types import BatchLaw, QueuedRequest

LATENCY = mixture([Distribution.from_knots([0.010, 0.014], [0.0, 1.0]),
                   Distribution.point(0.030)], [0.7, 0.3])


def test_placed_is_the_regime_the_point_and_the_milestone_in_one() -> None:
    curve = Curve.build(LATENCY, 0.02, bins=8, min_probability=0.1)
    now = 5.0
    for slack in np.linspace(0.0, 0.08, 161):
        deadline = now + float(slack)
        regime, a, beta, leaves_at = curve.placed(deadline, now)
        assert regime == curve.regime(deadline - now)
        if regime == DEAD:
            continue
        assert (a, beta) == curve.point(regime, deadline - now)
        assert leaves_at == curve.leaves_at(regime, deadline)


@pytest.mark.parametrize("ties", [False, True])
def test_a_fresh_queue_ranks_as_a_size_queue(ties: bool) -> None:
    rng = random.Random(7)
    for _ in range(300):
        size = rng.choice([1, 2, 4])
        fresh, placed = FreshQueue(size), SizeQueue(size)
        for key in range(rng.randint(1, SMALL)):
            point = (float(rng.randint(0, 3)), float(rng.randint(0, 3))) if ties else \
                (rng.uniform(0, 5), rng.uniform(-1, 1))
            fresh.add(key, point, float(key))
            placed.hull.insert(key, *point)
            placed.members[key] = Member(0, 0)
        u = rng.uniform(0.5, 3.0)
        count = rng.choice([0, 1, 3, 8])
        assert fresh.top(u, count) == placed.top(u, count)
        assert fresh.earliest() == 0.0


def curves(min_probability: float) -> Callable[[str, int], Curve]:
    built = {n: Curve.build(LATENCY.affine(1 + 0.2 * (n - 1), 0.0), 0.02, bins=8,
                            min_probability=min_probability) for n in (1, 2, 4, 8)}
    return lambda app, n: built[n]


def test_a_request_joins_every_size_it_can_still_make_and_sizes_never_ready_are_left_out(
        ) -> None:
    curve_of = curves(0.1)
    now = 1.0
    loose = QueuedRequest("loose", "app", now, now + 0.2)  # makes every size
    tight = QueuedRequest("tight", "app", now, now + 0.0115)  # alone, barely
    queues = fresh_queues([loose, tight], now, curve_of, (1, 2, 4, 8))
    assert queues is not None
    # two requests: a queue of 4 or 8 is never ready (the queue of 2 can hold them both)
    assert [q.size for q in queues] == [1, 2]
    assert list(queues[0].members) == ["loose", "tight"]
    assert list(queues[1].members) == ["loose"]
    assert queues[0].earliest() == tight.deadline_s


def test_too_many_requests_are_left_to_the_size_queues() -> None:
    now = 0.0
    many = [QueuedRequest(k, "app", now, now + 0.2) for k in range(SMALL + 1)]
    assert fresh_queues(many, now, curves(0.0), (1, 2, 4, 8)) is None
    assert fresh_queues(many[:SMALL], now, curves(0.0), (1, 2, 4, 8)) is not None


class _AlwaysQueued(Orloj):
    """Orloj that places every arrival in the queues before deciding (no idle shortcut)."""

    def _fresh_choice(self, requests: list[QueuedRequest], now_s: float) -> None:
        return None


def _profiles(rng: np.random.Generator) -> dict[str, ModelProfile]:
    short = Distribution.from_samples(rng.uniform(0.002, 0.004, 500))
    long = Distribution.from_samples(rng.uniform(0.010, 0.014, 500))
    law = BatchLaw(slope=0.2, overhead_s=0.001)
    mixed = Distribution.from_samples(np.concatenate([rng.uniform(0.002, 0.004, 250),
                                                      rng.uniform(0.010, 0.014, 250)]))
    return {
        "two apps": ModelProfile({"short": short, "long": long},
                                 {"short": 1.0, "long": 1.0}, law),
        "one app": ModelProfile({"short": mixed}, {"short": 1.0}, law),
        "static": ModelProfile({"short": long}, {"short": 1.0}, law, per_batch=True),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", ["two apps", "one app", "static", "paper"])
def test_the_idle_queue_shortcut_sends_the_batch_the_queues_would(
        seed: int, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrivals to an idle queue are batched without being placed: the same decisions."""
    rng = np.random.default_rng(seed)
    profile = _profiles(rng)["two apps" if case == "paper" else case]
    apps = list(profile.apps)
    departures = {} if case == "paper" else OURS
    config = OrlojConfig(batch_sizes=(1, 2, 4, 8), **departures)
    ranked_fresh = 0

    def counted(*args: object, **kwargs: object) -> list[FreshQueue] | None:
        nonlocal ranked_fresh
        ranked_fresh += 1
        return fresh_queues(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scheduling.orloj, "fresh_queues", counted)
    fast, queued = Orloj(profile, config), _AlwaysQueued(profile, config)
    now, key, shortcuts = 0.0, 0, 0
    for _ in range(600):
        for _ in range(int(rng.integers(0, 6))):  # what arrived while the worker was busy
            key += 1
            app = apps[int(rng.integers(0, len(apps)))]
            arrival = now + float(rng.uniform(0.0, 0.004))
            deadline = arrival + float(rng.uniform(0.004, 0.040))
            for orloj in (fast, queued):
                orloj.enqueue(QueuedRequest(key, app, arrival, deadline), now)
        now += 0.004
        idle = not fast._requests and len(fast._arrived) > 1
        got, want = fast.next_batch(now), queued.next_batch(now)
        assert [r.key for r in got.batch] == [r.key for r in want.batch]
        # the same drops; the queues find those they hold at their milestones, in that order
        assert sorted((d.request.key, d.reason) for d in got.drops) == \
            sorted((d.request.key, d.reason) for d in want.drops)
        assert got.expected_latency_s == want.expected_latency_s
        assert len(fast) == len(queued)
        shortcuts += idle and len(got.batch) > 0
        if got.batch:
            now += 0.003 * len(got.batch)
    assert shortcuts > 20  # the shortcut was taken, not only the queues' path
    assert ranked_fresh > 20  # and not only for the clearing schedule's first batch
