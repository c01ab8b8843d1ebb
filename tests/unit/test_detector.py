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

    assert _run(scenario) == [("b", "triton died"), ("a", "connection closed")]


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
