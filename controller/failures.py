"""Server life cycle: failure (the two-step failover) here; return and drain delegated.

On a failure the order is what FailLite §3 prescribes and what clients feel: first every app
with a live warm backup is switched and notified (no agent command needed: the backup is
loaded), then the progressive recoveries start (interim, then target; :meth:`advance` does the
switching), then warm backups are re-planned for what was consumed or lost. A server's return
(:mod:`controller.returns`) and drain (:mod:`controller.drain`) have their own modules; the
watchdog here ties failure and return together.
"""

from __future__ import annotations

import asyncio
import logging
import time

from controller.drain import ServerDrain
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
from controller.returns import ServerReturns
from controller.snapshot import build_snapshot
from policies.actions import FailoverPlan, WarmSwitch
from policies.failover import split_affected
from policies.model import ClusterSnapshot
from understudy.wire.protocol import Hello, TritonUp

logger = logging.getLogger(__name__)

INLINE_PLAN_WORK = 2_000
"""apps x servers up to which a failover is planned on the event loop (1-2 ms here for 12 x
6, preemption search included; a plan this size stays far below the 50 ms heartbeat timeout)."""


def _timed_plan(o: Orchestrator, snapshot: ClusterSnapshot, server_id: str
                ) -> tuple[FailoverPlan, float]:
    """The failover plan and the seconds the planner itself took (inline or in a thread)."""
    started = time.perf_counter()
    plan = o.policy().plan_failover(snapshot, [server_id])
    return plan, time.perf_counter() - started


