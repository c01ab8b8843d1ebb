"""The controller's in-memory copy of the app and server records it wrote to Redis.

The controller is the only writer of ``us:apps`` and ``us:servers``, and every write goes
through ``controller.store.Store``, which updates this cache only once Redis acknowledged the
write (Redis stays the write-ahead record). Each write also increments a revision counter in
Redis in the same transaction; the cache keeps the revision it reflects, so a gap (a write it
did not see, Redis restarted without the latest writes) is noticed and the cache is loaded
again.

Records are kept as the JSON stored in Redis and parsed at most once per write, as read-only
records (:class:`ReadOnlyAppRecord`, :class:`ReadOnlyServerRecord`): a caller that only looks
(the API's lists, the convergence pass, the planning snapshot) shares them; a caller that
changes a record asks for its own copy (``copy_app`` ...), as it did when every read parsed
Redis' answer. Assigning to a read-only record raises, so a decision made on a shared record
by mistake fails loudly instead of changing the cache behind Redis' back.

Every record is checked on its way in: a load parses each one and hands back those that do not
parse or break the rules (:class:`Rejected`; the store quarantines them), and the store checks
each record it writes (:func:`checked_app`, :func:`checked_server`), handing the parsed record
over with the write, so a read never meets a record it cannot parse.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from pydantic import ConfigDict, Field, ValidationError

from controller.errors import InvalidRecordError
from controller.records import AppRecord, AppSpec, Replica, ServerRecord

MAX_REASON_CHARS = 500
_R = TypeVar("_R")


class ReadOnlyAppSpec(AppSpec):
    """An app spec shared by every reader of the cache: never changed in place."""

    model_config = ConfigDict(frozen=True)


class ReadOnlyReplica(Replica):
    """A replica of a shared app record: never changed in place."""

    model_config = ConfigDict(frozen=True)


class ReadOnlyAppRecord(AppRecord):
    """An app record shared by every reader of the cache: never changed in place."""

    model_config = ConfigDict(frozen=True)

    spec: ReadOnlyAppSpec
    # a read-only replica is a replica (list is invariant, hence the ignore)
    replicas: list[ReadOnlyReplica] = Field(default_factory=list)  # type: ignore[assignment]


class ReadOnlyServerRecord(ServerRecord):
    """A server record shared by every reader of the cache: never changed in place."""

    model_config = ConfigDict(frozen=True)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record found in Redis that does not parse or breaks the rules: kept out of the cache."""

    hash_name: str
    """``apps`` or ``servers``: the hash it was found in."""
    record_id: str
    reason: str


def reason_of(error: ValueError) -> str:
    """A short, single-line account of why a record was refused (no input values quoted)."""
    if isinstance(error, ValidationError):
        text = "; ".join(_problem(e['loc'], e['msg'])
                         for e in error.errors(include_url=False, include_input=False))
    else:
        text = str(error)
    return text[:MAX_REASON_CHARS]


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    return f"{'.'.join(str(p) for p in loc)}: {message}" if loc else message


def parse_app(app_id: str, raw: str) -> ReadOnlyAppRecord:
    """The record stored under ``app_id``; ValueError when it is not a valid one of that app."""
    record = ReadOnlyAppRecord.model_validate_json(raw)
    if record.app_id != app_id:
        raise ValueError(f"stored under {app_id[:128]!r} but its app_id is {record.app_id!r}")
    return record


def parse_server(server_id: str, raw: str) -> ReadOnlyServerRecord:
    """The record stored under ``server_id``; ValueError when it is not a valid one of it."""
    record = ReadOnlyServerRecord.model_validate_json(raw)
    if record.server_id != server_id:
        raise ValueError(f"stored under {server_id[:128]!r} but its server_id is "
                         f"{record.server_id!r}")
    return record


def checked_app(record: AppRecord) -> tuple[str, str, ReadOnlyAppRecord]:
    """(id, JSON, the shared record) of an app record about to be written.

    InvalidRecordError when what would be stored does not read back (a non-finite number is
    written as ``null``): Redis never gets a record that a later read would refuse.
    """
    raw = record.model_dump_json()
    try:
        return record.app_id, raw, parse_app(record.app_id, raw)
    except ValueError as exc:
        raise InvalidRecordError(f"app {record.app_id!r} not written: {reason_of(exc)}") from exc


def checked_server(record: ServerRecord) -> tuple[str, str, ReadOnlyServerRecord]:
    """(id, JSON, the shared record) of a server record about to be written (see checked_app)."""
    raw = record.model_dump_json()
    try:
        return record.server_id, raw, parse_server(record.server_id, raw)
    except ValueError as exc:
        raise InvalidRecordError(f"server {record.server_id!r} not written: "
                                 f"{reason_of(exc)}") from exc


