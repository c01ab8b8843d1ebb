"""The orchestrator core: decisions on snapshots, written to Redis, then executed by agents.

Every decision follows one pattern (desired state, then action): under the planning lock, build
a snapshot from the records, ask a policy, write the resulting replicas to Redis as LOADING or
UNLOADING; then, outside the lock, send the agent commands, and record each result. An app's
progress is a small state machine driven by replica readiness (:meth:`advance`): a ready
UPGRADE replica takes over from whatever serves; a ready INTERIM serves an app that has nothing
serving. Because it depends only on stored replica states, a controller restarted mid-failover
resumes by re-issuing the loads still marked LOADING (idempotent on the agent) and advancing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.agents import AgentHub
from controller.artifacts import ArtifactCatalog
from controller.errors import (
    AgentCommandError,
    AgentUnavailableError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from controller.events import EventHub
from controller.metrics import Metrics
from controller.prefetch import InterimPrefetcher
from controller.records import (
    AppRecord,
    AppSpec,
    AppStatus,
    Event,
    Replica,
    ReplicaRole,
    ReplicaState,
    RuntimeConfig,
    ServerRecord,
    ServerState,
)
from controller.snapshot import build_snapshot
from controller.store import Store
from controller.warm_plan import WarmPlanner
from policies.baselines import FullSizeWarmK
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.errors import PolicyError
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot, Family
from policies.primary import place_primaries
from policies.resources import Resources
from understudy.wire.protocol import model_name

logger = logging.getLogger(__name__)

LOADED_FOR_THE_CHANGE = frozenset({"interim_serving", "serving", "upgraded", "failback"})
"""Event kinds whose replica was loaded for that very change (their events carry its load
time); a warm switch's or take-back's replica was loaded long before."""


@dataclass
class Recovery:
    """An app recovering from a server failure."""

    detected_at: float
    failed_server: str
    notified: bool = False


class Orchestrator:
    """Apps, replicas and their life cycle."""

    def __init__(self, store: Store, events: EventHub, agents: AgentHub,
                 families: Mapping[str, Family], metrics: Metrics,
                 config: RuntimeConfig, artifacts: ArtifactCatalog | None = None) -> None:
        self.store = store
        self.artifacts = artifacts or ArtifactCatalog(None)
        self.events = events
        self.agents = agents
        self.families = families
        self.metrics = metrics
        self.config = config
        self.plan_lock = asyncio.Lock()
        self._app_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.warm = WarmPlanner(self)
        self.recoveries: dict[str, Recovery] = {}
        """Apps recovering from a failure, for the events' failure fields and MTTR."""
        self.prefetcher = InterimPrefetcher(self)

    # --- helpers ---------------------------------------------------------------------------

    def spawn(self, coroutine: Any, what: str) -> asyncio.Task[Any]:
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

    def app_lock(self, app_id: str) -> asyncio.Lock:
        """Serialises record updates of one app."""
        return self._app_locks.setdefault(app_id, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def every_app_locked(self) -> AsyncIterator[None]:
        """Holds the lock of every registered app, for decisions that rewrite many records.

        A load ending meanwhile writes its app's record under that app's lock, and the
        decision's copy written back would undo it. Taken in id order, so two holders cannot
        deadlock; nobody holding one app's lock waits for another's or for the planning lock.
        """
        async with contextlib.AsyncExitStack() as stack:
            for app_id in sorted(await self.store.app_ids()):
                await stack.enter_async_context(self.app_lock(app_id))
            yield

    def policy(self) -> UnderstudyPolicy | FullSizeWarmK:
        """The configured failover policy."""
        c = self.config
        warm = WarmPlanConfig(alpha=c.alpha, replicas=c.warm_replicas,
                              site_independent=c.site_independent, solver=c.solver,
                              time_limit_s=c.time_limit_s, mip_rel_gap=c.mip_rel_gap)
        if c.policy == "full-size-warm-k":
            return FullSizeWarmK(warm=warm)
        return UnderstudyPolicy(warm=warm,
                                progressive=ProgressiveConfig(preempt_warm=c.preempt_warm))

    async def snapshot(self, failed: tuple[str, ...] = ()) -> tuple[
            ClusterSnapshot, dict[str, AppRecord], dict[str, ServerRecord]]:
        """Current records and the snapshot built from them."""
        apps = await self.store.apps()
        servers = await self.store.servers()
        return build_snapshot(self.families, servers, apps, failed), apps, servers

    def accuracy(self, family: str, variant: str) -> float:
        """Normalised accuracy of a variant (0 when unknown)."""
        try:
            return self.families[family].variant(variant).accuracy
        except (KeyError, PolicyError):
            return 0.0

    async def notify(self, record: AppRecord, kind: str, replica: Replica | None,
                     reason: str = "", servers: Mapping[str, ServerRecord] | None = None
                     ) -> Event:
        """Publish a placement event for an app (endpoint from the server record)."""
        if replica is not None and servers is None:
            servers = await self.store.servers()
        event = self.event_for(record, kind, replica, reason, servers or {})
        self.metrics.events.labels(kind).inc()
        return await self.events.publish(event)

    def event_for(self, record: AppRecord, kind: str, replica: Replica | None, reason: str,
                  servers: Mapping[str, ServerRecord]) -> Event:
        """The placement event of an app, not yet published (no sequence number)."""
        endpoint = None
        if replica is not None:
            server = servers.get(replica.server_id)
            if server is not None and server.http:
                endpoint = {"http": server.http, "grpc": server.grpc or ""}
        recovery = self.recoveries.get(record.app_id)
        return Event(
            app_id=record.app_id, kind=kind,
            server_id=replica.server_id if replica else None, endpoint=endpoint,
            model_name=model_name(record.app_id, replica.variant) if replica else None,
            variant=replica.variant if replica else None,
            role=replica.role.value if replica else None,
            accuracy=replica.accuracy if replica else None, reason=reason,
            failed_server=recovery.failed_server if recovery else None,
            failure_at=recovery.detected_at if recovery else None,
            load_s=replica.load_s if replica and kind in LOADED_FOR_THE_CHANGE else None)

    # --- apps ------------------------------------------------------------------------------

    def validate_spec(self, spec: AppSpec, servers: Mapping[str, ServerRecord]) -> None:
        """Reject what no snapshot could accept, with a message naming the problem."""
        family = self.families.get(spec.family)
        if family is None:
            raise InvalidRequestError(f"unknown family {spec.family!r}; known: "
                                      f"{', '.join(sorted(self.families))}")
        if spec.variant is not None and spec.variant not in {v.name for v in family.variants}:
            raise InvalidRequestError(f"family {spec.family!r} has no variant {spec.variant!r}")
        if spec.pinned_server is not None and spec.pinned_server not in servers:
            raise InvalidRequestError(f"pinned server {spec.pinned_server!r} is unknown")
        sites = {s.site_id for s in servers.values()}
        if spec.pinned_site is not None and spec.pinned_site not in sites:
            raise InvalidRequestError(f"pinned site {spec.pinned_site!r} is unknown")
        variant = family.variant(spec.variant) if spec.variant else family.most_accurate
        demand = variant.demand(spec.max_rate_rps)
        if servers and not any(demand.fits_within(Resources(s.capacity))
                               for s in servers.values()):
            raise InvalidRequestError(
                f"{variant.name} at {spec.max_rate_rps:g} req/s needs {demand}, more than any "
                f"server's whole capacity; lower max_rate_rps or choose a smaller variant")

    async def register(self, spec: AppSpec, wait: bool = False) -> AppRecord:
        """Register an app: record it, place its primary, load it; then plan warm backups."""
        servers = await self.store.servers()
        self.validate_spec(spec, servers)
        record = AppRecord(spec=spec)
        if not await self.store.add_app(record):
            raise ConflictError(f"app {spec.app_id!r} is already registered")
        self.prefetcher.request()  # its family's interim, on every server, before any failure
        placed = await self.place(spec.app_id)
        if placed is not None and wait:
            await placed
        elif placed is not None:
            self.spawn(placed, f"placing {spec.app_id}")
        return await self.get(spec.app_id)

    async def place(self, app_id: str) -> Any:
        """Choose the primary's server (worst-fit or pinned); returns the load to run, if any."""
        async with self.plan_lock, self.app_lock(app_id):
            snapshot, apps, _ = await self.snapshot()
            record = apps.get(app_id)
            if record is None or record.serving is not None or any(
                    r.state in (ReplicaState.LOADING, ReplicaState.READY)
                    for r in record.replicas):
                return None
            try:
                result = place_primaries(snapshot, [app_id], largest_first=False)
            except PolicyError as exc:
                result = None
                reason = str(exc)
            if result is None or not result.placements:
                why = result.unplaced[0].reason if result and result.unplaced else reason
                if record.status is not AppStatus.UNAVAILABLE or record.reason != why:
                    record.status, record.reason = AppStatus.UNAVAILABLE, why
                    await self.store.put_app(record)
                    await self.notify(record, "unplaced", None, why)
                return None
            placement = result.placements[0]
            replica = Replica(server_id=placement.server_id, variant=placement.variant,
                              role=ReplicaRole.PRIMARY,
                              accuracy=self.accuracy(record.spec.family, placement.variant))
            # An app that served before (or found no room) is in an outage; a new one is not.
            urgent = record.home is not None or record.status is AppStatus.UNAVAILABLE
            record.replicas.append(replica)
            record.home = replica.key
            record.status = AppStatus.PENDING
            record.reason = ""
            await self.store.put_app(record)
        logger.info("app %s: primary %s on %s", app_id, replica.variant, replica.server_id)
        return self.load_replica(app_id, replica.server_id, replica.variant, urgent=urgent)

    async def get(self, app_id: str) -> AppRecord:
        """One app record; NotFoundError when unknown."""
        record = await self.store.get_app(app_id)
        if record is None:
            raise NotFoundError(f"app {app_id!r} is not registered")
        return record

    async def delete(self, app_id: str) -> None:
        """Unload every replica of the app and forget it."""
        record = await self.get(app_id)
        async with self.app_lock(app_id):
            for replica in record.replicas:
                replica.state = ReplicaState.UNLOADING
            await self.store.put_app(record)
        await asyncio.gather(*(self.unload_replica(app_id, r.server_id, r.variant, forget=True)
                               for r in record.replicas))
        await self.store.delete_app(app_id)
        self.recoveries.pop(app_id, None)
        await self.notify(record, "deleted", None, "deleted by request")
        self.request_warm_replan()

    # --- replicas ----------------------------------------------------------------------------

    async def load_replica(self, app_id: str, server_id: str, variant: str,
                           urgent: bool = False) -> bool:
        """Load one desired replica; record READY (then advance) or drop it on a final error.

        ``urgent`` loads end an outage (nothing of the app serves): the agent runs them before
        its routine loads.
        """
        if not urgent:
            return await self._load_replica(app_id, server_id, variant, urgent)
        with self.warm.urgent_load():  # a requested warm re-plan waits for it
            return await self._load_replica(app_id, server_id, variant, urgent)

    async def _load_replica(self, app_id: str, server_id: str, variant: str,
                            urgent: bool) -> bool:
        started = time.perf_counter()
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
            await self._drop_replica(app_id, server_id, variant, f"load failed: {exc}")
            return False
        self.metrics.loads.labels("ok").inc()
        self.metrics.load_seconds.observe(result.timings.get("load_s",
                                                             time.perf_counter() - started))
        t = result.timings
        logger.info("loaded %s/%s on %s%s in %.0f ms (agent: queued %.0f, materialise %.0f, "
                    "Triton load %.0f ms)", app_id, variant, server_id,
                    " (urgent)" if urgent else "", (time.perf_counter() - started) * 1000,
                    t.get("queued_s", 0) * 1000, t.get("materialise_s", 0) * 1000,
                    t.get("load_s", 0) * 1000)
        if not await self.advance(app_id, loaded=(server_id, variant, t.get("load_s"))):
            # No longer wanted (deleted, re-planned) while it loaded.
            await self.unload_replica(app_id, server_id, variant, forget=True)
            return False
        return True

    async def _drop_replica(self, app_id: str, server_id: str, variant: str,
                            reason: str) -> None:
        async with self.app_lock(app_id):
            record = await self.store.get_app(app_id)
            if record is None:
                return
            record.replicas = [r for r in record.replicas if r.key != (server_id, variant)]
            if record.serving == (server_id, variant):
                record.serving = None
            record.reason = reason
            await self.store.put_app(record)
        await self.advance(app_id)

    async def unload_replica(self, app_id: str, server_id: str, variant: str,
                             forget: bool = True) -> None:
        """Unload one replica (best effort on an unreachable server) and drop it."""
        servers = await self.store.servers()
        server = servers.get(server_id)
        record = await self.store.get_app(app_id)
        current = record.replica(server_id, variant) if record else None
        if current is not None and current.state is not ReplicaState.UNLOADING:
            return  # wanted again (re-planned) before the unload went out
        if server is not None and server.state is not ServerState.FAILED:
            try:
                await self.agents.unload(server_id, app_id, variant)
            except (AgentUnavailableError, AgentCommandError) as exc:
                logger.warning("unload %s/%s on %s: %s (reconcile will retry)", app_id,
                               variant, server_id, exc)
                if not forget:
                    return
        async with self.app_lock(app_id):
            record = await self.store.get_app(app_id)
            if record is None:
                return
            replica = record.replica(server_id, variant)
            if replica is not None and replica.state is ReplicaState.UNLOADING:
                record.replicas.remove(replica)
                await self.store.put_app(record)

    async def advance(self, app_id: str,
                      loaded: tuple[str, str, float | None] | None = None) -> bool:
        """Move an app forward from its replicas' states (see the module docstring).

        ``loaded`` = (server, variant, load seconds) of a replica whose load just succeeded: it
        is marked READY in the same step, and False comes back if the record no longer wants
        it (deleted or re-planned while it loaded). The record and its event are written in
        one transaction after one read: this is the path from an interim's load to its
        clients, and each Redis round trip on it costs ~1 ms on a busy server.
        """
        async with self.app_lock(app_id):
            record, servers = await self.store.app_and_servers(app_id)
            if record is None:
                return False
            if loaded is not None:
                replica = record.replica(loaded[0], loaded[1])
                if replica is None or replica.state is not ReplicaState.LOADING:
                    return False
                replica.state, replica.since, replica.load_s = (ReplicaState.READY,
                                                                 time.time(), loaded[2])
            live = {s for s, r in servers.items() if r.state is not ServerState.FAILED}
            kind, current, retired = self._next_serving(record, live)
            for old in retired:
                old.state = ReplicaState.UNLOADING
            record.status = self._status(record, current)
            if record.status is AppStatus.SERVING:
                record.reason = ""
            events = [self.event_for(record, kind, current, "", servers)] if kind else []
            _, stored = await self.store.commit(apps=[record], events=events)
            self.events.deliver(stored)
        if kind:
            self._announced(record, kind)
            # Serving moved (new app, upgrade, fail-back): backups planned against the old
            # primary may now share its server or site, and freed memory may cover others.
            self.request_warm_replan()
        for old in retired:
            self.spawn(self.unload_replica(app_id, old.server_id, old.variant),
                       f"unloading {app_id}/{old.variant}")
        return True

    @staticmethod
    def _next_serving(record: AppRecord, live: set[str]
                      ) -> tuple[str, Replica | None, list[Replica]]:
        """Switch ``record`` to its best ready replica (in place).

        Returns the event kind ("" when serving does not move), the replica now serving and
        the replicas to retire.
        """
        ready = [r for r in record.replicas
                 if r.state is ReplicaState.READY and r.server_id in live]
        current = record.serving_replica()
        if current is not None and (current.server_id not in live
                                    or current.state is not ReplicaState.READY):
            current = None
        upgrade = next((r for r in ready if r.role in (ReplicaRole.UPGRADE, ReplicaRole.PRIMARY)
                        and r.key != (current.key if current else None)), None)
        interim = next((r for r in ready if r.role is ReplicaRole.INTERIM), None)
        retired: list[Replica] = []
        kind = ""
        if upgrade is not None and (current is None or current.role is not ReplicaRole.PRIMARY
                                    or upgrade.role is ReplicaRole.UPGRADE):
            if current is not None and current.role is not ReplicaRole.WARM:
                retired.append(current)
            if interim is not None and interim is not current:
                retired.append(interim)
            kind = "failback" if upgrade.key == record.home and current else (
                "upgraded" if current is not None else "serving")
            upgrade.role = ReplicaRole.PRIMARY
            record.serving, current = upgrade.key, upgrade
        elif current is None and interim is not None:
            record.serving, current = interim.key, interim
            kind = "interim_serving"
        return kind, current, retired

    def _status(self, record: AppRecord, serving: Replica | None) -> AppStatus:
        if serving is None:
            loading = any(r.state is ReplicaState.LOADING for r in record.replicas)
            return AppStatus.RECOVERING if loading else AppStatus.UNAVAILABLE
        if record.home is not None and serving.variant != record.home[1]:
            return AppStatus.DEGRADED
        if serving.role is ReplicaRole.INTERIM:
            return AppStatus.DEGRADED
        return AppStatus.SERVING

    def _announced(self, record: AppRecord, kind: str) -> None:
        """Metrics and recovery bookkeeping once an app's placement event went out."""
        self.metrics.events.labels(kind).inc()
        recovery = self.recoveries.get(record.app_id)
        if recovery is None:
            return
        if not recovery.notified:
            recovery.notified = True
            self.metrics.mttr.labels("progressive").observe(time.time() - recovery.detected_at)
        if record.status is AppStatus.SERVING:
            self.recoveries.pop(record.app_id, None)

    # --- anti-entropy ----------------------------------------------------------------------

    async def converge_forever(self, interval_s: float = 1.0) -> None:
        """Periodically place apps left with nothing serving and nothing loading.

        Event-driven paths handle the normal cases; this catches the rest (an app whose
        loading primary was on a server that failed, capacity freed by a deletion, an app
        that found no room when it registered), so the cluster always converges.
        """
        while True:
            await asyncio.sleep(interval_s)
            try:
                apps = await self.store.apps()
                for record in apps.values():
                    if record.serving is None and not any(
                            r.state in (ReplicaState.LOADING, ReplicaState.READY)
                            for r in record.replicas):
                        placed = await self.place(record.app_id)
                        if placed is not None:
                            self.spawn(placed, f"placing {record.app_id}")
            except Exception:  # noqa: BLE001 - keep the loop alive (Redis restarting ...)
                logger.exception("convergence pass failed")

    # --- warm backups ------------------------------------------------------------------------

    def request_warm_replan(self) -> None:
        """Re-plan warm backups soon (``controller.warm_plan``)."""
        self.warm.request()

    async def replan_warm(self) -> dict[str, Any]:
        """Solve the warm-backup plan now and converge the warm replicas to it."""
        return await self.warm.replan()
