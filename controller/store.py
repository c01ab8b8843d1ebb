"""The only module that talks to Redis: apps, servers, config, warm plan, events, intents.

Keys (all under a prefix, default ``us:``):

* ``apps`` hash: app id -> :class:`AppRecord` JSON (the desired and observed replicas);
* ``servers`` hash: server id -> :class:`ServerRecord` JSON;
* ``rev`` counter: incremented with every write of app or server records, in the same
  transaction (the in-memory copy, ``controller.record_cache``, checks it follows every one);
* ``config`` string: :class:`RuntimeConfig` JSON;  ``plan`` string: last warm plan summary;
* ``events`` stream with ids ``<seq>-0`` and ``event_seq`` counter: the notification history;
* ``intents`` hash: intent id -> what the controller is about to do (write-ahead);
* ``graphs`` hash: graph name -> :class:`GraphRecord` JSON (service graphs: spec, placement).

While Redis is unreachable (``controller.redis_health``) a command sent for an API request fails
at once (503); any other waits for Redis and is sent again, so an outage stalls the failover and
the background loops instead of failing them; with append-only persistence nothing acknowledged
is lost. Idempotency keys' stored answers live under ``idempotency:<key>``
(``controller.idempotency``).

Reads of apps and servers come from an in-memory copy (:class:`RecordCache`) that every write
updates once Redis acknowledged it; a failed write, a revision that does not follow, or a
:meth:`Store.revision` check that finds Redis elsewhere (restarted without the last writes)
loads it again from Redis.

Nothing invalid is written and nothing unreadable stops a read: every app and server record is
checked before it is written (``record_cache.checked_app``), and whatever a read finds that does
not parse or breaks the rules (a record, the config, an intent, a graph, an event, a key of the
wrong type) is moved to quarantine (``controller.quarantine``), logged, and left out.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from controller.graphs.records import GraphRecord
from controller.idempotency import IdempotencyLog
from controller.quarantine import Bad, Quarantine, json_object
from controller.record_cache import (
    RecordCache,
    RecordsView,
    checked_app,
    checked_server,
    reason_of,
)
from controller.records import AppRecord, Event, RuntimeConfig, ServerRecord, now
from controller.redis_health import RedisHealth, connect
from controller.redis_scripts import COMMIT_LUA

logger = logging.getLogger(__name__)

EVENT_STREAM_MAXLEN = 100_000



class Store:
    """Async Redis store of the controller's state."""

    def __init__(self, url: str, prefix: str = "us:") -> None:
        self.url = url
        self.prefix = prefix
        self.redis = connect(url)
        self._event_lock = asyncio.Lock()
        self._commit_script = self.redis.register_script(COMMIT_LUA)
        self._cache = RecordCache()
        """Apps and servers as last acknowledged; the event lock serialises every write."""
        self.quarantine = Quarantine(self.redis, prefix)
        self.idempotency = IdempotencyLog(self.redis, prefix)

    @property
    def health(self) -> RedisHealth:
        """Whether Redis answers, and its outages so far."""
        return self.redis.health

    def _key(self, name: str) -> str:
        return self.prefix + name

    async def ping(self) -> bool:
        """Whether Redis answers (one try, no retries; False at once in an outage)."""
        if self.health.down:
            return False
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), 1.0))
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False

    def stop_waiting(self) -> None:
        """The controller stops: a command waiting out an outage fails instead."""
        self.health.close()

    async def close(self) -> None:
        """Close the connection pool."""
        await self.health.aclose()
        await self.redis.aclose()

    # --- the in-memory copy ------------------------------------------------------------------

    async def _loaded(self) -> RecordCache:
        """The cache, loaded from Redis first when it is not (start, after a failed write)."""
        if not self._cache.loaded:
            # In an outage a request fails fast here, rather than queue for the lock behind a
            # reload that waits for Redis (a /metrics scrape hung until its client gave up).
            await self.health.admit()
            async with self._event_lock:
                if not self._cache.loaded:
                    await self._load()
        return self._cache

    async def _load(self) -> None:
        raw_apps, raw_servers, raw_rev, raw_seq = await self._read_records()
        if _revision(raw_seq) is None:
            await self._repair_event_seq(raw_seq)
        rev = _revision(raw_rev)
        rejected = self._cache.load(raw_apps, raw_servers, rev or 0)
        if rejected or rev is None:
            await self._quarantine_records(rejected, raw_apps, raw_servers, raw_rev)
        logger.info("records loaded from redis: %d apps, %d servers (revision %d, %d "
                    "quarantined)", len(raw_apps) - sum(r.hash_name == "apps" for r in rejected),
                    len(raw_servers) - sum(r.hash_name == "servers" for r in rejected),
                    self._cache.revision, len(rejected))

    async def _read_records(self) -> list[Any]:
        """The apps and servers hashes, the revision and the event counter, as stored."""
        keys = (("apps", "hash"), ("servers", "hash"), ("rev", "string"),
                ("event_seq", "string"))

        async def read() -> list[Any]:
            async with self.redis.pipeline(transaction=True) as pipe:
                for name, kind in keys:
                    if kind == "hash":
                        pipe.hgetall(self._key(name))
                    else:
                        pipe.get(self._key(name))
                return await pipe.execute()

        try:
            return await read()
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            for name, kind in keys:
                if await self.redis.type(self._key(name)) not in (kind, "none"):
                    await self.quarantine.set_aside(name, f"not a {kind}")
            return await read()

    async def _repair_event_seq(self, raw: Any) -> None:
        """An event counter that is no number: go on from the stream's newest event.

        Left as it was, every commit would fail (INCRBY refuses it).
        """
        await self.quarantine.value("event_seq", Bad(None, str(raw), "not a sequence number"))
        newest = await self.quarantine.tolerant("events", lambda: self.redis.xrevrange(
            self._key("events"), count=1))
        last = int(newest[0][0].split("-")[0]) if newest else 0
        await self.redis.set(self._key("event_seq"), last)

    async def _quarantine_records(self, rejected: Any, raw_apps: dict[str, str],
                                  raw_servers: dict[str, str], raw_rev: Any) -> None:
        """Move rejected records out of ``apps`` and ``servers``; a bad ``rev`` starts over.

        One transaction per hash, each with the revision increment that says records changed
        (so the cache, at the old revision plus one, follows).
        """
        raws = {"apps": raw_apps, "servers": raw_servers}
        if _revision(raw_rev) is None:
            await self.quarantine.value("rev", Bad(None, str(raw_rev), "not a revision number"))
        for name in ("apps", "servers"):
            bad = [Bad(r.record_id, raws[name][r.record_id], r.reason)
                   for r in rejected if r.hash_name == name]
            if bad:
                rev, = await self.quarantine.fields(
                    name, bad, lambda pipe: pipe.incr(self._key("rev")))
                self._applied(int(rev))

    async def _write(self, commands: Callable[[Any], None],
                     applied: Callable[[list[Any]], dict[str, Any]]) -> list[Any]:
        """One transaction of ``commands`` and the ``rev`` increment; the cache follows.

        Under the event lock, so writes reach Redis and the cache in one order. ``applied``
        turns the commands' results into what the cache takes (``RecordCache.written``).
        A write that failed (its outcome unknown) reloads the cache at the next read.
        """
        await self._loaded()
        async with self._event_lock, self.redis.pipeline(transaction=True) as pipe:
            commands(pipe)
            pipe.incr(self._key("rev"))
            try:
                *results, rev = await pipe.execute()
            except BaseException:
                self._cache.invalidate()
                raise
            self._applied(int(rev), **applied(results))
        return results

    def _applied(self, rev: int, **changes: Any) -> None:
        """Hand an acknowledged write to the cache (hold the event lock)."""
        was_loaded, cached = self._cache.loaded, self._cache.revision
        if not self._cache.written(rev, **changes) and was_loaded:
            logger.warning("redis revision %d does not follow the cached %d; reloading the "
                           "records at the next read", rev, cached)

    async def revision(self) -> int:
        """The records' revision, checked against Redis (one round trip).

        When Redis holds another one (a write the cache missed, a Redis restarted without its
        latest writes) the cache is loaded again. Unchanged revision: unchanged records.
        """
        async with self._event_lock:
            rev = int(await self.redis.get(self._key("rev")) or 0)
            if self._cache.loaded and rev != self._cache.revision:
                logger.warning("redis is at revision %d, the cached records at %d; reloading",
                               rev, self._cache.revision)
                self._cache.invalidate()
            if not self._cache.loaded:
                await self._load()
            return self._cache.revision

    async def view(self) -> RecordsView:
        """Every app and server record, read-only and without a round trip (see RecordsView).

        For callers that only look; one that changes a record reads it with :meth:`get_app`,
        :meth:`apps` or :meth:`servers`, which return private copies.
        """
        return (await self._loaded()).view()

    # --- apps --------------------------------------------------------------------------------

    async def put_app(self, record: AppRecord) -> None:
        """Write an app record (stamps ``updated_at``)."""
        record.updated_at = now()
        app_id, raw, parsed = checked_app(record)
        await self._write(lambda pipe: pipe.hset(self._key("apps"), app_id, raw),
                          lambda _: {"apps": [(app_id, raw)], "parsed_apps": {app_id: parsed}})

    async def add_app(self, record: AppRecord) -> bool:
        """Write a new app record; False when the id is taken."""
        return (await self.add_apps([record]))[0]

    async def add_apps(self, records: Sequence[AppRecord]) -> list[bool]:
        """Write new app records in one transaction; False for each id already taken."""
        checked = [checked_app(r) for r in records]
        pairs = [(app_id, raw) for app_id, raw, _ in checked]
        if not pairs:
            return []

        def commands(pipe: Any) -> None:
            for app_id, raw in pairs:
                pipe.hsetnx(self._key("apps"), app_id, raw)

        results = await self._write(commands, lambda added: {"apps": [
            pair for pair, ok in zip(pairs, added, strict=True) if ok],
            "parsed_apps": {app_id: parsed for app_id, _, parsed in checked}})
        return [bool(ok) for ok in results]

    async def app_ids(self) -> list[str]:
        """The ids of every registered app, sorted."""
        return (await self._loaded()).app_ids()

    async def get_app(self, app_id: str) -> AppRecord | None:
        """One app record (a private copy)."""
        return (await self._loaded()).copy_app(app_id)

    async def apps(self) -> dict[str, AppRecord]:
        """Every app record by id (private copies)."""
        return (await self._loaded()).copy_apps()

    async def app_record(self, app_id: str) -> AppRecord | None:
        """One app's shared read-only record (no copy: for a caller that only looks)."""
        return (await self._loaded()).app(app_id)

    async def server_records(self) -> Mapping[str, ServerRecord]:
        """Every server's shared read-only record (no view of the apps is built)."""
        return (await self._loaded()).servers_view()

    async def apps_on(self, server_id: str) -> list[str]:
        """The ids of the apps with a replica on the server or served from it, sorted."""
        return (await self._loaded()).apps_on(server_id)

    async def delete_app(self, app_id: str) -> None:
        """Forget an app."""
        await self._write(lambda pipe: pipe.hdel(self._key("apps"), app_id),
                          lambda _: {"deleted_apps": [app_id]})

    # --- servers -----------------------------------------------------------------------------

    async def put_server(self, record: ServerRecord) -> None:
        """Write a server record."""
        server_id, raw, parsed = checked_server(record)
        await self._write(lambda pipe: pipe.hset(self._key("servers"), server_id, raw),
                          lambda _: {"servers": [(server_id, raw)],
                                     "parsed_servers": {server_id: parsed}})

    async def servers(self) -> dict[str, ServerRecord]:
        """Every server record by id (private copies)."""
        return (await self._loaded()).copy_servers()

    async def app_and_servers(self, app_id: str
                              ) -> tuple[AppRecord | None, Mapping[str, ServerRecord]]:
        """One app record (a private copy) and every server record (shared, read-only).

        On the path of every finished load: copying a thousand server records each time
        cost more than the rest of it.
        """
        cache = await self._loaded()
        return cache.copy_app(app_id), cache.servers_view()

    async def apps_and_servers(self) -> tuple[dict[str, AppRecord], dict[str, ServerRecord]]:
        """Every app and server record (private copies), at one revision."""
        cache = await self._loaded()
        return cache.copy_apps(), cache.copy_servers()

    async def commit(self, *, apps: Sequence[AppRecord] = (),
                     servers: Sequence[ServerRecord] = (), intent: dict[str, Any] | None = None,
                     events: Sequence[Event] = ()) -> tuple[str | None, list[Event]]:
        """Write records, an intent and events atomically, in one round trip.

        The failover's steps (server failed and warm switches; the cold part; each interim
        that serves) go through here, each on the way to a client's notification. One Lua
        script numbers the events and writes everything: a put and an event per app, one
        after the other, had cost ~1 ms each on a busy machine, and a counter read then a
        transaction two round trips. Returns the intent's id and the events with their
        sequence numbers, to hand to the subscribers.
        """
        intent_id = uuid.uuid4().hex[:12] if intent is not None else None
        stamp = now()
        for record in apps:
            record.updated_at = stamp
        checked_apps = [checked_app(a) for a in apps]
        checked_servers = [checked_server(s) for s in servers]
        app_pairs = [(app_id, raw) for app_id, raw, _ in checked_apps]
        server_pairs = [(server_id, raw) for server_id, raw, _ in checked_servers]
        batch = {
            "intent": ([intent_id, json.dumps({"at": stamp, **intent})]
                       if intent is not None else None),
            "servers": server_pairs,
            "apps": app_pairs,
            # The script puts each event's number in front of the rest of its JSON.
            "events": [e.model_dump_json(exclude={"seq"}) for e in events],
            "maxlen": EVENT_STREAM_MAXLEN,
        }
        if app_pairs or server_pairs:
            await self._loaded()
        async with self._event_lock:  # seq order == the order subscribers are handed them
            try:
                first, rev = await self._commit_script(
                    keys=[self._key(k) for k in ("intents", "servers", "apps", "events",
                                                 "event_seq", "rev")],
                    args=[json.dumps(batch, ensure_ascii=False)])
            except BaseException:
                self._cache.invalidate()
                raise
            if app_pairs or server_pairs:
                self._applied(int(rev), apps=app_pairs, servers=server_pairs,
                              parsed_apps={a: p for a, _, p in checked_apps},
                              parsed_servers={s: p for s, _, p in checked_servers})
        stored = [e.model_copy(update={"seq": int(first) + i}) for i, e in enumerate(events)]
        return intent_id, stored

    # --- config and plan ---------------------------------------------------------------------

    async def config(self) -> RuntimeConfig | None:
        """The stored runtime config (None before the first start, or once quarantined)."""
        raw = await self._string("config")
        if not raw:
            return None
        try:
            return RuntimeConfig.model_validate_json(raw)
        except ValueError as exc:
            await self.quarantine.value("config", Bad(None, raw, reason_of(exc)))
            return None

    async def put_config(self, config: RuntimeConfig) -> None:
        """Store the runtime config."""
        await self.redis.set(self._key("config"), config.model_dump_json())

    async def plan(self) -> dict[str, Any] | None:
        """The last warm plan summary."""
        raw = await self._string("plan")
        plan = json_object(raw) if raw else None
        if raw and plan is None:
            await self.quarantine.value("plan", Bad(None, raw, "not a JSON object"))
        return plan

    async def put_plan(self, plan: dict[str, Any]) -> None:
        """Store the warm plan summary."""
        await self.redis.set(self._key("plan"), json.dumps(plan))

    # --- events ------------------------------------------------------------------------------

    async def append_event(self, event: Event) -> Event:
        """Give the event the next sequence number and append it to the stream."""
        _, stored = await self.commit(events=[event])
        return stored[0]

    async def events(self, since: int = 0, app_id: str | None = None,
                     limit: int = 1000) -> list[Event]:
        """Events with ``seq > since`` (oldest first), optionally of one app."""
        found: list[Event] = []
        start = f"({since}-0" if since > 0 else "-"
        while len(found) < limit:
            batch = await self.quarantine.tolerant("events", functools.partial(
                self.redis.xrange, self._key("events"), min=start, max="+", count=500))
            if not batch:
                break
            bad: list[Bad] = []
            for entry_id, fields in batch:
                start = f"({entry_id}"
                raw = fields.get("data", "")
                try:
                    event = Event.model_validate_json(raw)
                except ValueError as exc:
                    bad.append(Bad(entry_id, raw, reason_of(exc)))
                    continue
                if app_id is None or event.app_id == app_id:
                    found.append(event)
            if bad:
                await self.quarantine.stream_entries("events", bad)
        return found[:limit]

    async def last_seq(self) -> int:
        """Sequence number of the newest event (0 when none)."""
        value = await self.redis.get(self._key("event_seq"))
        return int(value) if value else 0

    # --- intents (write-ahead) ---------------------------------------------------------------

    async def add_intent(self, kind: str, **details: Any) -> str:
        """Record what we are about to do; returns its id (remove it when done)."""
        intent_id = uuid.uuid4().hex[:12]
        await self.redis.hset(self._key("intents"), intent_id,
                              json.dumps({"kind": kind, "at": now(), **details}))
        return intent_id

    async def done_intent(self, intent_id: str) -> None:
        """The intent completed (or was superseded)."""
        await self.redis.hdel(self._key("intents"), intent_id)

    async def intents(self) -> dict[str, dict[str, Any]]:
        """Unfinished intents (after a crash: what to resume); unreadable ones quarantined."""
        raw = await self._hash("intents")
        intents = {k: json_object(v) for k, v in raw.items()}
        bad = [Bad(k, raw[k], "not a JSON object with a kind and server ids")
               for k, v in intents.items() if v is None or not _intent_ok(v)]
        if bad:
            await self.quarantine.fields("intents", bad)
        refused = {b.field for b in bad}
        return {k: v for k, v in intents.items() if v is not None and k not in refused}

    # --- service graphs ----------------------------------------------------------------------

    async def put_graph(self, record: GraphRecord) -> None:
        """Write a graph record (stamps ``updated_at``)."""
        record.updated_at = now()
        await self.redis.hset(self._key("graphs"), record.name, record.model_dump_json())

    async def add_graph(self, record: GraphRecord) -> bool:
        """Write a new graph record; False when the name is taken."""
        record.updated_at = now()
        return bool(await self.redis.hsetnx(self._key("graphs"), record.name,
                                            record.model_dump_json()))

    async def get_graph(self, name: str) -> GraphRecord | None:
        """One graph record (None when there is none, or it was quarantined)."""
        raw = await self._hget("graphs", name)
        return (await self._graph_records({name: raw})).get(name) if raw else None

    async def graphs(self) -> dict[str, GraphRecord]:
        """Every graph record by name (unreadable ones quarantined)."""
        return await self._graph_records(dict(sorted((await self._hash("graphs")).items())))

    async def _graph_records(self, raws: dict[str, str]) -> dict[str, GraphRecord]:
        records: dict[str, GraphRecord] = {}
        bad: list[Bad] = []
        for name, raw in raws.items():
            try:
                records[name] = GraphRecord.model_validate_json(raw)
            except ValueError as exc:
                bad.append(Bad(name, raw, reason_of(exc)))
        if bad:
            await self.quarantine.fields("graphs", bad)
        return records

    async def delete_graph(self, name: str) -> None:
        """Forget a graph."""
        await self.redis.hdel(self._key("graphs"), name)

    # --- reads that survive a key of the wrong type ------------------------------------------

    async def _string(self, name: str) -> str | None:
        return await self.quarantine.tolerant(name, lambda: self.redis.get(self._key(name)))  # type: ignore[no-any-return]

    async def _hash(self, name: str) -> dict[str, str]:
        return await self.quarantine.tolerant(name, lambda: self.redis.hgetall(self._key(name)))  # type: ignore[no-any-return]

    async def _hget(self, name: str, field: str) -> str | None:
        return await self.quarantine.tolerant(name, lambda: self.redis.hget(self._key(name), field))  # type: ignore[no-any-return]


def _revision(raw: Any) -> int | None:
    """The stored revision (0 before the first write); None when the value is no revision."""
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _intent_ok(intent: dict[str, Any]) -> bool:
    """Whether an intent read back has the shape the controller wrote (what resuming reads)."""
    server_ids = intent.get("server_ids", [])
    return isinstance(intent.get("kind"), str) and \
        isinstance(intent.get("server_id", ""), str | None) and \
        isinstance(server_ids, list) and all(isinstance(s, str) for s in server_ids)
