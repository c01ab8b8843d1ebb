"""The routing table on the event loop: requests read routes and wait for an app's next change.

Each app with waiters has one shared future, resolved with the :class:`RouteChange` when the
app's route changes and replaced by a fresh one, so a request in flight learns of a move
without polling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from understudy.sdk.locations import Location
from understudy.sdk.routes import AppRoute, RouteChange, RouteTable

logger = logging.getLogger(__name__)


class RouteBoard:
    """The client's routing table, and who waits for which app to change."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.table = RouteTable()
        self.on_event = on_event
        self._changed: dict[str, asyncio.Future[RouteChange]] = {}

    def route(self, app_id: str) -> AppRoute | None:
        """The app's route; None for an app not resolved (or deleted)."""
        return self.table.get(app_id)

    def changed(self, app_id: str) -> asyncio.Future[RouteChange]:
        """A future resolved at the app's next change (shared by every waiter)."""
        future = self._changed.get(app_id)
        if future is None or future.done():
            future = self._changed[app_id] = asyncio.get_running_loop().create_future()
        return future

    def apply(self, event: dict[str, Any]) -> RouteChange | None:
        """Apply one controller event and wake the requests of its app."""
        tracked = self.table.get(str(event.get("app_id"))) is not None
        change = self.table.apply(event)
        if tracked and self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a caller's hook must not stop the routing
                logger.exception("on_event hook failed")
        self._publish(change)
        return change

    def begin_read(self, app_id: str) -> None:
        """See :meth:`RouteTable.begin_read`."""
        self.table.begin_read(app_id)

    def end_read(self, app_id: str, view: Mapping[str, Any] | None) -> RouteChange | None:
        """See :meth:`RouteTable.end_read`; wakes the app's requests."""
        change = self.table.end_read(app_id, view)
        self._publish(change)
        return change

    def abort_read(self, app_id: str) -> RouteChange | None:
        """See :meth:`RouteTable.abort_read`; wakes the app's requests."""
        change = self.table.abort_read(app_id)
        self._publish(change)
        return change

    def place(self, app_id: str, location: Location | None, reason: str = "") -> RouteChange:
        """Set an app's route directly and wake its requests."""
        change = self.table.place(app_id, location, reason)
        self._publish(change)
        return change

    def _publish(self, change: RouteChange | None) -> None:
        if change is None:
            return
        logger.info("route %s: %s -> %s%s", change.app_id, _where(change.before),
                    _where(change.after), " (deleted)" if change.deleted else "")
        future = self._changed.pop(change.app_id, None)
        if future is not None and not future.done():
            future.set_result(change)


def _where(location: Location | None) -> str:
    return "nowhere" if location is None else f"{location.server_id}/{location.variant}"
