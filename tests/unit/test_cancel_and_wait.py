"""Background tasks end at shutdown even when their first cancellation is lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controller.stopping import cancel_and_wait


async def _loses_one_cancellation(ended: list[str]) -> None:
    """A loop whose first cancellation is swallowed, as redis-py has done during a read."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # lost: the loop carries on
    try:
        while True:
            await asyncio.sleep(0.01)
    finally:
        ended.append("stubborn")


async def _plain(ended: list[str]) -> None:
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("plain")


async def _failing() -> None:
    raise RuntimeError("already failed")


def test_a_task_that_loses_its_cancellation_is_cancelled_again_and_ends() -> None:
    async def scenario() -> tuple[list[asyncio.Future[None]], list[str], list[bool]]:
        ended: list[str] = []
        tasks = [asyncio.ensure_future(_loses_one_cancellation(ended)),
                 asyncio.ensure_future(_plain(ended)), asyncio.ensure_future(_failing())]
        await asyncio.sleep(0.01)
        left = await cancel_and_wait(tasks, timeout_s=2.0)
        return left, ended, [t.done() for t in tasks]

    left, ended, done = asyncio.run(scenario())
    assert left == [] and sorted(ended) == ["plain", "stubborn"] and all(done)


def test_a_task_that_never_ends_is_named_after_the_bound(
        caplog: pytest.LogCaptureFixture) -> None:
    async def immortal() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    async def scenario() -> int:
        task = asyncio.ensure_future(immortal())
        await asyncio.sleep(0)
        left = await cancel_and_wait([task], timeout_s=0.2)
        assert left == [task]
        return len(left)

    with caplog.at_level(logging.WARNING, logger="controller.stopping"):
        # asyncio.run cancels what is left at exit; the immortal task then blocks forever,
        # so run on a loop that is closed without that final cancellation.
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(scenario()) == 1
        finally:
            loop.close()
    assert any("did not end" in record.message for record in caplog.records)