class ServerLifecycle:
    """Failure, return and drain of servers, on top of the orchestrator."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator
        self._failing: set[str] = set()
        """Servers whose failover task is running."""
        self.returns = ServerReturns(orchestrator)
        self.drainer = ServerDrain(orchestrator)

    async def on_hello(self, hello: Hello) -> None:
        """An agent connected (see :meth:`ServerReturns.on_hello`)."""
        await self.returns.on_hello(hello)

    async def revive(self, server_id: str) -> None:
        """A server declared failed is heard from on its open connection."""
        await self.returns.revive(server_id)

    async def on_triton_up(self, server_id: str, message: TritonUp) -> None:
        """The agent restarted its Triton."""
        await self.returns.on_triton_up(server_id, message)

    async def drain(self, server_id: str) -> ServerRecord:
        """Move every app off a server for maintenance (see :class:`ServerDrain`)."""
        return await self.drainer.drain(server_id)

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
            async with o.every_app_locked():
                apps, servers = await o.store.apps_and_servers()
                server = servers.get(server_id)
                if server is None or server.state is ServerState.FAILED:
                    return
                if o.agents.detector.watching(server_id):
                    # Heard from again while this task waited for the lock: not failed.
                    logger.warning("server %s is alive again; failover cancelled", server_id)
                    o.agents.detector.false_alarm(server_id)
                    return
                server.state, server.failed_at, server.failure_reason = (
                    ServerState.FAILED, detected_at, reason)
                server.connected = o.agents.connected(server_id)
                snapshot = build_snapshot(o.families, servers, apps)
                warm = split_affected(snapshot, [server_id]).warm_switches
                switched, events = self._switch_to_warm(warm, apps, servers, server_id,
                                                        detected_at)
                intent_details = {"kind": "failover", "server_id": server_id, "reason": reason}
                # A small plan (about a millisecond) is made here, before anything is written:
                # the failed server, the intent, the warm switches with their events and the
                # cold part (preempted backups, interim and target replicas, lost apps) then go
                # to Redis in one transaction, and the interim loads leave one round trip (and
                # one thread hand-off: 2-7 ms on a busy testbed) sooner, for a millisecond more
                # before the warm events. A large plan runs in a thread, after the warm
                # switches are written and announced: Algorithm 1 (and the preemption search)
                # must hold up neither the critical apps' switch nor the event loop, where late
                # heartbeats of the other servers would become false alarms.
                inline = len(apps) * len(servers) <= INLINE_PLAN_WORK
                if not inline:
                    intent, stored = await o.store.commit(
                        servers=[server], apps=[apps[a] for a in switched], events=events,
                        intent=intent_details)
                    o.events.deliver(stored)
                    self._announced(server_id, switched, detected_at, locked_at)
                asked = time.perf_counter()
                if inline:
                    plan, planner_s = _timed_plan(o, snapshot, server_id)
                else:
                    plan, planner_s = await asyncio.to_thread(_timed_plan, o, snapshot,
                                                              server_id)
                planned_ms = (time.perf_counter() - asked) * 1000
                preempted, recoveries, lost, changed = self._decide_cold(
                    plan, apps, server_id, detected_at)
                if inline:
                    intent, stored = await o.store.commit(
                        servers=[server], apps=[apps[a] for a in sorted(changed | set(switched))],
                        events=events + lost, intent=intent_details)
                    o.events.deliver(stored)
                    self._announced(server_id, switched, detected_at, locked_at)
                else:
                    _, stored = await o.store.commit(apps=[apps[a] for a in sorted(changed)],
                                                     events=lost)
                    o.events.deliver(stored)
        logger.info("failover of %s: %d warm switches, %d progressive, %d unrecoverable, "
                    "%d warm backups preempted, %d of them once the interims serve (%s); "
                    "planned in %.1f ms (%.1f in the planner)",
                    server_id, len(switched), len(recoveries), len(plan.unrecoverable),
                    len(preempted), sum(p[3] for p in preempted), "; ".join(plan.notes),
                    planned_ms, planner_s * 1000)
        for app_id, backup_server, variant, deferred in preempted:
            if not deferred:
                o.spawn(o.unload_replica(app_id, backup_server, variant),
                        f"preempt backup {app_id}/{variant}")
        # Interims first, in the plan's order (shortest first: they end the outage), then the
        # preempted backups they fitted beside, then the targets (they restore accuracy).
        await asyncio.gather(*(o.load_replica(a, s, v, urgent=True)
                               for a, s, v, first in recoveries if first))
        await asyncio.gather(*(o.unload_replica(a, s, v)
                               for a, s, v, deferred in preempted if deferred))
        await asyncio.gather(*(o.load_replica(a, s, v) for a, s, v, first in recoveries
                               if not first))
        for app_id in switched:
            o.spawn(o.advance(app_id), f"advance {app_id}")
        await o.replan_warm()
        await o.store.done_intent(intent)

    def _announced(self, server_id: str, switched: list[str], detected_at: float,
                   locked_at: float) -> None:
        """Log and count the warm switches just written and pushed to the clients."""
        o = self.o
        logger.info("failover of %s: %d warm switches announced %.1f ms after detection "
                    "(%.1f ms waiting for the planning lock)", server_id, len(switched),
                    (time.time() - detected_at) * 1000, (locked_at - detected_at) * 1000)
        for _ in switched:
            o.metrics.events.labels("warm_switch").inc()
            o.metrics.failovers.labels("warm").inc()
            o.metrics.mttr.labels("warm").observe(time.time() - detected_at)

    def _decide_cold(self, plan: FailoverPlan, apps: dict[str, AppRecord], server_id: str,
                     detected_at: float
                     ) -> tuple[list[tuple[str, str, str, bool]],
                                list[tuple[str, str, str, bool]], list[Event], set[str]]:
        """The plan's cold part applied to the records (in memory), not yet written.

        Returns the preempted backups, the loads (interims first), the events of the lost apps
        and the ids of every app record changed (the failed server's replicas forgotten too).
        """
        preempted = self._preempt(plan, apps)
        recoveries = self._start_recoveries(plan, apps, server_id, detected_at)
        lost = self._mark_unrecoverable(plan, apps, server_id, detected_at)
        changed = ({a for a, _, _, _ in preempted} | {a for a, _, _, _ in recoveries}
                   | {e.app_id for e in lost} | self._forget_replicas_on(server_id, apps))
        return preempted, recoveries, lost, changed

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
                 ) -> list[tuple[str, str, str, bool]]:
        """Mark the warm backups the plan preempts as unloading (in memory).

        Returns (app, server, variant, deferred): a deferred one is unloaded once the interims
        serve (they fit beside it; only the upgrades need its room).
        """
        deferred = set(plan.deferred_preemptions)
        preempted = []
        for placement in plan.preempted:
            record = apps.get(placement.app_id)
            replica = record.replica(placement.server_id, placement.variant) if record else None
            if record is None or replica is None or replica.role is not ReplicaRole.WARM:
                continue
            replica.state = ReplicaState.UNLOADING
            preempted.append((record.app_id, replica.server_id, replica.variant,
                              placement in deferred))
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
                        await self.returns.revive(server.server_id)
                await self._resume_stuck_failovers(servers)
                if self.o.config.failback:
                    await self.returns.retry_failbacks(servers)
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

