"""The one place where decisions become writes, agent commands and client events.

Applying a :class:`~controller.decide.decision.Decision` always goes the same way:

1. :meth:`Executor.commit` (under the caller's locks): the decision's records, its intent and
   its events go to Redis in one transaction, *before* any agent is told anything, then the
   events (now numbered) are pushed to the clients.
2. :meth:`Executor.run` (after the locks are released): the decision's stages, under the rule
   of ``policies.actions.Stage`` (a stage waits for the stages it names; inside one, an app's
   actions run in order, different apps' at the same time). The simulator runs the same
   stages against its simulated cluster.

Each action's result is fed back as a new decision: a finished load goes through the serving
state machine (``controller.decide.serving``) in one locked step with one transaction for the
record and its event, because that is the path from an interim's load to its clients. A
failure of one action is logged and never stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

from controller.decide.decision import LOADED_FOR_THE_CHANGE, Decision, Recovery
from controller.decide.serving import decide_advance, drop_replica
from controller.errors import AgentCommandError, AgentUnavailableError
from controller.interfaces import AgentLink, Clock, EventSink, ManifestSource, RecordStore
from controller.metrics import Metrics
from controller.records import AppRecord, AppStatus, ServerState
from policies.actions import (
    Action,
    LoadVariant,
    PromoteReplica,
    RemoveStray,
    Stage,
    UnloadVariant,
)
from understudy.wire.protocol import ModelState

logger = logging.getLogger(__name__)

SERVING_MOVES = LOADED_FOR_THE_CHANGE
"""Event kinds that tell a recovering app's clients where it serves now (its MTTR ends at the
first of them; a warm switch is counted by the failover itself)."""


class Locks:
    """The planning lock and one lock per app.

    A decision over many apps holds the planning lock and every app's lock; a finished load
    holds only its app's. Taken in id order, so two holders cannot deadlock; nobody holding
    one app's lock waits for another's or for the planning lock.

    The registered apps' ids are read from the store once and then kept here
    (:meth:`registered`, :meth:`forgotten`), so that taking every lock costs no round trip on
    a failover's path. An app recorded meanwhile without its lock held is safe: it has no
    replica yet, and its placement needs the planning lock.
    """

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self.plan = asyncio.Lock()
        self._apps: dict[str, asyncio.Lock] = {}
        self._known: set[str] | None = None

    def app(self, app_id: str) -> asyncio.Lock:
        """Serialises record updates of one app."""
        return self._apps.setdefault(app_id, asyncio.Lock())

    def registered(self, app_id: str) -> None:
        """An app was recorded: :meth:`every_app` includes it from now on."""
        if self._known is not None:
            self._known.add(app_id)

    def forgotten(self, app_id: str) -> None:
        """An app was deleted."""
        if self._known is not None:
            self._known.discard(app_id)

    @contextlib.asynccontextmanager
    async def every_app(self) -> AsyncIterator[None]:
        """Holds the lock of every registered app (a decision that rewrites many records)."""
        if self._known is None:
            self._known = set(await self._store.app_ids())
        async with contextlib.AsyncExitStack() as stack:
            for app_id in sorted(self._known):
                await stack.enter_async_context(self.app(app_id))
            yield

    @contextlib.asynccontextmanager
    async def apps(self, app_ids: Iterable[str]) -> AsyncIterator[None]:
        """Holds the locks of ``app_ids`` (taken in id order)."""
        async with contextlib.AsyncExitStack() as stack:
            for app_id in sorted(set(app_ids)):
                await stack.enter_async_context(self.app(app_id))
            yield

    @contextlib.asynccontextmanager
    async def everything(self) -> AsyncIterator[None]:
        """The planning lock and every app's lock."""
        async with self.plan, self.every_app():
            yield