def _parse_all(raws: Mapping[str, str], hash_name: str, parse: Callable[[str, str], _R]
               ) -> tuple[dict[str, _R], list[Rejected]]:
    parsed: dict[str, _R] = {}
    rejected: list[Rejected] = []
    for record_id, raw in raws.items():
        try:
            parsed[record_id] = parse(record_id, raw)
        except ValueError as exc:
            rejected.append(Rejected(hash_name, record_id, reason_of(exc)))
    return parsed, rejected


@dataclass(frozen=True, slots=True)
class RecordsView:
    """Every app and server record at one revision, read-only, apps in id order.

    Taken without a round trip; it does not change when records are written afterwards.
    """

    revision: int
    apps: Mapping[str, AppRecord]
    servers: Mapping[str, ServerRecord]
    app_ids: Sequence[str]
    """The apps' ids, sorted (what pagination walks)."""


class RecordCache:
    """App and server records by id, as the JSON stored in Redis, parsed on demand.

    Pure bookkeeping, no I/O: the store decides when to load it and feeds it every write
    Redis acknowledged.
    """

    def __init__(self) -> None:
        self.loaded = False
        self.revision = 0
        self._apps_json: dict[str, str] = {}
        self._servers_json: dict[str, str] = {}
        self._apps: dict[str, ReadOnlyAppRecord] = {}
        """Parsed records, filled on first read after each write."""
        self._servers: dict[str, ReadOnlyServerRecord] = {}
        self._ids: list[str] = []
        self._view: RecordsView | None = None
        self._servers_view: Mapping[str, ReadOnlyServerRecord] | None = None
        self._on_server: dict[str, set[str]] = {}
        """Server -> the apps with a replica there or served from there (see apps_on)."""
        self._indexed_at: dict[str, frozenset[str]] = {}
        """App -> the servers it is listed under in ``_on_server``."""
        self._unindexed: set[str] = set()
        """Apps written since the index last looked at them."""

    # --- loading -----------------------------------------------------------------------------

    def load(self, apps: Mapping[str, str], servers: Mapping[str, str],
             revision: int) -> list[Rejected]:
        """Replace everything with what Redis holds at ``revision``, parsing every record.

        Returns the records left out because they do not parse or break the rules (the
        store moves them to quarantine).
        """
        parsed_apps, rejected = _parse_all(apps, "apps", parse_app)
        parsed_servers, rejected_servers = _parse_all(servers, "servers", parse_server)
        self._apps_json = {a: apps[a] for a in parsed_apps}
        self._servers_json = {s: servers[s] for s in parsed_servers}
        self._apps = parsed_apps
        self._servers = parsed_servers
        self._ids = sorted(self._apps_json)
        self._view = None
        self._servers_view = None
        self._on_server.clear()
        self._indexed_at.clear()
        self._unindexed = set(self._ids)
        self.revision = revision
        self.loaded = True
        return rejected + rejected_servers

    def invalidate(self) -> None:
        """Forget everything: the next read loads from Redis again."""
        self.loaded = False
        self._apps_json.clear()
        self._servers_json.clear()
        self._apps.clear()
        self._servers.clear()
        self._ids = []
        self._view = None
        self._servers_view = None
        self._on_server.clear()
        self._indexed_at.clear()
        self._unindexed.clear()

    # --- writes Redis acknowledged ------------------------------------------------------------

    def follows(self, revision: int) -> bool:
        """Whether ``revision`` is the next one (no write was missed); False invalidates."""
        if self.loaded and revision == self.revision + 1:
            return True
        self.invalidate()
        return False

    def written(self, revision: int, *, apps: Iterable[tuple[str, str]] = (),
                servers: Iterable[tuple[str, str]] = (),
                deleted_apps: Iterable[str] = (),
                parsed_apps: Mapping[str, ReadOnlyAppRecord] | None = None,
                parsed_servers: Mapping[str, ReadOnlyServerRecord] | None = None) -> bool:
        """Apply one acknowledged write (app and server JSON by id, deletions) at ``revision``.

        ``parsed_*``: the records already parsed from that JSON (``checked_app``), kept
        instead of parsed again at the next read. False (and the cache invalidated) when the
        write does not follow the cached revision.
        """
        if not self.follows(revision):
            return False
        for app_id, raw in apps:
            if app_id not in self._apps_json:
                bisect.insort(self._ids, app_id)
            self._apps_json[app_id] = raw
            _keep(self._apps, app_id, parsed_apps)
            self._unindexed.add(app_id)
        for server_id, raw in servers:
            self._servers_json[server_id] = raw
            _keep(self._servers, server_id, parsed_servers)
            self._servers_view = None
        for app_id in deleted_apps:
            if self._apps_json.pop(app_id, None) is not None:
                del self._ids[bisect.bisect_left(self._ids, app_id)]
            self._apps.pop(app_id, None)
            self._unindexed.add(app_id)
        self.revision = revision
        self._view = None
        return True

    # --- reads -------------------------------------------------------------------------------

    def app(self, app_id: str) -> ReadOnlyAppRecord | None:
        """One app's shared read-only record."""
        record = self._apps.get(app_id)
        if record is None:
            raw = self._apps_json.get(app_id)
            if raw is None:
                return None
            record = self._apps[app_id] = ReadOnlyAppRecord.model_validate_json(raw)
        return record

    def server(self, server_id: str) -> ReadOnlyServerRecord | None:
        """One server's shared read-only record."""
        record = self._servers.get(server_id)
        if record is None:
            raw = self._servers_json.get(server_id)
            if raw is None:
                return None
            record = self._servers[server_id] = ReadOnlyServerRecord.model_validate_json(raw)
        return record

    def view(self) -> RecordsView:
        """Every record, read-only, at the current revision (built once per revision)."""
        if self._view is None:
            ids = tuple(self._ids)
            apps = {app_id: self.app(app_id) for app_id in ids}
            self._view = RecordsView(self.revision, MappingProxyType(apps),  # type: ignore[arg-type]
                                     self.servers_view(), ids)
            self._reindex()  # every record is parsed now: keeping the index costs little
        return self._view

    def servers_view(self) -> Mapping[str, ReadOnlyServerRecord]:
        """Every server's read-only record, in id order, rebuilt only after a server write.

        Cheaper than :meth:`view` when only servers matter: a view also lists every app, and
        is rebuilt after every write of any record.
        """
        if self._servers_view is None:
            self._servers_view = MappingProxyType(
                {s: self.server(s) for s in sorted(self._servers_json)})  # type: ignore[misc]
        return self._servers_view

    def apps_on(self, server_id: str) -> list[str]:
        """The apps with a replica on ``server_id`` or served from it, sorted.

        What a failure of that server touches, found without looking at every app: the
        index follows the writes (each written app is looked at again on the next call).
        """
        self._reindex()
        return sorted(self._on_server.get(server_id, ()))

    def _reindex(self) -> None:
        for app_id in self._unindexed:
            for server_id in self._indexed_at.pop(app_id, ()):
                listed = self._on_server[server_id]
                listed.discard(app_id)
                if not listed:
                    del self._on_server[server_id]
            record = self.app(app_id)
            if record is None:
                continue
            servers = {r.server_id for r in record.replicas}
            if record.serving is not None:
                servers.add(record.serving[0])
            self._indexed_at[app_id] = frozenset(servers)
            for server_id in servers:
                self._on_server.setdefault(server_id, set()).add(app_id)
        self._unindexed.clear()

    def app_ids(self) -> list[str]:
        """Every app's id, sorted."""
        return list(self._ids)

    def copy_app(self, app_id: str) -> AppRecord | None:
        """A private, changeable copy of one app's record."""
        raw = self._apps_json.get(app_id)
        return AppRecord.model_validate_json(raw) if raw is not None else None

    def copy_apps(self) -> dict[str, AppRecord]:
        """Private copies of every app record, in id order."""
        return {a: AppRecord.model_validate_json(self._apps_json[a]) for a in self._ids}

    def copy_servers(self) -> dict[str, ServerRecord]:
        """Private copies of every server record, in id order."""
        return {s: ServerRecord.model_validate_json(self._servers_json[s])
                for s in sorted(self._servers_json)}

    def app_json(self, app_id: str) -> str | None:
        """The JSON stored for one app (what Redis holds)."""
        return self._apps_json.get(app_id)

    def server_json(self, server_id: str) -> str | None:
        """The JSON stored for one server."""
        return self._servers_json.get(server_id)


def _keep(records: dict[str, _R], record_id: str, parsed: Mapping[str, _R] | None) -> None:
    """Cache the freshly written record when it was parsed already, else forget the old one."""
    record = parsed.get(record_id) if parsed is not None else None
    if record is None:
        records.pop(record_id, None)
    else:
        records[record_id] = record
