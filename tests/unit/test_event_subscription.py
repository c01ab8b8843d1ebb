"""An event subscription ends when its owner closes it, even when the cancellation of the task
that iterates it is lost in a Redis read (redis-py can swallow one that arrives mid-command):
the websocket handler that owns it must end, or a controller told to stop waits for it."""

from __future__ import annotations

import asyncio

from controller.events import EventHub, Subscription
from controller.records import Event


class SwallowingStore:
    """A store whose replay read loses a cancellation, as the Redis client can."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()

    async def events(self, since: int, app_id: str | None, limit: int) -> list[Event]:
        self.reading.set()
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            pass  # lost: the read goes on as if nothing had happened
        return [Event(app_id="a", kind="registered", seq=since + 1)]


async def _iterate(subscription: Subscription, seen: list[Event]) -> None:
    async for event in subscription:
        seen.append(event)


def _following(store: SwallowingStore
               ) -> tuple[EventHub, Subscription, list[Event], asyncio.Future[None]]:
    """A hub over ``store``, a subscription replaying after seq 5, and a task iterating it."""
    hub = EventHub(store)  # type: ignore[arg-type]
    subscription = hub.subscribe(None, since=5)
    seen: list[Event] = []
    return hub, subscription, seen, asyncio.ensure_future(_iterate(subscription, seen))


def test_a_closed_subscription_ends_though_its_tasks_cancellation_was_lost() -> None:
    async def scenario() -> None:
        store = SwallowingStore()
        hub, subscription, seen, task = _following(store)
        await store.reading.wait()
        subscription.close()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2.0)
        assert done, "the iteration went on waiting after the subscription was closed"
        assert seen == []  # nothing after the close, not even the replay
        assert not hub._subscribers

    asyncio.run(scenario())


def test_an_open_subscription_replays_then_follows_and_close_ends_a_waiting_iteration() -> None:
    async def scenario() -> None:
        hub, subscription, seen, task = _following(SwallowingStore())
        await asyncio.sleep(0.3)  # the replay is read and given
        hub.deliver([Event(app_id="a", kind="warm_switch", seq=7),
                     Event(app_id="a", kind="stale", seq=6)])  # 6 was replayed already
        await asyncio.sleep(0.05)
        assert [(e.seq, e.kind) for e in seen] == [(6, "registered"), (7, "warm_switch")]
        subscription.close()  # the iteration waits on its queue: it ends now
        await asyncio.wait_for(task, 2.0)

    asyncio.run(scenario())
