"""The routing table: where each app is served and its warm backups, from the controller's events.

Pure: events and snapshots in, route changes out; no I/O, no clock, no asyncio (``board`` wraps
it for the event loop). Sources, in the order a gateway meets them:

- a table persisted by an earlier run (:meth:`RoutingTable.from_doc`), so a gateway started
  while the controller is down still routes;
- a snapshot of ``GET /v1/apps`` (and ``GET /v1/servers`` for the backups' endpoints);
- events of ``/v1/events/ws``, each applied at most once per app (an event whose ``seq`` is not
  above the app's last one is a duplicate of a replay, or older than a snapshot: ignored).

Besides the serving replica and its warm backups, an app may have more *instances* of its
variant (``AppSpec.instances``: the gateway balances its queries over them) and *parity models*
(``AppSpec.protection`` ``parity:k``: the gateway codes k queries into a parity query for one).
They come and go with ``instance_ready`` / ``parity_ready`` and ``instance_removed`` /
``parity_removed`` events, and with their server's failure.

Which events move an app is the SDK's rule (``understudy.client.location_of_event``), so the
gateway and the SDK agree on where an app is served.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from understudy.client import Location, location_of_event, location_of_replica, location_of_serving

DOC_VERSION = 1


@dataclass
class AppRoute:
    """One app: the replica serving it (None: nowhere, ``reason`` says why) and warm backups."""

    app_id: str
    serving: Location | None = None
    backups: dict[str, Location] = field(default_factory=dict)
    """server id -> the ready warm backup on that server."""
    seq: int = 0
    """The last event applied to this app (later events only)."""
    reason: str = ""
    version: int = 0
    """Bumped whenever ``serving`` changes (requests wait for the next version)."""
    instances: dict[str, Location] = field(default_factory=dict)
    """server id -> a ready instance of the app besides the serving replica."""
    parity: dict[str, Location] = field(default_factory=dict)
    """server id -> a ready parity model of the app's instances."""
    slo_ms: float | None = None
    """The latency objective the app was registered with (from snapshots; None: none)."""

    def members(self) -> list[Location]:
        """Every instance answering the app's queries: the serving replica, then the others."""
        found = [] if self.serving is None else [self.serving]
        found += [loc for server, loc in sorted(self.instances.items())
                  if self.serving is None or server != self.serving.server_id]
        return found


@dataclass(frozen=True)
class RouteChange:
    """What one event or snapshot did to one app."""

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


