"""The only module that talks to Redis: apps, servers, config, warm plan, events, intents.

Keys (all under a prefix, default ``us:``):

* ``apps`` hash: app id -> :class:`AppRecord` JSON (the desired and observed replicas);
* ``servers`` hash: server id -> :class:`ServerRecord` JSON;
* ``config`` string: :class:`RuntimeConfig` JSON;  ``plan`` string: last warm plan summary;
* ``events`` stream with ids ``<seq>-0`` and ``event_seq`` counter: the notification history;
* ``intents`` hash: intent id -> what the controller is about to do (write-ahead);
* ``graphs`` hash: graph name -> :class:`GraphRecord` JSON (service graphs: spec, placement).

The client retries on connection errors with back-off, so a Redis restart stalls writes for
a moment instead of failing them; with append-only persistence nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controller.graphs.records import GraphRecord
from controller.records import AppRecord, Event, RuntimeConfig, ServerRecord, now

logger = logging.getLogger(__name__)

EVENT_STREAM_MAXLEN = 100_000


_COMMIT_LUA = """
-- KEYS: intents, servers, apps, events, event_seq.  ARGV[1]: the batch as JSON (Store.commit).
-- Returns the first event's sequence number (0 without events).
local batch = cjson.decode(ARGV[1])
if type(batch.intent) == 'table' then
  redis.call('HSET', KEYS[1], batch.intent[1], batch.intent[2])
end
for _, pair in ipairs(batch.servers) do redis.call('HSET', KEYS[2], pair[1], pair[2]) end
for _, pair in ipairs(batch.apps) do redis.call('HSET', KEYS[3], pair[1], pair[2]) end
local count = #batch.events
if count == 0 then return 0 end
local first = redis.call('INCRBY', KEYS[5], count) - count + 1
for i, rest in ipairs(batch.events) do
  local seq = first + i - 1
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', batch.maxlen, seq .. '-0',
             'data', '{"seq":' .. seq .. ',' .. string.sub(rest, 2))
