"""Server life cycle: failure (the two-step failover), return (reconcile, fail-back), drain.

On a failure the order is what FailLite §3 prescribes and what clients feel: first every app
with a live warm backup is switched and notified (no agent command needed: the backup is
loaded), then the progressive recoveries start (interim, then target; :meth:`advance` does the
switching), then warm backups are re-planned for what was consumed or lost.
"""

from __future__ import annotations

import asyncio
import logging
import time

from controller.errors import (
    AgentCommandError,
    AgentUnavailableError,
    ConflictError,
    NotFoundError,
)
from controller.orchestrator import Orchestrator, Recovery
from controller.records import (
    AppRecord,
    AppStatus,
    Event,
    Replica,
    ReplicaRole,
    ReplicaState,
    ServerRecord,
    ServerState,
)
from controller.snapshot import build_snapshot
from controller.takeback import take_back
from policies.actions import FailoverPlan, WarmSwitch
from policies.failover import split_affected
from understudy.protocol import Hello, InventoryItem, TritonUp, UnloadCommand

logger = logging.getLogger(__name__)

FIRST_HEARTBEAT_GRACE_S = 1.0


class ServerLifecycle:
    """Failure, return and drain of servers, on top of the orchestrator."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator
        self._failing: set[str] = set()
        """Servers whose failover task is running."""

    # --- failure ---------------------------------------------------------------------------

    def on_failure(self, server_id: str, reason: str, detected_at: float,
                   last_seen: float) -> None:
        """Detector callback (synchronous, on the loop): start the failover task."""
        self.o.metrics.detection.observe(max(0.0, detected_at - last_seen))
        self.o.metrics.server_failures.labels(reason).inc()
        logger.error("server %s declared failed (%s, %.1f ms after its last sign of life)",
                     server_id, reason, (detected_at - last_seen) * 1000)
        self.o.spawn(self.fail_server(server_id, reason, detected_at), f"failover of {server_id}")

    async def fail_server(self, server_id: str, reason: str, detected_at: float) -> None:
        """Mark the server failed and recover every app that served or was backed up there."""
        self._failing.add(server_id)
        try:
            await self._fail_server(server_id, reason, detected_at)
        finally:
            self._failing.discard(server_id)

    async def resume_failover(self, server_id: str) -> None:
        """Run a failover again for a failed server whose apps were not all moved.

        The controller died in the middle: every step is decided from the records again.
        """
        o = self.o
        async with o.plan_lock:
            servers = await o.store.servers()
            record = servers.get(server_id)
            if record is None or record.state is not ServerState.FAILED:
                return
            detected_at = record.failed_at or time.time()
            record.state = ServerState.UP  # fail_server re-marks it, with its plan
            await o.store.put_server(record)
        logger.warning("resuming the failover of %s", server_id)
        await self.fail_server(server_id, "failover resumed", detected_at)

    async def _fail_server(self, server_id: str, reason: str, detected_at: float) -> None:
        o = self.o
        async with o.plan_lock:
            locked_at = time.time()
            apps, servers = await o.store.apps_and_servers()
            server = servers.get(server_id)
            if server is None or server.state is ServerState.FAILED:
                return
            if o.agents.detector.watching(server_id):
                # Heard from again while this task waited for the lock: not failed after all.
                logger.warning("server %s is alive again; failover cancelled", server_id)
                o.agents.detector.false_alarm(server_id)
                return
            server.state, server.failed_at, server.failure_reason = (
                ServerState.FAILED, detected_at, reason)
            server.connected = o.agents.connected(server_id)
            snapshot = build_snapshot(o.families, servers, apps)
            # Warm switches first: decided in memory, then the failed server, the intent, the
            # switched apps and their events are written in one transaction and pushed to the
            # clients, before the cold part is even planned.
            warm = split_affected(snapshot, [server_id]).warm_switches
            switched, events = self._switch_to_warm(warm, apps, servers, server_id, detected_at)
            intent, stored = await o.store.commit(
                servers=[server], apps=[apps[a] for a in switched], events=events,
                intent={"kind": "failover", "server_id": server_id, "reason": reason})
            o.events.deliver(stored)
            logger.info("failover of %s: %d warm switches announced %.1f ms after detection "
                        "(%.1f ms waiting for the planning lock)", server_id, len(switched),
                        (time.time() - detected_at) * 1000, (locked_at - detected_at) * 1000)
            for _ in switched:
                o.metrics.events.labels("warm_switch").inc()
                o.metrics.failovers.labels("warm").inc()
                o.metrics.mttr.labels("warm").observe(time.time() - detected_at)
            # In a thread: Algorithm 1 (and the preemption search) must not hold up the event
            # loop, where late heartbeats of the other servers would become false alarms.
            plan = await asyncio.to_thread(o.policy().plan_failover, snapshot, [server_id])
            # The cold part, also decided in memory and written at once (the interim loads
            # wait for it): preempted backups, interim and target replicas, lost apps.
            preempted = self._preempt(plan, apps)
            recoveries = self._start_recoveries(plan, apps, server_id, detected_at)
            lost = self._mark_unrecoverable(plan, apps, server_id, detected_at)
            changed = ({a for a, _, _ in preempted} | {a for a, _, _, _ in recoveries}
                       | {e.app_id for e in lost} | self._forget_replicas_on(server_id, apps))
            _, stored = await o.store.commit(apps=[apps[a] for a in sorted(changed)],
                                             events=lost)
            o.events.deliver(stored)
        logger.info("failover of %s: %d warm switches, %d progressive, %d unrecoverable, "
                    "%d warm backups preempted (%s)", server_id, len(switched), len(recoveries),
                    len(plan.unrecoverable), len(preempted), "; ".join(plan.notes))
        for app_id, backup_server, variant in preempted:
            o.spawn(o.unload_replica(app_id, backup_server, variant),
                    f"preempt backup {app_id}/{variant}")
        # Interims first (they end the outage), then the targets (they restore accuracy).
        await asyncio.gather(*(o.load_replica(a, s, v, urgent=True)
                               for a, s, v, first in recoveries if first))
        await asyncio.gather(*(o.load_replica(a, s, v) for a, s, v, first in recoveries
                               if not first))
        for app_id in switched:
            o.spawn(o.advance(app_id), f"advance {app_id}")
        await o.replan_warm()
        await o.store.done_intent(intent)

    def _switch_to_warm(self, switches: tuple[WarmSwitch, ...], apps: dict[str, AppRecord],
                        servers: dict[str, ServerRecord], server_id: str, detected_at: float
                        ) -> tuple[list[str], list[Event]]:
        """Promote the warm backups in the records (in memory); returns the apps and events."""
        o = self.o
        switched, events = [], []
        for switch in switches:
            record = apps[switch.app_id]
            replica = record.replica(switch.server_id, switch.variant)
            if replica is None:
                continue
            replica.role = ReplicaRole.PRIMARY
            record.serving = replica.key
            record.status = (AppStatus.SERVING if record.home and replica.variant ==
                             record.home[1] else AppStatus.DEGRADED)
            o.recoveries[record.app_id] = Recovery(detected_at, server_id, notified=True)
            events.append(o.event_for(record, "warm_switch", replica,
                                      f"server {server_id} failed", servers))
            switched.append(record.app_id)
        return switched, events

    def _preempt(self, plan: FailoverPlan, apps: dict[str, AppRecord]
                 ) -> list[tuple[str, str, str]]:
        """Mark the warm backups the plan preempts as unloading (in memory)."""
        preempted = []
        for placement in plan.preempted:
            record = apps.get(placement.app_id)
            replica = record.replica(placement.server_id, placement.variant) if record else None
            if record is None or replica is None or replica.role is not ReplicaRole.WARM:
                continue
            replica.state = ReplicaState.UNLOADING
            preempted.append((record.app_id, replica.server_id, replica.variant))
            logger.warning("preempting the warm backup of %s on %s (%s) so that more apps "
                           "recover", record.app_id, replica.server_id, replica.variant)
        return preempted

    def _start_recoveries(self, plan: FailoverPlan, apps: dict[str, AppRecord],
                          server_id: str, detected_at: float
                          ) -> list[tuple[str, str, str, bool]]:
        """Add the interim and target replicas to the records (in memory); returns the loads."""
        o = self.o
        loads = []
        for recovery in plan.recoveries:
            record = apps[recovery.app_id]
            record.serving = None
            record.status = AppStatus.RECOVERING
            family = record.spec.family
            interim = Replica(server_id=recovery.server_id, variant=recovery.interim_variant,
                              role=ReplicaRole.INTERIM,
                              accuracy=o.accuracy(family, recovery.interim_variant))
            record.replicas.append(interim)
            loads.append((record.app_id, interim.server_id, interim.variant, True))
            if recovery.target_variant != recovery.interim_variant:
                target = Replica(server_id=recovery.server_id, variant=recovery.target_variant,
                                 role=ReplicaRole.UPGRADE,
                                 accuracy=o.accuracy(family, recovery.target_variant))
                record.replicas.append(target)
                loads.append((record.app_id, target.server_id, target.variant, False))
            else:
                interim.role = ReplicaRole.UPGRADE  # one load that serves as the final target
            o.recoveries[record.app_id] = Recovery(detected_at, server_id)
            o.metrics.failovers.labels("progressive").inc()
        return loads

    def _mark_unrecoverable(self, plan: FailoverPlan, apps: dict[str, AppRecord],
                            server_id: str, detected_at: float) -> list[Event]:
        """Mark the apps the plan cannot recover (in memory); returns their events."""
        o = self.o
        events = []
        for lost in plan.unrecoverable:
            record = apps[lost.app_id]
            record.serving = None
            record.status = AppStatus.UNAVAILABLE
            record.reason = lost.reason
            o.recoveries[record.app_id] = Recovery(detected_at, server_id)
            events.append(o.event_for(record, "unrecoverable", None, lost.reason, {}))
            o.metrics.events.labels("unrecoverable").inc()
            o.metrics.failovers.labels("unrecoverable").inc()
        return events

    @staticmethod
    def _forget_replicas_on(server_id: str, apps: dict[str, AppRecord]) -> set[str]:
        """Drop the replicas a failed server held (their home is kept for fail-back).

        In memory; returns the apps that changed.
        """
        changed = set()
        for record in apps.values():
            before = len(record.replicas)
            record.replicas = [r for r in record.replicas if r.server_id != server_id]
            if record.serving and record.serving[0] == server_id:
                record.serving = None
            if len(record.replicas) != before:
                changed.add(record.app_id)
        return changed

    # --- return ------------------------------------------------------------------------------

    async def on_hello(self, hello: Hello) -> None:
        """An agent connected: register or update its server, reconcile, fail back."""
        o = self.o
        servers = await o.store.servers()
        record = servers.get(hello.server_id)
        was_failed = record is not None and record.state is ServerState.FAILED
        state = record.state if record is not None and not was_failed else ServerState.UP
        if record is not None and record.state is ServerState.DRAINED:
            state = ServerState.DRAINED
        endpoints = hello.endpoints
        updated = ServerRecord(
            server_id=hello.server_id, site_id=hello.site_id, capacity=hello.capacity,
            server_type=hello.server_type, http=endpoints.http if endpoints else None,
            grpc=endpoints.grpc if endpoints else None, state=state, connected=True,
            boot_id=hello.boot_id)
        await o.store.put_server(updated)
        if state is ServerState.UP:
            # The first heartbeat follows the hello; give it a generous first deadline.
            o.agents.detector.watch(hello.server_id, grace_s=max(
                FIRST_HEARTBEAT_GRACE_S, o.agents.detector.timeout_s))
        logger.info("server %s (%s) %s with %d models", hello.server_id, hello.site_id,
                    "returned" if was_failed else "connected", len(hello.inventory))
        if was_failed:
            o.spawn(self._return(hello.server_id, hello.inventory),
                    f"return of {hello.server_id}")
            return
        o.spawn(self.reconcile_server(hello.server_id, hello.inventory),
                f"reconcile {hello.server_id}")
        if record is None:
            o.spawn(self._after_join(hello.server_id, False), f"join {hello.server_id}")

    async def _return(self, server_id: str, inventory: list[InventoryItem]) -> None:
        """A server declared failed is back: take back what it still holds, then converge."""
        await self._take_back(server_id, inventory)
        await self.reconcile_server(server_id, inventory)
        await self._after_join(server_id, True)

    async def _take_back(self, server_id: str, inventory: list[InventoryItem]) -> None:
        """Switch apps back to models a returned server still holds (controller.takeback)."""
        o = self.o
        async with o.plan_lock:
            apps = await o.store.apps()
            result = take_back(server_id, inventory, apps, o.accuracy)
            changed = sorted({a for a, _ in result.adopted + result.backups})
            if changed:
                await o.store.commit(apps=[apps[a] for a in changed])
        if not changed:
            return
        logger.warning("server %s returned holding models: %d serve again without a load (%s), "
                       "%d kept as warm backups", server_id, len(result.adopted),
                       ", ".join(f"{a}/{v}" for a, v in result.adopted), len(result.backups))
        for app_id, replica_server, variant in result.retired:
            o.spawn(o.unload_replica(app_id, replica_server, variant),
                    f"retiring {app_id}/{variant} after a take-back")
        for app_id, _ in result.adopted:
            o.metrics.events.labels("take_back").inc()
            await o.advance(app_id)

    async def _after_join(self, server_id: str, failed_before: bool) -> None:
        o = self.o
        apps = await o.store.apps()
        for record in apps.values():
            if record.serving is None and not any(
                    r.state in (ReplicaState.LOADING, ReplicaState.READY)
                    for r in record.replicas):
                placed = await o.place(record.app_id)  # apps that found no room before
                if placed is not None:
                    o.spawn(placed, f"placing {record.app_id}")
        if failed_before and o.config.failback:
            for record in apps.values():
                if record.home and record.home[0] == server_id and record.serving != record.home:
                    await self._fail_back(record.app_id)
        o.request_warm_replan()

    async def _fail_back(self, app_id: str) -> None:
        """Load the app's home primary again; :meth:`advance` switches to it when ready."""
        o = self.o
        async with o.plan_lock:
            snapshot, apps, _ = await o.snapshot()
            record = apps.get(app_id)
            if record is None or record.home is None:
                return
            server_id, variant = record.home
            app = snapshot.app_by_id.get(app_id)
            if app is None or server_id not in snapshot.free or \
                    record.replica(server_id, variant) is not None:
                return
            demand = snapshot.families[app.family].variant(variant).demand(app.max_rate_rps)
            free = snapshot.free[server_id]
            evict: list[tuple[str, Replica]] = []
            # A primary outranks warm backups: reclaim backups on the home server if needed;
            # the re-plan that follows puts them elsewhere.
            for other in apps.values():
                for replica in other.replicas:
                    if demand.fits_within(free):
                        break
                    if replica.server_id == server_id and replica.role is ReplicaRole.WARM \
                            and replica.state is ReplicaState.READY:
                        spec = snapshot.app_by_id.get(other.app_id)
                        if spec is None:
                            continue
                        free = free + snapshot.families[spec.family].variant(
                            replica.variant).demand(spec.max_rate_rps)
                        evict.append((other.app_id, replica))
            if not demand.fits_within(free):
                return
            for other_id, replica in evict:
                replica.state = ReplicaState.UNLOADING
                await o.store.put_app(apps[other_id])
            record.replicas.append(Replica(server_id=server_id, variant=variant,
                                           role=ReplicaRole.UPGRADE,
                                           accuracy=o.accuracy(app.family, variant)))
            await o.store.put_app(record)
        for other_id, replica in evict:
            o.spawn(o.unload_replica(other_id, replica.server_id, replica.variant),
                    f"reclaiming {other_id}/{replica.variant} for a fail-back")
        o.spawn(o.load_replica(app_id, server_id, variant), f"fail-back of {app_id}")

    async def reconcile_server(self, server_id: str, inventory: list[InventoryItem]) -> None:
        """Converge one agent to the records: re-issue loads/unloads, remove strays."""
        o = self.o
        loaded = {(i.app_id, i.variant) for i in inventory}
        apps = await o.store.apps()
        wanted: set[tuple[str, str]] = set()
        for record in apps.values():
            for replica in record.replicas:
                if replica.server_id != server_id:
                    continue
                key = (record.app_id, replica.variant)
                if replica.state is ReplicaState.UNLOADING:
                    o.spawn(o.unload_replica(record.app_id, server_id, replica.variant),
                            f"unload {key}")
                    continue
                wanted.add(key)
                if replica.state is ReplicaState.LOADING or key not in loaded:
                    await self._reload(record, replica)
        for app_id, variant in loaded - wanted:
            logger.info("server %s holds stray model %s__%s; unloading it", server_id, app_id,
                        variant)
            o.spawn(self._unload_stray(server_id, app_id, variant), "unload stray")

    async def _reload(self, record: AppRecord, replica: Replica) -> None:
        o = self.o
        async with o.app_lock(record.app_id):
            current = await o.store.get_app(record.app_id)
            found = current.replica(replica.server_id, replica.variant) if current else None
            if current is None or found is None:
                return
            found.state = ReplicaState.LOADING
            await o.store.put_app(current)
            # Nothing else serves the app (or this replica was what served): an outage.
            urgent = current.serving is None or current.serving == found.key
        o.spawn(o.load_replica(record.app_id, replica.server_id, replica.variant, urgent=urgent),
                f"reload {record.app_id}/{replica.variant}")

    async def _unload_stray(self, server_id: str, app_id: str, variant: str) -> None:
        o = self.o
        try:
            # Decided and sent under the planning lock: a load of the same model decided
            # later (a fail-back) reaches the agent after this unload, never before it.
            async with o.plan_lock:
                record = await o.store.get_app(app_id)
                replica = record.replica(server_id, variant) if record else None
                if replica is not None and replica.state in (ReplicaState.LOADING,
                                                             ReplicaState.READY):
                    return  # wanted again meanwhile
                command = UnloadCommand(command_id=o.agents.next_id(), app_id=app_id,
                                        variant=variant)
                sent = await o.agents.send(server_id, command)
            await o.agents.command(server_id, command, sent=sent)
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.warning("stray %s__%s on %s: %s", app_id, variant, server_id, exc)

    async def revive(self, server_id: str) -> None:
        """A server declared failed is heard from again on its open connection."""
        o = self.o
        async with o.plan_lock:  # after a failover of this server that is still running
            servers = await o.store.servers()
            record = servers.get(server_id)
            if record is None or record.state is not ServerState.FAILED:
                return
            record.state = ServerState.UP
            await o.store.put_server(record)
        o.agents.detector.false_alarm(server_id)
        logger.warning("server %s declared failed earlier is alive; taking it back", server_id)
        try:
            inventory = await o.agents.inventory(server_id)
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.warning("inventory of revived %s: %s", server_id, exc)
            inventory = []
        await self._return(server_id, inventory)

    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Safety net: take back failed servers whose agent is connected and heartbeating.

        Whatever order the events came in, a server the detector watches is alive.
        """
        while True:
            await asyncio.sleep(interval_s)
            try:
                servers = await self.o.store.servers()
                for server in servers.values():
                    if server.state is ServerState.FAILED and \
                            self.o.agents.connected(server.server_id) and \
                            self.o.agents.detector.watching(server.server_id):
                        await self.revive(server.server_id)
                await self._resume_stuck_failovers(servers)
                if self.o.config.failback:
                    await self._retry_failbacks(servers)
            except Exception:  # noqa: BLE001 - keep watching
                logger.exception("server watchdog pass failed")

    async def _resume_stuck_failovers(self, servers: dict[str, ServerRecord]) -> None:
        """A failed server that still serves some app, with no failover running: redo it."""
        failed = {s for s, r in servers.items() if r.state is ServerState.FAILED
                  and s not in self._failing}
        if not failed:
            return
        stuck = {r.serving[0] for r in (await self.o.store.apps()).values()
                 if r.serving and r.serving[0] in failed}
        for server_id in sorted(stuck):
            self.o.spawn(self.resume_failover(server_id), f"resumed failover of {server_id}")

    async def _retry_failbacks(self, servers: dict[str, ServerRecord]) -> None:
        """Apps away from (or smaller than) their home, home server up, nothing in flight."""
        for record in (await self.o.store.apps()).values():
            home = record.home
            if home is None or record.serving == home or record.serving is None:
                continue
            server = servers.get(home[0])
            if server is None or server.state is not ServerState.UP or not server.connected:
                continue
            if any(r.state is not ReplicaState.READY for r in record.replicas):
                continue
            await self._fail_back(record.app_id)

    async def on_triton_up(self, server_id: str, message: TritonUp) -> None:
        """The agent restarted its Triton: treat it as the server's return."""
        o = self.o
        servers = await o.store.servers()
        record = servers.get(server_id)
        if record is None:
            return
        endpoints = message.endpoints
        if (record.http, record.grpc) != (endpoints.http, endpoints.grpc):
            # Restarted on new ports (the old ones were taken): clients must go there.
            record.http, record.grpc = endpoints.http, endpoints.grpc
            await o.store.put_server(record)
        if record.state is ServerState.FAILED:
            record.state = ServerState.UP
            await o.store.put_server(record)
            o.agents.detector.watch(server_id)
            o.spawn(self._after_join(server_id, True), f"return of {server_id}")

    async def startup_reconcile(self, grace_s: float) -> None:
        """After a controller (re)start: every known UP server must say hello within grace."""
        for server in (await self.o.store.servers()).values():
            if server.state in (ServerState.UP, ServerState.DRAINING) and \
                    not self.o.agents.connected(server.server_id):
                self.o.agents.detector.watch(server.server_id, grace_s=grace_s)
        for intent_id, intent in (await self.o.store.intents()).items():
            logger.info("resuming after restart: unfinished %s (%s)", intent.get("kind"),
                        intent)
            if intent.get("kind") == "failover" and intent.get("server_id"):
                self.o.spawn(self.resume_failover(intent["server_id"]),
                             f"resumed failover of {intent['server_id']}")
            await self.o.store.done_intent(intent_id)

    # --- drain -------------------------------------------------------------------------------

    async def drain(self, server_id: str) -> ServerRecord:
        """Move every app off a server without interrupting it, then mark it drained."""
        o = self.o
        servers = await o.store.servers()
        record = servers.get(server_id)
        if record is None:
            raise NotFoundError(f"server {server_id!r} is unknown")
        if record.state is not ServerState.UP:
            raise ConflictError(f"server {server_id!r} is {record.state.value}, not up")
        record.state = ServerState.DRAINING
        await o.store.put_server(record)
        o.spawn(self._drain(server_id), f"drain of {server_id}")
        return record

    async def _drain(self, server_id: str) -> None:
        o = self.o
        async with o.plan_lock:
            snapshot, apps, _ = await o.snapshot()
            plan = await asyncio.to_thread(o.policy().plan_failover, snapshot, [server_id])
            loads = []
            for recovery in plan.recoveries:
                record = apps[recovery.app_id]
                record.replicas.append(Replica(
                    server_id=recovery.server_id, variant=recovery.target_variant,
                    role=ReplicaRole.UPGRADE,
                    accuracy=o.accuracy(record.spec.family, recovery.target_variant)))
                record.home = (recovery.server_id, recovery.target_variant)
                await o.store.put_app(record)
                loads.append((record.app_id, recovery.server_id, recovery.target_variant))
            for switch in plan.warm_switches:
                record = apps[switch.app_id]
                replica = record.replica(switch.server_id, switch.variant)
                if replica is not None:
                    replica.role = ReplicaRole.UPGRADE  # advance() makes it serve at once
                    record.home = replica.key
                    await o.store.put_app(record)
        await asyncio.gather(*(o.load_replica(a, s, v) for a, s, v in loads))
        for switch in plan.warm_switches:
            await o.advance(switch.app_id)
        # Whatever is left on the server (backups, apps that found no room) goes now.
        for record in (await o.store.apps()).values():
            for replica in list(record.replicas):
                if replica.server_id == server_id:
                    async with o.app_lock(record.app_id):
                        fresh = await o.store.get_app(record.app_id)
                        found = fresh.replica(server_id, replica.variant) if fresh else None
                        if fresh is None or found is None:
                            continue
                        found.state = ReplicaState.UNLOADING
                        if fresh.serving == found.key:
                            fresh.serving = None
                        if fresh.home and fresh.home[0] == server_id:
                            fresh.home = None
                        await o.store.put_app(fresh)
                    await o.unload_replica(record.app_id, server_id, replica.variant)
                    await o.advance(record.app_id)
        servers = await o.store.servers()
        server = servers[server_id]
        server.state = ServerState.DRAINED
        await o.store.put_server(server)
        o.agents.detector.forget(server_id)
        o.request_warm_replan()
        logger.info("server %s drained", server_id)
