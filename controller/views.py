"""What the list endpoints show: app views, pages of a sorted list, filters, batch results.

Pure presentation over read-only records (``controller.record_cache``); no I/O. The API's routes
decode a request, take a view of the records from the store and call these.

Pagination: every list is sorted by id; a page holds at most ``limit`` items after ``cursor``
(exclusive, the last id of the previous page). When more items match, the response carries
``X-Next-Cursor`` (the value to pass as ``cursor``) and a ``Link: <...>; rel="next"`` header; the
body stays a bare JSON list, so a client that ignores the headers reads the first page as
before.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field

from controller.records import AppRecord, AppSpec, AppStatus, ServerRecord, ServerState

T = TypeVar("T")

DEFAULT_PAGE = 1000
"""Items a list endpoint answers without ``limit`` (every app of a testbed-sized cluster)."""
MAX_PAGE = 10_000
MAX_BATCH = 1000
"""Apps one ``POST /v1/apps/batch`` may register."""
NEXT_CURSOR = "X-Next-Cursor"


class ServingView(BaseModel):
    """Where an app is served now."""

    server_id: str
    variant: str
    role: str
    accuracy: float
    model_name: str
    endpoint: dict[str, str] | None


class AppView(BaseModel):
    """An app as the API shows it."""

    app_id: str
    spec: AppSpec
    status: str
    reason: str
    serving: ServingView | None
    backups: list[dict[str, Any]]
    replicas: list[dict[str, Any]]
    home: list[str] | None


class AppBatch(BaseModel):
    """Body of ``POST /v1/apps/batch``: up to 1000 app registrations."""

    model_config = ConfigDict(extra="forbid", strict=True)

    apps: list[AppSpec] = Field(min_length=1, max_length=MAX_BATCH)


class RegistrationResult(BaseModel):
    """What became of one app of a batch."""

    app_id: str
    outcome: Literal["created", "conflict"]
    detail: str = ""


class BatchResult(BaseModel):
    """The answer to ``POST /v1/apps/batch``: one result per app, in the request's order."""

    created: int
    conflicts: int
    results: list[RegistrationResult]


def batch_result(specs: Sequence[AppSpec], created: Sequence[bool]) -> BatchResult:
    """Per-app outcomes of a batch registration."""
    results = [RegistrationResult(app_id=s.app_id, outcome="created") if ok else
               RegistrationResult(app_id=s.app_id, outcome="conflict",
                                  detail=f"app {s.app_id!r} is already registered")
               for s, ok in zip(specs, created, strict=True)]
    made = sum(created)
    return BatchResult(created=made, conflicts=len(results) - made, results=results)


def app_view(record: AppRecord, servers: Mapping[str, ServerRecord]) -> AppView:
    """The API's view of one app: its record, plus the endpoint of the server serving it."""
    serving = None
    current = record.serving_replica()
    if current is not None:
        server = servers.get(current.server_id)
        endpoint = {"http": server.http or "", "grpc": server.grpc or ""} if server else None
        serving = ServingView(server_id=current.server_id, variant=current.variant,
                              role=current.role.value, accuracy=current.accuracy,
                              model_name=f"{record.app_id}__{current.variant}",
                              endpoint=endpoint)
    return AppView(
        app_id=record.app_id, spec=record.spec, status=record.status.value,
        reason=record.reason, serving=serving,
        backups=[r.model_dump(mode="json") for r in record.replicas if r.role.value == "warm"],
        replicas=[r.model_dump(mode="json") for r in record.replicas],
        home=list(record.home) if record.home else None)


