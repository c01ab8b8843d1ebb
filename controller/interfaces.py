"""The narrow views of the outside world the controller's core works through.

Each is a Protocol: the real one is ``controller.store.Store`` (Redis),
``controller.agents.AgentHub`` (the agents' websockets), ``controller.detector.FailureDetector``
and ``controller.events.EventHub``; ``tests/unit/fakes.py`` has in-memory ones with a clock the
test moves by hand.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from controller.record_cache import RecordsView
from controller.records import AppRecord, Event, ServerRecord
from understudy.wire.artifacts import Manifest
from understudy.wire.protocol import CommandResult, InventoryItem


class RecordStore(Protocol):
    """Apps, servers, intents and events as stored (Redis).

    ``view`` shares read-only records for callers that only look; every other read returns
    private copies a caller may change and commit.
    """

    async def view(self) -> RecordsView: ...
    async def revision(self) -> int: ...
    async def apps(self) -> dict[str, AppRecord]: ...
    async def servers(self) -> dict[str, ServerRecord]: ...
    async def app_ids(self) -> list[str]: ...
    async def get_app(self, app_id: str) -> AppRecord | None: ...
    async def add_app(self, record: AppRecord) -> bool: ...
    async def add_apps(self, records: Sequence[AppRecord]) -> list[bool]: ...
    async def delete_app(self, app_id: str) -> None: ...
    async def put_server(self, record: ServerRecord) -> None: ...
    async def app_and_servers(self, app_id: str
                              ) -> tuple[AppRecord | None, dict[str, ServerRecord]]: ...
    async def apps_and_servers(self) -> tuple[dict[str, AppRecord],
                                              dict[str, ServerRecord]]: ...
    async def commit(self, *, apps: Sequence[AppRecord] = (),
                     servers: Sequence[ServerRecord] = (),
                     intent: dict[str, Any] | None = None,
                     events: Sequence[Event] = ()) -> tuple[str | None, list[Event]]: ...
    async def done_intent(self, intent_id: str) -> None: ...
    async def intents(self) -> dict[str, dict[str, Any]]: ...
    async def put_plan(self, plan: dict[str, Any]) -> None: ...


class AgentLink(Protocol):
    """Commands to the servers' agents."""

    def connected(self, server_id: str) -> bool: ...
    async def load(self, server_id: str, app_id: str, variant: str, urgent: bool = False,
                   manifest: Manifest | None = None) -> CommandResult: ...
    async def unload(self, server_id: str, app_id: str, variant: str) -> CommandResult: ...
    async def start_unload(self, server_id: str, app_id: str,
                           variant: str) -> Awaitable[CommandResult]: ...
    async def prefetch(self, server_id: str, variant: str,
                       manifest: Manifest | None = None) -> CommandResult: ...
    async def inventory(self, server_id: str) -> list[InventoryItem]: ...


class FailureWatch(Protocol):
    """The failure detector, as the server life cycle uses it."""

    @property
    def timeout_s(self) -> float: ...
    def watch(self, server_id: str, grace_s: float | None = None) -> None: ...
    def watching(self, server_id: str) -> bool: ...
    def false_alarm(self, server_id: str) -> None: ...
    def forget(self, server_id: str) -> None: ...


class EventSink(Protocol):
    """Pushes stored (numbered) events to the subscribed clients."""

    def deliver(self, events: list[Event]) -> None: ...


class ManifestSource(Protocol):
    """The artifact manifest of a variant (None when no artifact store is configured)."""

    async def manifest(self, variant: str) -> Manifest | None: ...


class Clock(Protocol):
    """Wall-clock seconds (records and events) and a monotonic timer (durations)."""

    def time(self) -> float: ...
    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """A monotonic timer, for durations."""
        return time.perf_counter()
