"""A runtime worker's priority as it starts to serve: boosted to the loads' niceness for its
first answers after idling, then yielding to loads again."""

from __future__ import annotations

import pytest

from model_repo.worker_priority import (
    LOADING_NICE_STEP,
    SERVING_NICE_STEP,
    STARTING_BOOST_ENV,
    STARTING_BOOST_S,
    STARTING_IDLE_S,
    ServingPace,
    starting_boost_s,
)

BASE = 5
BOOSTED = BASE - LOADING_NICE_STEP
SERVING = BASE + SERVING_NICE_STEP


def test_the_first_request_boosts_until_the_boost_ends() -> None:
    pace = ServingPace(BASE)
    assert pace.request(100.0) == BOOSTED
    pace.answered(100.01)
    # Requests inside the boost change nothing.
    assert pace.request(100.05) is None
    pace.answered(100.06)
    assert pace.idle(100.0 + STARTING_BOOST_S / 2) is None
    # The boost ends when its time passes, whether a request or the wait notices.
    assert pace.idle(100.0 + STARTING_BOOST_S) == SERVING
    assert pace.boosted_until is None
    assert pace.idle(200.0) is None


def test_a_request_after_the_boost_ended_yields_without_boosting_again() -> None:
    pace = ServingPace(BASE)
    pace.request(0.0)
    now = 0.0
    while now < STARTING_BOOST_S + 0.5:  # a steady stream, 100 requests/s
        pace.answered(now + 0.005)
        now += 0.01
        change = pace.request(now)
        assert change in (None, SERVING)
        if now >= STARTING_BOOST_S:
            assert pace.boosted_until is None
    assert pace.boosted_until is None


def test_a_request_after_idling_boosts_again() -> None:
    pace = ServingPace(BASE)
    pace.request(0.0)
    pace.answered(0.01)
    assert pace.idle(STARTING_BOOST_S) == SERVING
    # Idle just under the threshold: still serving as usual.
    assert pace.request(0.01 + STARTING_IDLE_S * 0.9) is None
    pace.answered(0.01 + STARTING_IDLE_S * 0.9)
    later = 0.01 + STARTING_IDLE_S * 0.9 + STARTING_IDLE_S
    assert pace.request(later) == BOOSTED
    assert pace.boosted_until == later + STARTING_BOOST_S


def test_niceness_stays_within_the_os_range() -> None:
    assert ServingPace(-18).request(0.0) == -20
    pace = ServingPace(17)
    pace.request(0.0)
    assert pace.idle(STARTING_BOOST_S) == 19


def test_no_boost_when_its_length_is_zero() -> None:
    pace = ServingPace(BASE, boost_s=0.0)
    assert pace.request(0.0) is None
    assert pace.boosted_until is None


def test_the_boost_length_comes_from_the_environment_and_is_validated() -> None:
    assert starting_boost_s({}) == STARTING_BOOST_S
    assert starting_boost_s({STARTING_BOOST_ENV: "0"}) == 0.0
    assert starting_boost_s({STARTING_BOOST_ENV: "2.5"}) == 2.5
    for bad in ("nan", "inf", "-1", "61", "soon"):
        with pytest.raises(ValueError):
            starting_boost_s({STARTING_BOOST_ENV: bad})
