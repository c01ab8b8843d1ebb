"""In-memory fakes of the controller's outside world (``tests/unit/controller_harness.py``
wires a controller on them).

Each fake implements one Protocol of ``controller/interfaces.py``. Nothing here sleeps or
polls: agent commands are futures the test resolves (``FakeAgents.complete_load``), the
clock moves only when the test moves it, and a test waits on a condition with
``Timeline.until`` (re-checked after every event, command and store write) or on
``Executor.idle()``.

One ``Timeline`` is shared by the sink, the agents and the store, so a test can assert that an
event reached the clients before (or after) a given agent command.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.errors import AgentCommandError, AgentUnavailableError
from controller.record_cache import ReadOnlyAppRecord, ReadOnlyServerRecord, RecordsView
from controller.records import (
    AppRecord,
    Event,
    ServerRecord,
)
from understudy.wire.artifacts import Manifest
from understudy.wire.protocol import (
    CommandResult,
    Endpoints,
    Hello,
    InventoryItem,
    ModelState,
    model_name,
)

WAIT_S = 5.0
"""Hard limit of any wait on a condition (a hang fails the test instead of blocking it)."""


# --- clock -----------------------------------------------------------------------------------


class ManualClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.mono = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


# --- timeline and events ---------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One thing that happened: an event delivered or an agent command sent."""

    what: str
    """An event kind ("warm_switch" ...) or a command ("load", "unload", "inventory")."""
    app_id: str
    server_id: str | None = None
    variant: str | None = None
    urgent: bool = False

    @property
    def is_event(self) -> bool:
        return self.what not in ("load", "unload", "inventory", "prefetch")


