"""The failure detector on a real event loop (T = 50 ms so a busy machine does not matter)."""

from __future__ import annotations

import asyncio

from controller.detector import FailureDetector

T = 0.05


def _run(scenario) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    declared: list[tuple[str, str]] = []

    async def main() -> None:
        detector = FailureDetector(T, 2, lambda s, why, at, seen: declared.append((s, why)))
        await scenario(detector)
        detector.stop()

    asyncio.run(main())
    return declared


def test_heartbeats_keep_a_server_alive_and_silence_fails_it() -> None:
    async def scenario(detector: FailureDetector) -> None:
        detector.watch("s1")
        detector.watch("s2")
        for _ in range(12):
            await asyncio.sleep(T)
            detector.beat("s1")
        assert detector.watching("s1") and not detector.watching("s2")

    assert _run(scenario) == [("s2", "missed heartbeats")]


def test_closed_connection_and_triton_death() -> None:
    async def scenario(detector: FailureDetector) -> None:
        detector.watch("a")
        detector.watch("b")
        detector.connection_closed("a")
        detector.declare("b", "triton died")
        await asyncio.sleep(T * 2)

    # Both immediate: declared when they happen, with no confirmation wait.
    assert _run(scenario) == [("a", "connection closed"), ("b", "triton died")]


def test_each_failure_is_declared_once_until_watched_again() -> None:
    async def scenario(detector: FailureDetector) -> None:
        detector.watch("s")
        await asyncio.sleep(T * 4)
        detector.beat("s")  # late heartbeat of a failed server: no second declaration
        detector.declare("s", "again")
        await asyncio.sleep(T * 4)

    assert _run(scenario) == [("s", "missed heartbeats")]


def test_timeout_adapts_to_gaps_and_false_alarms() -> None:
    async def scenario(detector: FailureDetector) -> None:
        assert detector.timeout_for("s") == detector.timeout_s == 2.5 * T
        detector.watch("s")
        detector.beat("s")
        await asyncio.sleep(2 * T)
        detector.beat("s")  # a 100 ms gap: the limit grows to at least 1.5 x that
        assert detector.timeout_for("s") >= 1.5 * 2 * T
        before = detector.timeout_for("s")
        detector.false_alarm("s")
        assert abs(detector.timeout_for("s") - 2 * before) < 1e-9
        detector.forget("s")

    assert _run(scenario) == []


def test_gap_window_maximum_matches_a_plain_window() -> None:
    import random
    from collections import deque

    from controller.detector import _GapWindow

    rng = random.Random(7)
    window, plain = _GapWindow(5), deque(maxlen=5)
    for _ in range(500):
        gap = rng.choice([rng.random(), 0.5, 0.5])  # ties included
        window.add(gap)
        plain.append(gap)
        assert window.max() == max(plain)


def test_a_silent_server_fails_one_timeout_after_its_last_heartbeat() -> None:
    """Heartbeats only move the deadline; the timer must still fire on time after them."""
    timings: list[float] = []

    async def scenario(detector: FailureDetector) -> None:
        loop = asyncio.get_running_loop()
        detector.listeners = [lambda s, why, at, seen: timings.append(loop.time())]
        detector.watch("s")
        for _ in range(5):
            await asyncio.sleep(T / 2)
            detector.beat("s")
        last = loop.time()
        await asyncio.sleep(detector.timeout_s * 3)
        assert len(timings) == 1
        # Declared after the timeout (plus the confirmation), not at the first timer's time.
        assert detector.timeout_s <= timings[0] - last <= detector.timeout_s + T

    _run(scenario)


def test_a_heartbeat_while_a_declaration_is_confirming_cancels_it() -> None:
    async def scenario(detector: FailureDetector) -> None:
        loop = asyncio.get_running_loop()
        detector.watch("s", grace_s=T)
        watch = detector._watches["s"]
        while not watch.confirming:  # the deadline passed; the declaration waits CONFIRM_S
            await asyncio.sleep(0)
            assert loop.time() < watch.due + T, "the deadline never fired"
        detector.beat("s")
        await asyncio.sleep(T)
        assert detector.watching("s")
        detector.forget("s")

    assert _run(scenario) == []