end
return first
"""


def _apps_from(raw: dict[str, str]) -> dict[str, AppRecord]:
    return {k: AppRecord.model_validate_json(v) for k, v in sorted(raw.items())}


def _servers_from(raw: dict[str, str]) -> dict[str, ServerRecord]:
    return {k: ServerRecord.model_validate_json(v) for k, v in sorted(raw.items())}


class Store:
    """Async Redis store of the controller's state."""

    def __init__(self, url: str, prefix: str = "us:") -> None:
        self.url = url
        self.prefix = prefix
        self.redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=5.0, socket_connect_timeout=2.0,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=40),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            health_check_interval=5)
        self._event_lock = asyncio.Lock()
        self._commit_script = self.redis.register_script(_COMMIT_LUA)

    def _key(self, name: str) -> str:
        return self.prefix + name

    async def ping(self) -> bool:
        """Whether Redis answers (one try, no retries)."""
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), 1.0))
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False

    async def close(self) -> None:
        """Close the connection pool."""
        await self.redis.aclose()

    # --- apps --------------------------------------------------------------------------------

    async def put_app(self, record: AppRecord) -> None:
        """Write an app record (stamps ``updated_at``)."""
        record.updated_at = now()
        await self.redis.hset(self._key("apps"), record.app_id, record.model_dump_json())

    async def add_app(self, record: AppRecord) -> bool:
        """Write a new app record; False when the id is taken."""
        return bool(await self.redis.hsetnx(self._key("apps"), record.app_id,
                                            record.model_dump_json()))

    async def app_ids(self) -> list[str]:
        """The ids of every registered app."""
        return [k.decode() if isinstance(k, bytes) else str(k)
                for k in await self.redis.hkeys(self._key("apps"))]

    async def get_app(self, app_id: str) -> AppRecord | None:
        """One app record."""
        raw = await self.redis.hget(self._key("apps"), app_id)
        return AppRecord.model_validate_json(raw) if raw else None

    async def apps(self) -> dict[str, AppRecord]:
        """Every app record by id."""
        return _apps_from(await self.redis.hgetall(self._key("apps")))

    async def delete_app(self, app_id: str) -> None:
        """Forget an app."""
        await self.redis.hdel(self._key("apps"), app_id)

    # --- servers -----------------------------------------------------------------------------

    async def put_server(self, record: ServerRecord) -> None:
        """Write a server record."""
        await self.redis.hset(self._key("servers"), record.server_id, record.model_dump_json())

    async def servers(self) -> dict[str, ServerRecord]:
        """Every server record by id."""
        return _servers_from(await self.redis.hgetall(self._key("servers")))

    async def app_and_servers(self, app_id: str
                              ) -> tuple[AppRecord | None, dict[str, ServerRecord]]:
        """One app record and every server record, read in one round trip."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(self._key("apps"), app_id)
            pipe.hgetall(self._key("servers"))
            raw_app, raw_servers = await pipe.execute()
        return (AppRecord.model_validate_json(raw_app) if raw_app else None,
                _servers_from(raw_servers))

    async def apps_and_servers(self) -> tuple[dict[str, AppRecord], dict[str, ServerRecord]]:
        """Every app and server record, read in one round trip."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._key("apps"))
            pipe.hgetall(self._key("servers"))
            raw_apps, raw_servers = await pipe.execute()
        return _apps_from(raw_apps), _servers_from(raw_servers)

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
        batch = {
            "intent": ([intent_id, json.dumps({"at": stamp, **intent})]
                       if intent is not None else None),
            "servers": [[s.server_id, s.model_dump_json()] for s in servers],
            "apps": [[a.app_id, a.model_dump_json()] for a in apps],
            # The script puts each event's number in front of the rest of its JSON.
            "events": [e.model_dump_json(exclude={"seq"}) for e in events],
            "maxlen": EVENT_STREAM_MAXLEN,
        }
        async with self._event_lock:  # seq order == the order subscribers are handed them
            first = int(await self._commit_script(
                keys=[self._key(k) for k in ("intents", "servers", "apps", "events",
                                             "event_seq")],
                args=[json.dumps(batch, ensure_ascii=False)]))
        stored = [e.model_copy(update={"seq": first + i}) for i, e in enumerate(events)]
        return intent_id, stored

    # --- config and plan ---------------------------------------------------------------------

    async def config(self) -> RuntimeConfig | None:
        """The stored runtime config (None before the first start)."""
        raw = await self.redis.get(self._key("config"))
        return RuntimeConfig.model_validate_json(raw) if raw else None

    async def put_config(self, config: RuntimeConfig) -> None:
        """Store the runtime config."""
        await self.redis.set(self._key("config"), config.model_dump_json())

    async def plan(self) -> dict[str, Any] | None:
        """The last warm plan summary."""
        raw = await self.redis.get(self._key("plan"))
        return json.loads(raw) if raw else None

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
            batch = await self.redis.xrange(self._key("events"), min=start, max="+", count=500)
            if not batch:
                break
            for entry_id, fields in batch:
                event = Event.model_validate_json(fields["data"])
                if app_id is None or event.app_id == app_id:
                    found.append(event)
                start = f"({entry_id}"
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
        """Unfinished intents (after a crash: what to resume)."""
        raw = await self.redis.hgetall(self._key("intents"))
        return {k: json.loads(v) for k, v in raw.items()}

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
        """One graph record."""
        raw = await self.redis.hget(self._key("graphs"), name)
        return GraphRecord.model_validate_json(raw) if raw else None

    async def graphs(self) -> dict[str, GraphRecord]:
        """Every graph record by name."""
        raw = await self.redis.hgetall(self._key("graphs"))
        return {k: GraphRecord.model_validate_json(v) for k, v in sorted(raw.items())}

    async def delete_graph(self, name: str) -> None:
        """Forget a graph."""
        await self.redis.hdel(self._key("graphs"), name)