class Timeline:
    """What happened, in order, shared by the fakes; wakes whoever waits on a condition.

    The sink appends delivered events, the agents the commands they were sent, and the store
    pokes it after every write.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._changed: asyncio.Event | None = None

    def append(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.poke()

    def poke(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def until(self, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        """Wait until ``condition()`` holds; re-checked after every event, command and write."""
        async def wait() -> None:
            while not condition():
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()
        await asyncio.wait_for(wait(), timeout_s)


class CollectingSink:
    """EventSink: keeps every delivered event, in delivery order."""

    def __init__(self, timeline: Timeline | None = None) -> None:
        self.delivered: list[Event] = []
        self.timeline = timeline if timeline is not None else Timeline()
        self.on_deliver: Callable[[list[Event]], None] = lambda events: None

    def deliver(self, events: list[Event]) -> None:
        for event in events:
            self.delivered.append(event)
            self.timeline.append(Entry(event.kind, event.app_id, event.server_id,
                                       event.variant))
        self.on_deliver(events)

    def kinds(self, app_id: str | None = None) -> list[tuple[str, str]]:
        """(kind, app) of every delivered event (of one app), in order."""
        return [(e.kind, e.app_id) for e in self.delivered
                if app_id is None or e.app_id == app_id]


# --- store -----------------------------------------------------------------------------------


class FakeStore:
    """RecordStore kept as JSON: a caller's object never changes the store without a commit.

    A new controller built on the same FakeStore (a restart) sees what was committed.
    ``on_commit`` is called after every write, with the store already updated.
    """

    def __init__(self, clock: ManualClock, timeline: Timeline | None = None) -> None:
        self.clock = clock
        self.timeline = timeline if timeline is not None else Timeline()
        self._apps: dict[str, str] = {}
        self._servers: dict[str, str] = {}
        self._intents: dict[str, str] = {}
        self.events: list[Event] = []
        self.plan: dict[str, Any] | None = None
        self.intents_written: list[dict[str, Any]] = []
        self.on_commit: Callable[[], None] = lambda: None
        self.writes = 0
        self._view: RecordsView | None = None
        self._parsed_records: dict[tuple[Any, str], tuple[str, Any]] = {}
        self.revision_now = 0
        """Bumped by every change of an app or server record (``revision``)."""

    def _written(self) -> None:
        self.writes += 1
        self._changed()
        self.on_commit()
        self.timeline.poke()

    # synchronous views, for assertions
    def app(self, app_id: str) -> AppRecord:
        return AppRecord.model_validate_json(self._apps[app_id])

    def all_apps(self) -> dict[str, AppRecord]:
        return {k: AppRecord.model_validate_json(v) for k, v in sorted(self._apps.items())}

    def server(self, server_id: str) -> ServerRecord:
        return ServerRecord.model_validate_json(self._servers[server_id])

    def all_servers(self) -> dict[str, ServerRecord]:
        return {k: ServerRecord.model_validate_json(v)
                for k, v in sorted(self._servers.items())}

    def put_app_now(self, record: AppRecord) -> None:
        self._apps[record.app_id] = record.model_dump_json()
        self._changed()

    def put_server_now(self, record: ServerRecord) -> None:
        self._servers[record.server_id] = record.model_dump_json()
        self._changed()

    def _changed(self) -> None:
        self.revision_now += 1
        self._view = None

    # RecordStore
    async def view(self) -> RecordsView:
        # Read-only records like the real store's: a decision that changes one fails loudly.
        # Like the real cache, a record unchanged since the last view is the same object.
        if self._view is None:
            self._view = RecordsView(
                self.revision_now,
                {k: self._parsed(k, v, ReadOnlyAppRecord) for k, v in sorted(self._apps.items())},
                {k: self._parsed(k, v, ReadOnlyServerRecord)
                 for k, v in sorted(self._servers.items())},
                tuple(sorted(self._apps)))
        return self._view

    def _parsed(self, key: str, raw: str, kind: Any) -> Any:
        hit = self._parsed_records.get((kind, key))
        if hit is None or hit[0] != raw:
            hit = self._parsed_records[(kind, key)] = (raw, kind.model_validate_json(raw))
        return hit[1]

    async def revision(self) -> int:
        return self.revision_now

    async def apps(self) -> dict[str, AppRecord]:
        return self.all_apps()

    async def servers(self) -> dict[str, ServerRecord]:
        return self.all_servers()

    async def app_ids(self) -> list[str]:
        return list(self._apps)

    async def get_app(self, app_id: str) -> AppRecord | None:
        raw = self._apps.get(app_id)
        return AppRecord.model_validate_json(raw) if raw else None

    async def app_record(self, app_id: str) -> AppRecord | None:
        return (await self.view()).apps.get(app_id)

    async def server_records(self) -> Mapping[str, ServerRecord]:
        return (await self.view()).servers

    async def apps_on(self, server_id: str) -> list[str]:
        found = []
        for app_id, record in self.all_apps().items():
            if any(r.server_id == server_id for r in record.replicas) or \
                    (record.serving is not None and record.serving[0] == server_id):
                found.append(app_id)
        return found

    async def add_app(self, record: AppRecord) -> bool:
        if record.app_id in self._apps:
            return False
        self.put_app_now(record)
        self._written()
        return True

    async def add_apps(self, records: Sequence[AppRecord]) -> list[bool]:
        added = []
        for record in records:
            added.append(record.app_id not in self._apps)
            if added[-1]:
                self.put_app_now(record)
        self._written()
        return added

    async def delete_app(self, app_id: str) -> None:
        self._apps.pop(app_id, None)
        self._written()

    async def put_server(self, record: ServerRecord) -> None:
        self.put_server_now(record)
        self._written()

    async def app_and_servers(self, app_id: str
                              ) -> tuple[AppRecord | None, dict[str, ServerRecord]]:
        return await self.get_app(app_id), self.all_servers()

    async def apps_and_servers(self) -> tuple[dict[str, AppRecord], dict[str, ServerRecord]]:
        return self.all_apps(), self.all_servers()

    async def commit(self, *, apps: Sequence[AppRecord] = (),
                     servers: Sequence[ServerRecord] = (),
                     intent: dict[str, Any] | None = None,
                     events: Sequence[Event] = ()) -> tuple[str | None, list[Event]]:
        intent_id = None
        if intent is not None:
            intent_id = uuid.uuid4().hex[:12]
            stored_intent = {"at": self.clock.time(), **intent}
            self._intents[intent_id] = json.dumps(stored_intent)
            self.intents_written.append(stored_intent)
        for server in servers:
            self.put_server_now(server)
        for record in apps:
            record.updated_at = self.clock.time()
            self.put_app_now(record)
        first = len(self.events) + 1
        stored = [e.model_copy(update={"seq": first + i}) for i, e in enumerate(events)]
        self.events.extend(e.model_copy() for e in stored)
        self._written()
        return intent_id, stored

    async def done_intent(self, intent_id: str) -> None:
        self._intents.pop(intent_id, None)

    async def intents(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(v) for k, v in self._intents.items()}

    def intents_now(self) -> list[dict[str, Any]]:
        return [json.loads(v) for v in self._intents.values()]

    async def put_plan(self, plan: dict[str, Any]) -> None:
        self.plan = json.loads(json.dumps(plan))


# --- agents ----------------------------------------------------------------------------------


@dataclass
class Pending:
    """A load or unload sent to an agent, waiting for the test to resolve it."""

    op: str
    server_id: str
    app_id: str
    variant: str
    urgent: bool
    future: asyncio.Future[CommandResult] = field(repr=False)


class FakeAgents:
    """AgentLink: every command recorded in order; loads and unloads resolved by the test.

    ``models[server]`` maps (app, variant) to the model's state on that server's Triton:
    LOADING while a load is pending, READY once it succeeded, gone once unloaded. With
    ``auto_load`` / ``auto_unload`` a command succeeds the moment it is sent.
    """

    def __init__(self, timeline: Timeline | None = None, *, auto_load: bool = False,
                 auto_unload: bool = True) -> None:
        self.timeline = timeline if timeline is not None else Timeline()
        self.log: list[Entry] = []
        self.auto_load = auto_load
        self.auto_unload = auto_unload
        self.connected_servers: set[str] = set()
        self.models: dict[str, dict[tuple[str, str], ModelState]] = {}
        self.pending: list[Pending] = []
        self.failing: dict[tuple[str, str, str], str] = {}
        """(server, app, variant) -> error message: loads answered with that agent error."""

    # --- test controls -----------------------------------------------------------------------

    def connect(self, server_id: str, holding: Iterable[tuple[str, str]] = ()) -> None:
        self.connected_servers.add(server_id)
        held = self.models.setdefault(server_id, {})
        for key in holding:
            held[key] = ModelState.READY

    def disconnect(self, server_id: str) -> None:
        self.connected_servers.discard(server_id)

    def held(self, server_id: str) -> set[tuple[str, str]]:
        """(app, variant) READY on a server."""
        return {k for k, s in self.models.get(server_id, {}).items()
                if s is ModelState.READY}

    def commands(self, *ops: str) -> list[Entry]:
        """The commands sent, in order (only ``ops`` when given)."""
        return [e for e in self.log if not ops or e.what in ops]

    def find(self, op: str, server_id: str, app_id: str, variant: str) -> Pending | None:
        return next((p for p in self.pending if (p.op, p.server_id, p.app_id, p.variant)
                     == (op, server_id, app_id, variant)), None)

    async def wait_pending(self, op: str, server_id: str, app_id: str,
                           variant: str) -> Pending:
        await self.timeline.until(lambda: self.find(op, server_id, app_id, variant) is not None)
        found = self.find(op, server_id, app_id, variant)
        assert found is not None
        return found

    async def complete_load(self, server_id: str, app_id: str, variant: str,
                            load_s: float = 0.5) -> None:
        """Answer a pending load with success (waits until it was sent)."""
        pending = await self.wait_pending("load", server_id, app_id, variant)
        self._resolve_load(pending, load_s)

    async def fail_load(self, server_id: str, app_id: str, variant: str,
                        message: str = "out of memory") -> None:
        """Answer a pending load with an agent error (waits until it was sent)."""
        pending = await self.wait_pending("load", server_id, app_id, variant)
        self.pending.remove(pending)
        self.models[server_id].pop((app_id, variant), None)
        pending.future.set_exception(AgentCommandError(f"{server_id}: load failed: {message}",
                                                       code="load_failed"))

    async def complete_unload(self, server_id: str, app_id: str, variant: str) -> None:
        pending = await self.wait_pending("unload", server_id, app_id, variant)
        self._resolve_unload(pending)

    def complete_all(self) -> int:
        """Answer every pending command with success; returns how many."""
        count = 0
        for pending in list(self.pending):
            if pending.op == "load":
                self._resolve_load(pending, 0.5)
            else:
                self._resolve_unload(pending)
            count += 1
        return count

    def drop_pending(self) -> None:
        """A controller crash: its commands' answers never arrive (the agents finish them)."""
        for pending in self.pending:
            if pending.op == "load":
                self.models[pending.server_id][(pending.app_id, pending.variant)] = \
                    ModelState.READY
            else:
                self.models[pending.server_id].pop((pending.app_id, pending.variant), None)
            pending.future.cancel()
        self.pending.clear()

    def hello(self, server_id: str, site_id: str, memory_mb: float) -> Hello:
        """The hello the server's agent sends on (re)connecting, with what it holds."""
        self.connect(server_id)
        return Hello(server_id=server_id, site_id=site_id,
                     capacity={"memory_mb": memory_mb, "compute": 100.0},
                     endpoints=endpoints_of(server_id), inventory=self._items(server_id),
                     boot_id="boot-" + server_id)

    # --- AgentLink ---------------------------------------------------------------------------

    def connected(self, server_id: str) -> bool:
        return server_id in self.connected_servers

    async def load(self, server_id: str, app_id: str, variant: str, urgent: bool = False,
                   manifest: Manifest | None = None) -> CommandResult:
        future = self._send("load", server_id, app_id, variant, urgent)
        self.models.setdefault(server_id, {}).setdefault((app_id, variant),
                                                            ModelState.LOADING)
        if (server_id, app_id, variant) in self.failing:
            self.pending.pop()
            self.models[server_id].pop((app_id, variant), None)
            raise AgentCommandError(self.failing[(server_id, app_id, variant)])
        if self.auto_load:
            self._resolve_load(self.pending[-1], 0.5)
        return await future

    async def unload(self, server_id: str, app_id: str, variant: str) -> CommandResult:
        return await (await self.start_unload(server_id, app_id, variant))

    async def start_unload(self, server_id: str, app_id: str,
                           variant: str) -> Awaitable[CommandResult]:
        future = self._send("unload", server_id, app_id, variant, False)
        if self.auto_unload:
            self._resolve_unload(self.pending[-1])
        return future

    async def prefetch(self, server_id: str, variant: str,
                       manifest: Manifest | None = None) -> CommandResult:
        if server_id not in self.connected_servers:
            raise AgentUnavailableError(f"agent of server {server_id} is not connected")
        self.log.append(Entry("prefetch", "", server_id, variant))
        self.timeline.poke()
        return CommandResult(command_id="prefetch", ok=True, command="prefetch")

    async def inventory(self, server_id: str) -> list[InventoryItem]:
        if server_id not in self.connected_servers:
            raise AgentUnavailableError(f"agent of server {server_id} is not connected")
        self._record(Entry("inventory", "", server_id))
        return self._items(server_id)

    # --- internals ---------------------------------------------------------------------------

    def _record(self, entry: Entry) -> None:
        self.log.append(entry)
        self.timeline.append(entry)

    def _send(self, op: str, server_id: str, app_id: str, variant: str,
              urgent: bool) -> asyncio.Future[CommandResult]:
        if server_id not in self.connected_servers:
            raise AgentUnavailableError(f"agent of server {server_id} is not connected")
        future: asyncio.Future[CommandResult] = asyncio.get_running_loop().create_future()
        self.pending.append(Pending(op, server_id, app_id, variant, urgent, future))
        self._record(Entry(op, app_id, server_id, variant, urgent))
        return future

    def _resolve_load(self, pending: Pending, load_s: float) -> None:
        self.pending.remove(pending)
        self.models[pending.server_id][(pending.app_id, pending.variant)] = ModelState.READY
        pending.future.set_result(CommandResult(
            command_id="load", ok=True, command="load",
            model_name=model_name(pending.app_id, pending.variant), state=ModelState.READY,
            timings={"load_s": load_s}))

    def _resolve_unload(self, pending: Pending) -> None:
        self.pending.remove(pending)
        self.models.get(pending.server_id, {}).pop((pending.app_id, pending.variant), None)
        pending.future.set_result(CommandResult(command_id="unload", ok=True, command="unload"))

    def _items(self, server_id: str) -> list[InventoryItem]:
        return [InventoryItem(model_name=model_name(a, v), app_id=a, variant=v, state=s)
                for (a, v), s in sorted(self.models.get(server_id, {}).items())]


def endpoints_of(server_id: str) -> Endpoints:
    return Endpoints(http=f"http://{server_id}:8000", grpc=f"{server_id}:8001")


# --- detector, manifests ---------------------------------------------------------------------


class FakeWatch:
    """FailureWatch: which servers are watched, and the false alarms reported."""

    def __init__(self, timeout_s: float = 0.04) -> None:
        self._timeout_s = timeout_s
        self.watched: dict[str, float | None] = {}
        self.false_alarms: list[str] = []
        self.forgotten: list[str] = []

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def watch(self, server_id: str, grace_s: float | None = None) -> None:
        self.watched[server_id] = grace_s

    def watching(self, server_id: str) -> bool:
        return server_id in self.watched

    def false_alarm(self, server_id: str) -> None:
        self.false_alarms.append(server_id)

    def forget(self, server_id: str) -> None:
        self.watched.pop(server_id, None)
        self.forgotten.append(server_id)


class NoManifests:
    """ManifestSource without an artifact store."""

    async def manifest(self, variant: str) -> Manifest | None:
        return None
