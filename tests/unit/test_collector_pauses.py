"""The servers' garbage-collector passes: the start-up heap frozen, every pass timed."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

from gateway.metrics import GatewayMetrics
from understudy.cli.pauses import LONG_PAUSE_S, CollectorPauses, freeze_start_up_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the test process's collector as it was (other tests run in it)."""
    assert gc.get_freeze_count() == 0
    try:
        yield
    finally:
        gc.unfreeze()


def test_freezing_exempts_the_objects_alive_now_from_later_passes(unfrozen: None) -> None:
    before = [object() for _ in range(3)]  # plain objects are not tracked; lists are
    kept = [[i] for i in range(1000)]
    frozen = freeze_start_up_heap()
    assert frozen == gc.get_freeze_count() >= len(kept)
    made_after = [[i] for i in range(10)]
    # the frozen objects are no longer in any generation a pass walks; the new ones are
    walked = {id(o) for o in gc.get_objects()}
    assert not any(id(item) in walked for item in kept)
    assert all(id(item) in walked for item in made_after)
    assert before  # kept alive to the end


def test_every_pass_is_timed_by_generation_until_uninstalled() -> None:
    seen: list[tuple[int, float]] = []
    pauses = CollectorPauses(lambda generation, seconds: seen.append((generation, seconds)))
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.uninstall()
    assert [g for g, _ in seen][-2:] == [2, 0]
    assert all(seconds >= 0 for _, seconds in seen)
    count = len(seen)
    gc.collect()
    assert len(seen) == count


def test_a_long_pass_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[int, float]] = []
    clock = iter([10.0, 10.0 + 2 * LONG_PAUSE_S])
    pauses = CollectorPauses(lambda generation, seconds: seen.append((generation, seconds)),
                             clock=lambda: next(clock))
    with caplog.at_level(logging.WARNING, logger="understudy.cli.pauses"):
        pauses._callback("start", {"generation": 2})
        pauses._callback("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    assert seen == [(2, pytest.approx(2 * LONG_PAUSE_S))]
    assert "generation 2 took 20.0 ms" in caplog.text


def test_a_stop_without_its_start_is_ignored() -> None:
    seen: list[tuple[int, float]] = []
    pauses = CollectorPauses(lambda generation, seconds: seen.append((generation, seconds)))
    pauses._callback("stop", {"generation": 1})
    assert seen == []


def test_the_gateway_exposes_the_passes_by_generation() -> None:
    metrics = GatewayMetrics()
    metrics.collector_paused(2, 0.03)
    metrics.collector_paused(0, 0.0002)
    text = metrics.render().decode()
    assert 'understudy_gateway_gc_pause_seconds_count{generation="2"} 1.0' in text
    assert 'understudy_gateway_gc_pause_seconds_bucket{generation="2",le="0.01"} 0.0' in text
    assert 'understudy_gateway_gc_pause_seconds_bucket{generation="0",le="0.0005"} 1.0' in text
