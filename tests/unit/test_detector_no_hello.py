"""A server the controller watches but whose agent never says hello is declared.

After a controller restart, every server the records show up gets ``startup_grace_s`` to say
hello. The heartbeat monitor only knows servers that did (their heartbeat channel), so a
server killed while the controller was restarting used to stay up in the records forever.
The monitor process is not started here: these are the detector's own timers.
"""

from __future__ import annotations

import asyncio

from controller.detector import FailureDetector

GRACE_S = 0.05


def detector() -> tuple[FailureDetector, list[tuple[str, str]]]:
    declared: list[tuple[str, str]] = []
    found = FailureDetector(0.02, 2, lambda server, reason, *_: declared.append((server,
                                                                                  reason)))
    found.port = 9  # as if the monitor had bound it (the channel needs one)
    return found, declared


def test_a_server_with_no_hello_within_its_grace_is_declared() -> None:
    async def body() -> None:
        found, declared = detector()
        found.watch("s1", grace_s=GRACE_S)
        await asyncio.sleep(GRACE_S / 2)
        assert declared == []
        await asyncio.sleep(GRACE_S * 2)
        assert declared == [("s1", "no hello since the controller started")]
        assert not found.watching("s1")
    asyncio.run(body())


def test_a_server_that_says_hello_in_time_is_left_to_the_monitor() -> None:
    async def body() -> None:
        found, declared = detector()
        found.watch("s1", grace_s=GRACE_S)
        found.admit("s1", None)
        found.watch("s1")
        await asyncio.sleep(GRACE_S * 3)
        assert declared == []
        assert found.watching("s1")
    asyncio.run(body())


def test_a_server_forgotten_or_watched_again_is_not_declared_by_an_old_timer() -> None:
    async def body() -> None:
        found, declared = detector()
        found.watch("s1", grace_s=GRACE_S)
        found.forget("s1")
        found.watch("s2", grace_s=GRACE_S)
        found.watch("s2", grace_s=10 * GRACE_S)  # a later watch replaces the first
        await asyncio.sleep(GRACE_S * 3)
        assert declared == []
        await asyncio.sleep(GRACE_S * 9)
        assert declared == [("s2", "no hello since the controller started")]
    asyncio.run(body())