class RoutingTable:
    """Routes of every app the gateway knows of, and the last event sequence number seen."""

    def __init__(self) -> None:
        self.apps: dict[str, AppRoute] = {}
        self.last_seq = 0

    def get(self, app_id: str) -> AppRoute | None:
        """The app's routes (None: unknown app)."""
        return self.apps.get(app_id)

    # --- events ---------------------------------------------------------------------------

    def apply(self, event: Mapping[str, Any]) -> RouteChange | None:
        """Apply one controller event; the change it made to its app's routes, if any."""
        seq = int(event["seq"])
        self.last_seq = max(self.last_seq, seq)
        app_id = str(event["app_id"])
        app = self.apps.get(app_id)
        if app is not None and seq <= app.seq:
            return None  # a replayed or pre-snapshot event: already reflected
        if event.get("kind") == "deleted":
            if app is None:
                return None
            del self.apps[app_id]
            return RouteChange(app_id, app.serving, None, deleted=True)
        if app is None:
            app = self.apps[app_id] = AppRoute(app_id)
        app.seq = seq
        failed = event.get("failed_server")
        if failed:
            for replicas in (app.backups, app.instances, app.parity):
                replicas.pop(str(failed), None)  # a replica on a failed server is gone
        kind = event.get("kind")
        extra = {"backup_ready": app.backups, "instance_ready": app.instances,
                 "parity_ready": app.parity}.get(str(kind))
        if extra is not None and event.get("endpoint"):
            replica = location_of_replica(event)
            extra[replica.server_id] = replica
            return RouteChange(app_id, app.serving, app.serving)
        gone = {"instance_removed": app.instances, "parity_removed": app.parity}.get(str(kind))
        if gone is not None:
            if gone.pop(str(event.get("server_id")), None) is None:
                return None
            return RouteChange(app_id, app.serving, app.serving)
        moves, location = location_of_event(event)
        if not moves:
            return None
        return self._serve(app, location, str(event.get("reason") or ""))

    def _serve(self, app: AppRoute, location: Location | None, reason: str) -> RouteChange | None:
        before = app.serving
        if location is not None:
            # A warm switch promotes the backup on that server: it is no backup any more.
            app.backups.pop(location.server_id, None)
        app.reason = reason if location is None else ""
        if _same_place(before, location):
            app.serving = location  # same replica; keep the newer metadata
            return None
        app.serving = location
        app.version += 1
        return RouteChange(app.app_id, before, location)

    # --- snapshots ------------------------------------------------------------------------

    def apply_snapshot(self, views: Iterable[Mapping[str, Any]],
                       servers: Mapping[str, Mapping[str, Any]]) -> list[RouteChange]:
        """Replace the table with ``GET /v1/apps`` (``servers``: ``GET /v1/servers`` by id).

        Every app not in the snapshot is gone. Each app's ``seq`` becomes the table's
        ``last_seq``: the snapshot was read after those events, so only later ones apply.
        """
        changes: list[RouteChange] = []
        seen: set[str] = set()
        for view in views:
            app_id = str(view["app_id"])
            seen.add(app_id)
            app = self.apps.get(app_id)
            if app is None:
                app = self.apps[app_id] = AppRoute(app_id)
            app.seq = max(app.seq, self.last_seq)
            app.backups = _backups(app_id, view.get("backups") or (), servers, self.last_seq)
            replicas = view.get("replicas") or ()
            app.instances = _backups(app_id, [r for r in replicas if r.get("role") == "instance"],
                                     servers, self.last_seq)
            app.parity = _backups(app_id, [r for r in replicas if r.get("role") == "parity"],
                                  servers, self.last_seq)
            app.slo_ms = _slo_ms(view.get("spec"))
            serving = location_of_serving(view.get("serving"), self.last_seq)
            change = self._serve(app, serving, str(view.get("reason") or ""))
            if change is not None:
                changes.append(change)
        for app_id in [a for a in self.apps if a not in seen]:
            gone = self.apps.pop(app_id)
            changes.append(RouteChange(app_id, gone.serving, None, deleted=True))
        return changes

    # --- persistence ----------------------------------------------------------------------

    def to_doc(self) -> dict[str, Any]:
        """The table as JSON-ready data (``from_doc`` reads it back)."""
        return {"version": DOC_VERSION, "last_seq": self.last_seq, "apps": {
            a.app_id: {"serving": asdict(a.serving) if a.serving else None,
                       "backups": [asdict(b) for b in a.backups.values()],
                       "instances": [asdict(b) for b in a.instances.values()],
                       "parity": [asdict(b) for b in a.parity.values()],
                       "seq": a.seq, "reason": a.reason, "slo_ms": a.slo_ms}
            for a in self.apps.values()}}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> RoutingTable:
        """A table written by :meth:`to_doc`; ValueError when it is not one."""
        if doc.get("version") != DOC_VERSION:
            raise ValueError(f"routing table version {doc.get('version')!r} is not "
                             f"{DOC_VERSION}")
        table = cls()
        try:
            table.last_seq = int(doc["last_seq"])
            for app_id, data in doc["apps"].items():
                serving = data.get("serving")
                table.apps[app_id] = AppRoute(
                    app_id, Location(**serving) if serving else None,
                    {b["server_id"]: Location(**b) for b in data.get("backups", ())},
                    int(data.get("seq", 0)), str(data.get("reason", "")),
                    instances={b["server_id"]: Location(**b)
                               for b in data.get("instances", ())},
                    parity={b["server_id"]: Location(**b) for b in data.get("parity", ())},
                    slo_ms=_slo_ms({"latency_slo_ms": data.get("slo_ms")}))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed routing table: {exc}") from exc
        return table


def _slo_ms(spec: Any) -> float | None:
    """An app spec's ``latency_slo_ms`` when it is a usable one (None otherwise)."""
    if not isinstance(spec, Mapping):
        return None
    value = spec.get("latency_slo_ms")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _same_place(a: Location | None, b: Location | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.server_id, a.model_name, a.http, a.grpc) == (b.server_id, b.model_name, b.http,
                                                           b.grpc)


def _backups(app_id: str, replicas: Iterable[Mapping[str, Any]],
             servers: Mapping[str, Mapping[str, Any]], seq: int) -> dict[str, Location]:
    """The ready replicas among ``replicas`` (of an app view), with their servers' endpoints."""
    found: dict[str, Location] = {}
    for replica in replicas:
        server = servers.get(str(replica.get("server_id")))
        if (replica.get("state") != "ready" or server is None or not server.get("http")
                or server.get("state") == "failed"):
            continue
        variant = str(replica["variant"])
        found[server["server_id"]] = Location(
            http=str(server["http"]), grpc=str(server.get("grpc") or ""),
            model_name=f"{app_id}__{variant}", server_id=str(server["server_id"]),
            variant=variant, accuracy=float(replica.get("accuracy") or 0.0), seq=seq)
    return found
