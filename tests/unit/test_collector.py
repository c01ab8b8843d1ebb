"""The cycle collector's pacing: long-lived objects frozen, full collections only when quiet."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from controller.collector import pace_collector


def test_objects_are_frozen_and_collected_in_full_only_at_a_quiet_moment(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="controller.collector")

    async def body() -> None:
        quiet = asyncio.Event()  # a failover under way: no full collection
        pacer = asyncio.ensure_future(pace_collector(quiet, freeze_every_s=0.01,
                                                     full_every_s=0.0))
        try:
            await asyncio.sleep(0.05)
            assert gc.get_freeze_count() > 0
            assert not [r for r in caplog.records if "full garbage" in r.getMessage()]
            quiet.set()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if any("full garbage" in r.getMessage() for r in caplog.records):
                    break
            assert any("full garbage" in r.getMessage() for r in caplog.records)
            assert gc.get_freeze_count() > 0  # frozen again after the full collection
        finally:
            pacer.cancel()
            gc.unfreeze()

    asyncio.run(body())
