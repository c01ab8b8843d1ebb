"""Event fan-out: every placement change goes to Redis first, then to live subscribers.

A subscriber (a websocket) gets a bounded queue. It first receives what it missed
(``since`` replay from the stream), then live events, with no gap and no duplicate: the
subscription is registered before the replay is read, and live events with a sequence number
already replayed are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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
                self._subscribers.discard(subscriber)
                subscriber.queue.get_nowait()  # make room for the end marker; replay covers it
                subscriber.queue.put_nowait(None)
        logger.info("event %d %s %s -> %s/%s (%s)", stored.seq, stored.kind, stored.app_id,
                    stored.server_id, stored.variant, stored.reason)

    async def subscribe(self, app_id: str | None, since: int | None) -> AsyncIterator[Event]:
        """Replay events after ``since`` (when given), then follow live ones."""
        subscriber = _Subscriber(app_id)
        self._subscribers.add(subscriber)
        try:
            last = since or 0
            if since is not None:
                for event in await self.store.events(since, app_id, limit=100_000):
                    last = max(last, event.seq)
                    yield event
            while True:
                event = await subscriber.queue.get()
                if event is None:
                    return
                if event.seq <= last:
                    continue
                last = event.seq
                yield event
        finally:
            self._subscribers.discard(subscriber)

    def close_all(self) -> None:
        """End every subscription (shutdown)."""
        for subscriber in list(self._subscribers):
            subscriber.queue.put_nowait(None)
        self._subscribers.clear()
