"""The controller's Redis store against a real redis-server: the batched failover commit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.events import EventHub
from controller.records import AppRecord, AppSpec, Event, ServerRecord, ServerState
from controller.redis_server import RedisServer
from controller.store import Store


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server.url
    server.stop()


def _app(app_id: str) -> AppRecord:
    return AppRecord(spec=AppSpec(app_id=app_id, family="mobilenet_v3"))


def test_commit_writes_records_intent_and_numbered_events(redis_url: str) -> None:
    async def scenario() -> None:
        store = Store(redis_url)
        hub = EventHub(store)
        try:
            await store.put_app(_app("a"))
            await store.put_server(ServerRecord(server_id="s1", site_id="x",
                                                capacity={"memory_mb": 1.0}))
            earlier = await hub.publish(Event(app_id="a", kind="registered"))
            apps, servers = await store.apps_and_servers()
            assert set(apps) == {"a"} and set(servers) == {"s1"}

            subscription = hub.subscribe(None, since=earlier.seq)
            first_live = asyncio.ensure_future(subscription.__anext__())
            await asyncio.sleep(0.05)
            servers["s1"].state = ServerState.FAILED
            apps["a"].reason = "switched"
            events = [Event(app_id="a", kind="warm_switch"), Event(app_id="b", kind="x")]
            intent, stored = await store.commit(
                servers=[servers["s1"]], apps=[apps["a"], _app("b")], events=events,
                intent={"kind": "failover", "server_id": "s1"})
            hub.deliver(stored)

            assert [e.seq for e in stored] == [earlier.seq + 1, earlier.seq + 2]
            assert (await asyncio.wait_for(first_live, 5)).seq == earlier.seq + 1
            apps, servers = await store.apps_and_servers()
            assert servers["s1"].state is ServerState.FAILED
            assert apps["a"].reason == "switched" and "b" in apps
            intents = await store.intents()
            assert intent is not None and intents[intent]["server_id"] == "s1"
            assert intents[intent]["kind"] == "failover" and "at" in intents[intent]
            replayed = await store.events(since=0)
            assert [(e.seq, e.kind) for e in replayed] == [
                (earlier.seq, "registered"), (earlier.seq + 1, "warm_switch"),
                (earlier.seq + 2, "x")]
            # The next single event continues the numbering.
            after = await hub.publish(Event(app_id="a", kind="upgraded"))
            assert after.seq == earlier.seq + 3
            await subscription.aclose()
        finally:
            await store.close()

    asyncio.run(scenario())


def test_commit_without_events_or_intent(redis_url: str) -> None:
    async def scenario() -> None:
        store = Store(redis_url)
        try:
            intent, stored = await store.commit(apps=[_app("c")])
            assert intent is None and stored == []
            assert (await store.get_app("c")) is not None
            assert await store.last_seq() == 0
        finally:
            await store.close()

    asyncio.run(scenario())


def test_declaration_log_keeps_every_writer_s_fields(redis_url: str) -> None:
    from controller.declarations import Declaration, DeclarationLog

    async def scenario() -> None:
        store = Store(redis_url)
        log = DeclarationLog(store.redis, store.prefix)
        try:
            first = await log.add(Declaration(server_id="s1", reason="connection closed",
                                              detected_at=10.0, last_seen=9.9))
            second = await log.add(Declaration(server_id="s1", reason="missed heartbeats",
                                               detected_at=20.0, last_seen=19.9,
                                               apps_affected=["a", "b"]))
            # The failover's moved apps and the revival land together: neither is lost.
            await asyncio.gather(log.update(second.seq, apps_moved=["a"]),
                                 log.mark_alive("s1", 20.1, same_boot=None))
            listed = await log.list()
            assert [d.seq for d in listed] == [first.seq, second.seq] == [1, 2]
            assert listed[1].apps_moved == ["a"] and listed[1].alive_again == 20.1
            assert listed[0].alive_again is None  # only the latest one is marked
            await log.mark_alive("s1", 30.0, same_boot=True)  # already marked: kept
            assert (await log.latest("s1")).alive_again == 20.1  # type: ignore[union-attr]
            assert [d.seq for d in await log.list(since=1)] == [2]
            assert await log.list(since=2) == []
            # A site's declarations in one write, numbered after the others, in order.
            site = await log.add_many([
                Declaration(server_id=s, reason="missed heartbeats", detected_at=40.0,
                            last_seen=39.9) for s in ("s2", "s3", "s1")])
            assert [(d.seq, d.server_id) for d in site] == [(3, "s2"), (4, "s3"), (5, "s1")]
            assert [d.seq for d in await log.list(since=2)] == [3, 4, 5]
            assert (await log.latest("s1")).seq == 5  # type: ignore[union-attr]
            assert await log.add_many([]) == []
        finally:
            await store.close()

    asyncio.run(scenario())
