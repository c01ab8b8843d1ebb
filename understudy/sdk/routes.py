"""The client's routing table: where each app it has asked about is served (pure).

Events and app views in, route changes out; no I/O, no clock, no asyncio (``board`` wraps it
for the event loop). The table holds only the apps the client has resolved, and follows the
controller's whole event stream, whose sequence numbers have no holes, so a skipped number
means events were lost (:meth:`RouteTable.gap`) and the apps must be read again.

Reading an app (``GET /v1/apps/{id}``) races the stream: an event may arrive while the read is
on its way. Such events are held (:meth:`begin_read`) and applied after the view
(:meth:`end_read`): each is either already in the view, and passes through a state the stream
then leaves again, or newer, and applies. Later events apply once per app (an event whose
``seq`` is not above the app's last one is a replay).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from understudy.sdk.locations import Location, location_of_event, location_of_serving


@dataclass
class AppRoute:
    """One app: the replica serving it (None: nowhere, ``reason`` says why)."""

    app_id: str
    serving: Location | None = None
    seq: int = 0
    """The last event applied to this app (later events only)."""
    reason: str = ""


@dataclass(frozen=True)
class RouteChange:
    """What one event or read did to one app."""

    app_id: str
    before: Location | None
    after: Location | None
    deleted: bool = False

    @property
    def left_server(self) -> str | None:
        """The server the app moved away from (to another one), if it did."""
        if self.before is None or self.after is None:
            return None
        return self.before.server_id if self.before.server_id != self.after.server_id else None


class RouteTable:
    """Routes of the apps a client uses, and the last event sequence number seen."""

    def __init__(self) -> None:
        self.apps: dict[str, AppRoute] = {}
        self.last_seq = 0
        self._held: dict[str, list[Mapping[str, Any]]] = {}

    def get(self, app_id: str) -> AppRoute | None:
        """The app's route (None: not resolved, or deleted)."""
        return self.apps.get(app_id)

    def gap(self, event: Mapping[str, Any]) -> bool:
        """Whether events between the last one seen and ``event`` are missing."""
        return self.last_seq > 0 and int(event["seq"]) > self.last_seq + 1

    def apply(self, event: Mapping[str, Any]) -> RouteChange | None:
        """Apply one controller event; the change it made to its app's route, if any."""
        seq = int(event["seq"])
        self.last_seq = max(self.last_seq, seq)
        app_id = str(event.get("app_id") or "")
        held = self._held.get(app_id)
        if held is not None:
            held.append(event)
            return None
        app = self.apps.get(app_id)
        if app is None or seq <= app.seq:
            return None  # an app this client does not use, or a replay
        before = app.serving
        if self._step(app, event):
            return RouteChange(app_id, before, None, deleted=True)
        return _change(app_id, before, app.serving)

    def begin_read(self, app_id: str) -> None:
        """An app view is being read: hold the app's events until :meth:`end_read`."""
        self._held.setdefault(app_id, [])

    def end_read(self, app_id: str, view: Mapping[str, Any] | None) -> RouteChange | None:
        """Set the app from its view, then apply the events that arrived during the read.

        ``view`` None: the controller does not know the app.
        """
        held = self._held.pop(app_id, [])
        app = self.apps.get(app_id)
        before = app.serving if app is not None else None
        if view is None:
            if app is None:
                return None
            del self.apps[app_id]
            return RouteChange(app_id, before, None, deleted=True)
        if app is None:
            app = self.apps[app_id] = AppRoute(app_id)
        floor = app.seq
        app.serving = location_of_serving(view.get("serving"), self.last_seq)
        app.reason = "" if app.serving else str(view.get("reason") or "")
        for event in held:
            if int(event["seq"]) > floor and self._step(app, event):
                return RouteChange(app_id, before, None, deleted=True)
        app.seq = max(app.seq, self.last_seq)
        return _change(app_id, before, app.serving)

    def abort_read(self, app_id: str) -> RouteChange | None:
        """The read failed: apply the events held for the app to what was known of it."""
        held = self._held.pop(app_id, [])
        app = self.apps.get(app_id)
        if app is None:
            return None
        before = app.serving
        for event in held:
            if int(event["seq"]) > app.seq and self._step(app, event):
                return RouteChange(app_id, before, None, deleted=True)
        return _change(app_id, before, app.serving)

    def place(self, app_id: str, location: Location | None, reason: str = "") -> RouteChange:
        """Set an app's route directly (routes that come from elsewhere than the controller)."""
        app = self.apps.get(app_id)
        if app is None:
            app = self.apps[app_id] = AppRoute(app_id)
        before = app.serving
        app.serving, app.reason = location, reason
        return RouteChange(app_id, before, location)

    def _step(self, app: AppRoute, event: Mapping[str, Any]) -> bool:
        """Apply one event to a known app; True when it deleted the app."""
        app.seq = max(app.seq, int(event["seq"]))
        if event.get("kind") == "deleted":
            self.apps.pop(app.app_id, None)
            return True
        moves, location = location_of_event(event)
        if moves:
            app.serving = location
            app.reason = "" if location else str(event.get("reason") or event.get("kind"))
        return False


def _change(app_id: str, before: Location | None, after: Location | None) -> RouteChange | None:
    if _same_place(before, after):
        return None
    return RouteChange(app_id, before, after)


def _same_place(a: Location | None, b: Location | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.server_id, a.model_name, a.http, a.grpc) == (b.server_id, b.model_name, b.http,
                                                           b.grpc)