class Executor:
    """Applies decisions: write ahead, announce, then act, and feed the results back."""

    def __init__(self, store: RecordStore, agents: AgentLink, events: EventSink,
                 metrics: Metrics, artifacts: ManifestSource, clock: Clock,
                 on_serving_moved: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.agents = agents
        self.events = events
        self.metrics = metrics
        self.artifacts = artifacts
        self.clock = clock
        self.on_serving_moved = on_serving_moved
        self.locks = Locks(store)
        self.recoveries: dict[str, Recovery] = {}
        """Apps recovering from a failure, for the events' failure fields and MTTR."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._in_flight: Counter[tuple[str, str, str]] = Counter()
        self._urgent_loads = 0
        self.no_urgent_loads = asyncio.Event()
        """Set while no urgent load (one that ends an outage) is in flight."""
        self.no_urgent_loads.set()

    # --- background work ---------------------------------------------------------------------

    def spawn(self, coroutine: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        """Run in the background; log (never propagate) a failure: one app never blocks all."""
        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                logger.exception("%s failed", what)

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_all(self) -> None:
        """Stop every background task where it is (what a crash leaves behind)."""
        for task in list(self._tasks):
            task.cancel()

    async def idle(self) -> None:
        """Wait until no background work is left (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- applying a decision -----------------------------------------------------------------

    async def commit(self, decision: Decision) -> str | None:
        """Write the decision's records, intent and events in one transaction, then announce.

        Call it holding the locks the decision was made under. Returns the intent's id.
        """
        for app_id, recovery in decision.recoveries.items():
            self.recoveries[app_id] = recovery
        if not decision.writes:
            return None
        intent = dict(decision.intent) if decision.intent is not None else None
        intent_id, stored = await self.store.commit(
            apps=list(decision.apps), servers=list(decision.servers), intent=intent,
            events=list(decision.events))
        self.events.deliver(stored)
        by_id = {record.app_id: record for record in decision.apps}
        for event in stored:
            self.metrics.events.labels(event.kind).inc()
            record = by_id.get(event.app_id)
            if record is not None and event.kind in SERVING_MOVES:
                self._announced(record.app_id, record.status)
        if decision.notes:
            logger.info("%s", "; ".join(decision.notes))
        return intent_id

    async def act(self, decision: Decision) -> None:
        """What follows a commit: the stages, then a warm re-plan if serving moved."""
        await self.run(decision.stages)
        if decision.serving_moved:
            self.on_serving_moved()

    def in_flight(self) -> frozenset[tuple[str, str, str]]:
        """(server, app, variant) of every action of the stages running or waiting to run.

        The reconciler leaves these models alone: what it would see of them is in motion.
        """
        return frozenset(self._in_flight)

    async def run(self, stages: tuple[Stage, ...]) -> None:
        """Run stages under the one rule (``policies.actions.Stage``).

        An empty stage with nothing to wait for is done at once: no task, and the stages
        after it do not wait for it (a failover without preemptions starts its interims
        without a detour through the event loop). Their actions count as in flight
        (:meth:`in_flight`) from the call until the stages are over.
        """
        keys = [(a.server_id, a.app_id, a.variant) for stage in stages for a in stage.actions]
        self._in_flight.update(keys)
        try:
            await self._run(stages)
        finally:
            self._in_flight -= Counter(keys)  # keeps only the keys still counted

    async def _run(self, stages: tuple[Stage, ...]) -> None:
        started: dict[str, asyncio.Future[None]] = {}
        for stage in stages:
            waits = [started[name] for name in stage.after if name in started]
            if not stage.actions and not waits:
                continue
            started[stage.name] = asyncio.ensure_future(self._stage(stage, waits))
        if started:
            await asyncio.gather(*started.values())

    async def _stage(self, stage: Stage, waits: list[asyncio.Future[None]]) -> None:
        if waits:
            await asyncio.gather(*waits)
        chains: dict[str, list[Action]] = defaultdict(list)
        for action in stage.actions:
            chains[action.app_id].append(action)
        await asyncio.gather(*(self._chain(stage, actions) for actions in chains.values()))

    async def _chain(self, stage: Stage, actions: list[Action]) -> None:
        loaded: tuple[str, str] | None = None
        for action in actions:
            try:
                if isinstance(action, PromoteReplica) and \
                        loaded == (action.server_id, action.variant):
                    continue  # the load's own result already went through advance()
                done = await self.perform(action, urgent=stage.urgent)
                loaded = ((action.server_id, action.variant)
                          if isinstance(action, LoadVariant) and done else None)
            except Exception:  # noqa: BLE001 - the others go on
                logger.exception("%s (stage %s) failed", action, stage.name)

    async def perform(self, action: Action, urgent: bool = False) -> bool:
        """One action against the agents and the records; False when it did not happen."""
        if isinstance(action, LoadVariant):
            return await self.load(action.app_id, action.server_id, action.variant,
                                   urgent=urgent)
        if isinstance(action, UnloadVariant):
            await self.unload(action.app_id, action.server_id, action.variant)
        elif isinstance(action, PromoteReplica):
            return await self.advance(action.app_id)
        elif isinstance(action, RemoveStray):
            await self.remove_stray(action.server_id, action.app_id, action.variant)
        return True

    # --- actions -----------------------------------------------------------------------------

    async def load(self, app_id: str, server_id: str, variant: str,
                   urgent: bool = False) -> bool:
        """Load one desired replica; record READY (and decide what serves) or drop it.

        ``urgent`` loads end an outage: the agent runs them before its routine loads, and a
        warm re-plan waits for them.
        """
        if not urgent:
            return await self._load(app_id, server_id, variant, urgent)
        with self.urgent_work():
            return await self._load(app_id, server_id, variant, urgent)

    @contextlib.contextmanager
    def urgent_work(self) -> Iterator[None]:
        """Marks work that ends an outage for as long as the block runs (see hold_urgent)."""
        release = self.hold_urgent()
        try:
            yield
        finally:
            release()

    def hold_urgent(self) -> Callable[[], None]:
        """Mark work that ends an outage (an urgent load, a failover being decided).

        A warm re-plan waits while any is under way (``no_urgent_loads``): its solve would
        take the CPU from it, and its loads the agents' disks. Returns the release, which
        ends the mark once however often it is called.
        """
        self._urgent_loads += 1
        self.no_urgent_loads.clear()
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._urgent_loads -= 1
            if self._urgent_loads == 0:
                self.no_urgent_loads.set()

        return release

    async def _load(self, app_id: str, server_id: str, variant: str, urgent: bool) -> bool:
        started = self.clock.monotonic()
        if not urgent and not await self._still_loading(app_id, server_id, variant):
            return False
        try:
            manifest = await self.artifacts.manifest(variant)
            result = await self.agents.load(server_id, app_id, variant, urgent=urgent,
                                            manifest=manifest)
        except AgentUnavailableError as exc:
            # Left LOADING: the agent's next hello (reconcile) re-issues it.
            logger.warning("load %s/%s on %s deferred: %s", app_id, variant, server_id, exc)
            self.metrics.loads.labels("deferred").inc()
            return False
        except AgentCommandError as exc:
            logger.error("load %s/%s on %s failed: %s", app_id, variant, server_id, exc)
            self.metrics.loads.labels("failed").inc()
            await self._drop(app_id, server_id, variant, f"load failed: {exc}")
            return False
        t = result.timings
        self.metrics.loads.labels("ok").inc()
        self.metrics.load_seconds.observe(t.get("load_s", self.clock.monotonic() - started))
        logger.info("loaded %s/%s on %s%s in %.0f ms (agent: queued %.0f, materialise %.0f, "
                    "Triton load %.0f ms)", app_id, variant, server_id,
                    " (urgent)" if urgent else "", (self.clock.monotonic() - started) * 1000,
                    t.get("queued_s", 0) * 1000, t.get("materialise_s", 0) * 1000,
                    t.get("load_s", 0) * 1000)
        if not await self.advance(app_id, loaded=(server_id, variant, t.get("load_s"))):
            # No longer wanted (deleted, re-planned) while it loaded.
            await self.unload(app_id, server_id, variant, even_if_unrecorded=True)
            return False
        return True

    async def _still_loading(self, app_id: str, server_id: str, variant: str) -> bool:
        """Whether the records still want this load.

        A routine load's stage may start long after its decision: a take-back may have
        retired it meanwhile (marked UNLOADING, it is forgotten here: nothing was sent).
        Urgent loads skip the read: they leave right after their decision, on the outage's
        path, and one made stale in between is unloaded when it completes.
        """
        async with self.locks.app(app_id):
            record = await self.store.get_app(app_id)
            replica = record.replica(server_id, variant) if record else None
            if replica is not None and replica.state is ModelState.LOADING:
                return True
            logger.info("load %s/%s on %s no longer wanted; not sent", app_id, variant,
                        server_id)
            await self._forget_unloading(record, server_id, variant)
        return False

    async def _forget_unloading(self, record: AppRecord | None, server_id: str,
                                variant: str) -> None:
        """Drop the replica from the record if it is (still) UNLOADING; hold the app's lock."""
        replica = record.replica(server_id, variant) if record is not None else None
        if record is not None and replica is not None and replica.state is ModelState.UNLOADING:
            record.replicas.remove(replica)
            await self.commit(Decision(apps=(record,)))

    async def _drop(self, app_id: str, server_id: str, variant: str, reason: str) -> None:
        async with self.locks.app(app_id):
            record = await self.store.get_app(app_id)
            if record is None:
                return
            drop_replica(record, server_id, variant, reason)
            await self.commit(Decision(apps=(record,)))
        await self.advance(app_id)

    async def unload(self, app_id: str, server_id: str, variant: str,
                     even_if_unrecorded: bool = False) -> None:
        """Unload a replica the records mark UNLOADING, then forget it.

        A replica wanted again meanwhile (LOADING or READY) stays; one the records no longer
        hold was unloaded already, unless ``even_if_unrecorded`` (a load that finished after
        its app forgot it). A failed server is not asked; an unreachable one is reconciled
        when its agent says hello again.
        """
        record, servers = await self.store.app_and_servers(app_id)
        current = record.replica(server_id, variant) if record else None
        if current is None and not even_if_unrecorded:
            return
        if current is not None and current.state is not ModelState.UNLOADING:
            return
        server = servers.get(server_id)
        if server is not None and server.state is not ServerState.FAILED:
            try:
                await self.agents.unload(server_id, app_id, variant)
            except (AgentUnavailableError, AgentCommandError) as exc:
                logger.warning("unload %s/%s on %s: %s (reconcile will retry)", app_id,
                               variant, server_id, exc)
        if current is None:
            return
        async with self.locks.app(app_id):
            await self._forget_unloading(await self.store.get_app(app_id), server_id, variant)

    async def remove_stray(self, server_id: str, app_id: str, variant: str) -> None:
        """Unload a model no record wants, unless a record wants it by the time it is sent.

        Decided and sent under the planning lock: a load of the same model decided later (a
        fail-back) reaches the agent after this unload, never before it.
        """
        try:
            async with self.locks.plan:
                record = await self.store.get_app(app_id)
                replica = record.replica(server_id, variant) if record else None
                if replica is not None and replica.state in (ModelState.LOADING,
                                                             ModelState.READY):
                    return
                reply = await self.agents.start_unload(server_id, app_id, variant)
            await reply
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.warning("stray %s__%s on %s: %s", app_id, variant, server_id, exc)

    async def advance(self, app_id: str,
                      loaded: tuple[str, str, float | None] | None = None) -> bool:
        """Decide what serves the app now (``decide.serving``) and apply it.

        ``loaded``: the replica whose load just succeeded; False when it is no longer wanted.
        One read, one transaction for the record and its event.
        """
        async with self.locks.app(app_id):
            record, servers = await self.store.app_and_servers(app_id)
            if record is None:
                return False
            before = _fingerprint(record) if loaded is None else ()
            decision = decide_advance(record, servers, self.clock.time(),
                                      self.recoveries.get(app_id), loaded)
            if decision is None:
                return False
            if loaded is not None or decision.events or _fingerprint(record) != before:
                await self.commit(decision)
        if decision.stages:
            self.spawn(self.run(decision.stages), f"retiring replicas of {app_id}")
        if decision.serving_moved:
            self.on_serving_moved()
        return True

    def _announced(self, app_id: str, status: AppStatus) -> None:
        """MTTR bookkeeping once an app's placement event went out."""
        recovery = self.recoveries.get(app_id)
        if recovery is None:
            return
        if not recovery.notified:
            self.recoveries[app_id] = Recovery(recovery.detected_at, recovery.failed_server,
                                               notified=True)
            self.metrics.mttr.labels("progressive").observe(
                self.clock.time() - recovery.detected_at)
        if status is AppStatus.SERVING:
            self.recoveries.pop(app_id, None)


def _fingerprint(record: AppRecord) -> tuple[Any, ...]:
    """What the serving state machine can change in a record (to skip writing no change)."""
    return (record.status, record.serving, record.reason,
            tuple((r.key, r.role, r.state) for r in record.replicas))