class RenderedViews:
    """Each app's view as JSON, rendered again only when its record or serving server changed.

    Keyed by the identity of the read-only records of the cache, which are new objects after
    every write (and after a reload), so a stale rendering is never served. Listing 10,000
    apps is then a join of cached strings.
    """

    def __init__(self) -> None:
        self._rendered: dict[str, tuple[AppRecord, ServerRecord | None, bytes]] = {}

    def json(self, record: AppRecord, servers: Mapping[str, ServerRecord]) -> bytes:
        """One app's view as JSON."""
        server = servers.get(record.serving[0]) if record.serving else None
        hit = self._rendered.get(record.app_id)
        if hit is not None and hit[0] is record and hit[1] is server:
            return hit[2]
        body = app_view(record, servers).model_dump_json().encode()
        self._rendered[record.app_id] = (record, server, body)
        return body

    def list_json(self, records: Iterable[AppRecord],
                  servers: Mapping[str, ServerRecord]) -> bytes:
        """A JSON list of the views of ``records``."""
        return b"[" + b",".join(self.json(r, servers) for r in records) + b"]"

    def __contains__(self, app_id: object) -> bool:
        return app_id in self._rendered

    def prune(self, known: Mapping[str, AppRecord]) -> None:
        """Drop the renderings of deleted apps (call now and then)."""
        if len(self._rendered) > len(known):
            self._rendered = {k: v for k, v in self._rendered.items() if k in known}


# --- pages and filters -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """The ids of one page, and the cursor of the next (None on the last page)."""

    ids: list[str]
    next_cursor: str | None


def page(ids: Sequence[str], cursor: str | None, limit: int,
         keep: Callable[[str], bool] | None = None) -> Page:
    """Up to ``limit`` of the sorted ``ids`` after ``cursor`` that ``keep`` accepts.

    ``next_cursor`` is the page's last id when another accepted id follows it, so walking the
    pages visits every accepted id exactly once, in order; an id added or removed between
    two calls affects only pages not read yet.
    """
    start = bisect.bisect_right(ids, cursor) if cursor is not None else 0
    found: list[str] = []
    for index in range(start, len(ids)):
        item = ids[index]
        if keep is not None and not keep(item):
            continue
        if len(found) == limit:
            return Page(found, found[-1])
        found.append(item)
    return Page(found, None)


@dataclass(frozen=True, slots=True)
class AppFilter:
    """The ``GET /v1/apps`` filters; None matches anything."""

    status: AppStatus | None = None
    family: str | None = None
    variant: str | None = None
    """The variant serving the app."""
    critical: bool | None = None
    server_id: str | None = None
    """The server serving the app."""
    site: str | None = None
    """The site of the server serving the app."""

    @property
    def empty(self) -> bool:
        """True when it keeps every app."""
        return all(getattr(self, name) is None for name in self.__slots__)

    def keeps(self, record: AppRecord, servers: Mapping[str, ServerRecord]) -> bool:
        """Whether ``record`` passes every filter given."""
        if self.status is not None and record.status is not self.status:
            return False
        if self.family is not None and record.spec.family != self.family:
            return False
        if self.critical is not None and record.spec.critical is not self.critical:
            return False
        serving = record.serving
        if self.variant is not None and (serving is None or serving[1] != self.variant):
            return False
        if self.server_id is not None and (serving is None or serving[0] != self.server_id):
            return False
        if self.site is not None:
            server = servers.get(serving[0]) if serving is not None else None
            if server is None or server.site_id != self.site:
                return False
        return True


@dataclass(frozen=True, slots=True)
class ServerFilter:
    """The ``GET /v1/servers`` filters; None matches anything."""

    state: ServerState | None = None
    site: str | None = None

    def keeps(self, record: ServerRecord) -> bool:
        """Whether ``record`` passes every filter given."""
        return (self.state is None or record.state is self.state) and \
            (self.site is None or record.site_id == self.site)


def page_of(items: Mapping[str, T], cursor: str | None, limit: int,
            keep: Callable[[T], bool] | None = None) -> tuple[list[T], str | None]:
    """A page of the values of ``items`` in key order (see :func:`page`)."""
    ids = sorted(items)
    chosen = page(ids, cursor, limit, None if keep is None else lambda k: keep(items[k]))
    return [items[k] for k in chosen.ids], chosen.next_cursor


def next_headers(path: str, query: Mapping[str, Any], next_cursor: str | None
                 ) -> dict[str, str]:
    """``X-Next-Cursor`` and ``Link`` headers for the page after this one (none at the end)."""
    if next_cursor is None:
        return {}
    params = {k: v for k, v in query.items() if k != "cursor"}
    params["cursor"] = next_cursor
    return {NEXT_CURSOR: next_cursor, "Link": f'<{path}?{urlencode(params)}>; rel="next"'}
