"""The store against a real Redis holding what it cannot use, and records it must not write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from controller.errors import InvalidRecordError
from controller.records import AppRecord, AppSpec, Event, ServerRecord
from controller.redis_server import RedisServer
from controller.store import Store

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server.url
    server.stop()


def test_keys_of_the_wrong_type_and_a_bad_counter_are_set_aside(redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    raw.set("us:apps", "a string where a hash belongs")
    raw.hset("us:config", "heartbeat_interval_ms", "20")
    raw.hset("us:servers", "s1", json.dumps({"server_id": "s1", "site_id": "a",
                                             "capacity": {"memory_mb": 5.0}}))
    raw.xadd("us:events", {"data": json.dumps({"seq": 5, "app_id": "a", "kind": "x"})},
             id="5-0")
    raw.set("us:event_seq", "five")

    async def scenario() -> None:
        store = Store(redis_url)
        try:
            view = await store.view()
            assert list(view.apps) == [] and list(view.servers) == ["s1"]
            assert await store.config() is None
            # The event counter goes on from the stream's newest event.
            stored = await store.append_event(Event(app_id="a", kind="registered"))
            assert stored.seq == 6
            assert [e.seq for e in await store.events()] == [5, 6]
            await store.put_app(AppRecord(spec=AppSpec(app_id="a", family="f")))
            assert list((await store.view()).apps) == ["a"]
        finally:
            await store.close()

    asyncio.run(scenario())
    set_aside = sorted(k.split(":")[2] for k in raw.keys("us:quarantine:*"))
    assert set_aside == ["apps", "config"]
    assert raw.get(raw.keys("us:quarantine:apps:*")[0]) == "a string where a hash belongs"
    reasons = [json.loads(v)["key"] for v in raw.hvals("us:quarantine")]
    assert reasons == ["us:event_seq"]


def test_a_record_that_would_not_read_back_is_never_written(redis_url: str) -> None:
    async def scenario() -> None:
        store = Store(redis_url)
        try:
            good = ServerRecord(server_id="s1", site_id="a", capacity={"memory_mb": 5.0})
            await store.put_server(good)
            bad = good.model_copy()
            bad.capacity = {"memory_mb": float("nan")}  # written as null: unreadable
            with pytest.raises(InvalidRecordError, match="capacity"):
                await store.put_server(bad)
            app = AppRecord(spec=AppSpec(app_id="a", family="f"))
            app.serving = ("", "v")
            with pytest.raises(InvalidRecordError):
                await store.commit(apps=[app], servers=[good],
                                   events=[Event(app_id="a", kind="x")])
            assert (await store.view()).servers["s1"].capacity == {"memory_mb": 5.0}
            assert await store.events() == [] and await store.get_app("a") is None
        finally:
            await store.close()

    asyncio.run(scenario())
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    assert json.loads(raw.hget("us:servers", "s1"))["capacity"] == {"memory_mb": 5.0}
    assert not raw.exists("us:apps") and not raw.exists("us:events")
