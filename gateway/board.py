"""The routing table on the event loop: requests read routes and wait for an app's next change.

Each app with waiters has one shared future, resolved with the :class:`RouteChange` when the
app's routes change and replaced by a fresh one, so a request in flight learns of a move
without polling and without a future of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.routes import AppRoute, RouteChange, RoutingTable

logger = logging.getLogger(__name__)

ChangeListener = Callable[[RouteChange], None]


class RouteBoard:
    """The gateway's routing table, and who waits for which app to change."""

    def __init__(self, table: RoutingTable | None = None) -> None:
        self.table = table or RoutingTable()
        self.loaded = asyncio.Event()
        """Set once the table came from the controller or from a persisted file."""
        if table is not None:
            self.loaded.set()
        self.dirty = False
        """Changed since it was last persisted."""
        self._changed: dict[str, asyncio.Future[RouteChange]] = {}
        self._listeners: list[ChangeListener] = []

    def route(self, app_id: str) -> AppRoute | None:
        """The app's routes; None for an app the gateway does not know."""
        return self.table.apps.get(app_id)

    def changed(self, app_id: str) -> asyncio.Future[RouteChange]:
        """A future resolved at the app's next change (shared by every waiter)."""
        future = self._changed.get(app_id)
        if future is None or future.done():
            future = self._changed[app_id] = asyncio.get_running_loop().create_future()
        return future

    def add_listener(self, listener: ChangeListener) -> None:
        """Call ``listener`` with every change (metrics, the queues of deleted apps)."""
        self._listeners.append(listener)

    def apply(self, event: Mapping[str, Any]) -> RouteChange | None:
        """Apply one controller event and wake the requests of its app."""
        before = self.table.last_seq
        change = self.table.apply(event)
        if change is not None:
            self._publish([change])
        elif self.table.last_seq != before:
            self.dirty = True
        return change

    def apply_snapshot(self, views: Iterable[Mapping[str, Any]],
                       servers: Mapping[str, Mapping[str, Any]]) -> list[RouteChange]:
        """Replace the table by a snapshot of the controller's apps."""
        changes = self.table.apply_snapshot(views, servers)
        self._publish(changes)
        self.dirty = True
        self.loaded.set()
        return changes

    def _publish(self, changes: list[RouteChange]) -> None:
        self.dirty = True
        for change in changes:
            if change.after != change.before or change.deleted:
                logger.info("route %s: %s -> %s%s", change.app_id, _where(change.before),
                            _where(change.after), " (deleted)" if change.deleted else "")
            future = self._changed.pop(change.app_id, None)
            if future is not None and not future.done():
                future.set_result(change)
            for listener in self._listeners:
                try:
                    listener(change)
                except Exception:  # a listener's bug must not stop the routing
                    logger.exception("route change listener failed")


def _where(location: Any) -> str:
    return "nowhere" if location is None else f"{location.server_id}/{location.variant}"
