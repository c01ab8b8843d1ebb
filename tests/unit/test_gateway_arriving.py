"""A body still arriving: its listeners hear every part once, waiters wake when it is in."""

from __future__ import annotations

import asyncio

import pytest

from gateway.arriving import ArrivingBody, BodyLostError


def test_listeners_hear_each_part_from_when_they_listen() -> None:
    body = ArrivingBody(bytearray(10), received=2)
    heard: list[tuple[int, int]] = []
    body.listen(lambda start, end: heard.append((start, end)))
    body.grew(6)
    body.grew(10)
    assert heard == [(2, 6), (6, 10)] and body.complete
    body.unlisten(lambda start, end: None)  # not listening: nothing happens


def test_a_listener_that_stops_hears_nothing_more() -> None:
    body = ArrivingBody(bytearray(10), received=0)
    heard: list[tuple[int, int]] = []

    def listener(start: int, end: int) -> None:
        heard.append((start, end))

    body.listen(listener)
    body.grew(3)
    body.unlisten(listener)
    body.grew(10)
    assert heard == [(0, 3)]


def test_waiters_wake_when_the_body_is_in_and_fail_when_it_is_lost() -> None:
    async def scenario() -> None:
        body = ArrivingBody(bytearray(4), received=1)
        waiter = asyncio.ensure_future(body.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        body.grew(4)
        await asyncio.wait_for(waiter, 1)
        await body.wait()  # complete: returns at once

        lost = ArrivingBody(bytearray(4), received=1)
        waiter = asyncio.ensure_future(lost.wait())
        await asyncio.sleep(0)
        lost.lose()
        with pytest.raises(BodyLostError):
            await waiter
        with pytest.raises(BodyLostError):
            await lost.wait()  # and any later waiter

    asyncio.run(scenario())


def test_losing_a_complete_body_changes_nothing() -> None:
    async def scenario() -> None:
        body = ArrivingBody(bytearray(b"abcd"), received=4)
        body.lose()
        await body.wait()

    asyncio.run(scenario())


def test_cut_through_is_on_from_128_kib_by_default_and_0_turns_it_off() -> None:
    from pydantic import ValidationError

    from gateway.config import GatewayConfig

    default = GatewayConfig(controller_url="http://c:1")
    assert default.cut_through_bytes == 128 * 1024
    off = GatewayConfig(controller_url="http://c:1", cut_through_kib=0)
    assert off.cut_through_bytes > off.max_body_bytes  # no body is ever streamed
    with pytest.raises(ValidationError):
        GatewayConfig(controller_url="http://c:1", cut_through_kib=-1)
