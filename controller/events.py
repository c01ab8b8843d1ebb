"""Event fan-out: every placement change goes to Redis first, then to live subscribers.

A subscriber (a websocket) gets a bounded queue. It first receives what it missed
(``since`` replay from the stream), then live events, with no gap and no duplicate: the
subscription is registered before the replay is read, and live events with a sequence number
already replayed are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from controller.records import Event
from controller.store import Store

logger = logging.getLogger(__name__)

SUBSCRIBER_QUEUE = 10_000


@dataclass(eq=False)
class _Subscriber:
    app_id: str | None
    queue: asyncio.Queue[Event | None] = field(
        default_factory=lambda: asyncio.Queue(SUBSCRIBER_QUEUE))
    closed: bool = False


class EventHub:
    """Appends events to the store and pushes them to subscribers."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._subscribers: set[_Subscriber] = set()
        self.published = 0

    async def publish(self, event: Event) -> Event:
        """Persist, then push. Returns the event with its sequence number."""
        stored = await self.store.append_event(event)
        self.deliver([stored])
        return stored

    def deliver(self, events: list[Event]) -> None:
        """Push events already persisted (``Store.commit``) to the live subscribers."""
        for stored in events:
            self._push(stored)

    def _push(self, stored: Event) -> None:
        self.published += 1
        for subscriber in list(self._subscribers):
            if subscriber.app_id not in (None, stored.app_id):
                continue
            try:
                subscriber.queue.put_nowait(stored)
            except asyncio.QueueFull:
                # A consumer this far behind is cut off; it reconnects with ?since=.
                logger.warning("event subscriber too slow; disconnecting it")
                self._end_after_queue(subscriber)
        logger.info("event %d %s %s -> %s/%s (%s)", stored.seq, stored.kind, stored.app_id,
                    stored.server_id, stored.variant, stored.reason)

    def subscribe(self, app_id: str | None, since: int | None) -> Subscription:
        """Replay events after ``since`` (when given), then follow live ones, until closed."""
        return Subscription(self, app_id, since)

    async def _follow(self, subscriber: _Subscriber, since: int | None
                      ) -> AsyncGenerator[Event, None]:
        try:
            last = since or 0
            if since is not None:
                replay = await self.store.events(since, subscriber.app_id, limit=100_000)
                for event in replay:
                    if subscriber.closed:
                        return
                    last = max(last, event.seq)
                    yield event
            while not subscriber.closed:
                live = await subscriber.queue.get()
                if live is None:
                    return
                if live.seq <= last:
                    continue
                last = live.seq
                yield live
        finally:
            self._subscribers.discard(subscriber)

    def _end_after_queue(self, subscriber: _Subscriber) -> None:
        """End one subscription once it has taken what is queued for it (the end marker)."""
        self._subscribers.discard(subscriber)
        if subscriber.queue.full():
            subscriber.queue.get_nowait()  # room for the end marker; a replay covers the loss
        subscriber.queue.put_nowait(None)

    def _end(self, subscriber: _Subscriber) -> None:
        """End one subscription now: its iteration stops at its next step."""
        subscriber.closed = True
        self._end_after_queue(subscriber)

    def close_all(self) -> None:
        """End every subscription (shutdown)."""
        for subscriber in list(self._subscribers):
            self._end_after_queue(subscriber)


class Subscription:
    """One subscriber's events, an async iterator that its owner ends with :meth:`close`.

    Registered at once (before any replay is read, so no live event is missed). Ending it does
    not depend on cancelling the task that iterates it: the Redis client can lose a
    cancellation that arrives during a command (the replay's read), and a task whose
    cancellation was lost then waited on its queue for ever, holding its websocket handler
    open; a controller told to stop waited for such handlers until its graceful timeout.
    """

    def __init__(self, hub: EventHub, app_id: str | None, since: int | None) -> None:
        self._hub = hub
        self._subscriber = _Subscriber(app_id)
        hub._subscribers.add(self._subscriber)
        self._events = hub._follow(self._subscriber, since)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    def close(self) -> None:
        """End the subscription: the iteration stops at its next step (now, if it waits)."""
        if not self._subscriber.closed:
            self._hub._end(self._subscriber)

    async def aclose(self) -> None:
        """Close, then finish the generator behind it (no task may be iterating it)."""
        self.close()
        await self._events.aclose()
