"""Servers failing and draining: events in, decisions (``controller.decide``) out, executed.

A failure goes: the detector's callback (:meth:`ServerLifecycle.on_failure`) -> the switch
(``controller.failover``: the server and the warm switches, with the intent, committed and
announced under the locks of its apps only) -> a cold round shared with the other servers
failing meanwhile (one snapshot, the policy's ``FailoverPlan``, ``decide_cold_batch``
committed) -> its stages run by the executor -> a warm re-plan -> the intent is done. A
controller restarted in between finds the intent and runs the failover again from the records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from controller.decide.drain import decide_drain_leftovers, decide_drain_moves, server_drained
from controller.decide.failover import FAILOVER
from controller.declarations import DeclarationLog
from controller.errors import ConflictError, NotFoundError
from controller.executor import Executor
from controller.failover import Failovers
from controller.interfaces import AgentLink, Clock, FailureWatch, RecordStore
from controller.metrics import Metrics
from controller.records import ServerRecord, ServerState
from controller.returns import ServerReturns
from controller.snapshot import build_snapshot
from policies.model import Family
from policies.policy import FailoverPolicy

logger = logging.getLogger(__name__)

class ServerLifecycle:
    """Failure, resumption, drain and the watchdog; returns are :class:`ServerReturns`."""

    def __init__(self, executor: Executor, store: RecordStore, agents: AgentLink,
                 watch: FailureWatch, families: Mapping[str, Family],
                 policy: Callable[[], FailoverPolicy], metrics: Metrics, clock: Clock,
                 replan_warm: Callable[[], Awaitable[Any]],
                 returns: ServerReturns, declarations: DeclarationLog | None = None) -> None:
        self.executor = executor
        self.store = store
        self.agents = agents
        self.watch = watch
        self.families = families
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.returns = returns
        self.failovers = Failovers(executor, store, agents, watch, families, policy, metrics,
                                   clock, replan_warm, declarations)
        self._failing: set[str] = set()
        """Servers whose failover task is running."""

    # --- failure ---------------------------------------------------------------------------

    def on_failure(self, server_id: str, reason: str, detected_at: float,
                   last_seen: float) -> None:
        """Detector callback (synchronous, on the loop): start the failover task."""
        self.metrics.detection.observe(max(0.0, detected_at - last_seen))
        self.failovers.last_seen[server_id] = last_seen
        self.metrics.server_failures.labels(reason).inc()
        logger.error("server %s declared failed (%s, %.1f ms after its last sign of life)",
                     server_id, reason, (detected_at - last_seen) * 1000)
        self.executor.spawn(self.fail_server(server_id, reason, detected_at),
                            f"failover of {server_id}")

    async def fail_server(self, server_id: str, reason: str, detected_at: float,
                          resuming: bool = False) -> None:
        """Mark the server failed and recover every app that served or was backed up there.

        ``resuming``: the server is marked failed already (a restarted controller found the
        failover's intent, or apps still served there): decide it all again from the records.
        """
        self._failing.add(server_id)
        try:
            await self._fail_server(server_id, reason, detected_at, resuming)
        finally:
            self._failing.discard(server_id)

    async def _fail_server(self, server_id: str, reason: str, detected_at: float,
                           resuming: bool) -> None:
        failure = await self.failovers.switch(server_id, reason, detected_at, resuming)
        if failure is not None:
            await self.failovers.recover(failure)

    async def resume_failover(self, server_id: str) -> None:
        """Run a failover again for a failed server whose apps were not all moved.

        The controller died in the middle: every step is decided from the records again.
        """
        record = (await self.store.servers()).get(server_id)
        if record is None or record.state is not ServerState.FAILED:
            return
        logger.warning("resuming the failover of %s", server_id)
        await self.fail_server(server_id, "failover resumed",
                               record.failed_at or self.clock.time(), resuming=True)

    # --- drain -----------------------------------------------------------------------------

    async def drain(self, server_id: str) -> ServerRecord:
        """Move every app off a server without interrupting it, then mark it drained."""
        servers = await self.store.servers()
        record = servers.get(server_id)
        if record is None:
            raise NotFoundError(f"server {server_id!r} is unknown")
        if record.state is not ServerState.UP:
            raise ConflictError(f"server {server_id!r} is {record.state.value}, not up")
        record.state = ServerState.DRAINING
        await self.store.put_server(record)
        self.executor.spawn(self._drain(server_id), f"drain of {server_id}")
        return record

    async def _drain(self, server_id: str) -> None:
        """Targets load elsewhere first, then the switch, then what is left unloads."""
        ex = self.executor
        async with ex.locks.everything():
            apps, servers = await self.store.apps_and_servers()
            snapshot = build_snapshot(self.families, servers, apps)
            plan = await asyncio.to_thread(self.policy().plan_failover, snapshot, [server_id])
            moves = decide_drain_moves(
                apps, [(r.app_id, r.server_id, r.target_variant) for r in plan.recoveries],
                [(s.app_id, s.server_id, s.variant) for s in plan.warm_switches],
                self.families)
            await ex.commit(moves)
        await ex.act(moves)
        async with ex.locks.everything():
            leftovers = decide_drain_leftovers(await self.store.apps(), server_id)
            await ex.commit(leftovers)
        await ex.act(leftovers)
        async with ex.locks.plan:
            server = (await self.store.servers())[server_id]
            drained = server_drained(server)
            await ex.commit(drained)
        self.watch.forget(server_id)
        await ex.act(drained)
        logger.info("server %s drained", server_id)

    # --- safety nets -------------------------------------------------------------------------

    async def watchdog(self, failback: Callable[[], bool], interval_s: float = 1.0) -> None:
        """Take back failed servers heard from again; resume stuck failovers; fail back.

        Whatever order the events came in, a server the detector watches is alive.
        """
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.watchdog_pass(failback())
            except Exception:  # noqa: BLE001 - keep watching
                logger.exception("server watchdog pass failed")

    async def watchdog_pass(self, failback: bool) -> None:
        """One pass of :meth:`watchdog`."""
        servers = (await self.store.view()).servers
        for server in servers.values():
            if server.state is ServerState.FAILED and \
                    self.agents.connected(server.server_id) and \
                    self.watch.watching(server.server_id):
                await self.returns.revive(server.server_id)
        await self._resume_stuck_failovers(servers)
        if failback:
            await self.returns.retry_failbacks(servers)

    async def _resume_stuck_failovers(self, servers: Mapping[str, ServerRecord]) -> None:
        """A failed server that still serves some app, with no failover running: redo it."""
        failed = {s for s, r in servers.items() if r.state is ServerState.FAILED
                  and s not in self._failing}
        if not failed:
            return
        # The record cache's server -> apps index: a failed server left failed (never back)
        # would otherwise cost a scan of every app each second.
        stuck = set()
        for server_id in failed:
            for app_id in await self.store.apps_on(server_id):
                record = await self.store.app_record(app_id)
                if record is not None and record.serving and record.serving[0] == server_id:
                    stuck.add(server_id)
                    break
        for server_id in sorted(stuck):
            self.executor.spawn(self.resume_failover(server_id),
                                f"resumed failover of {server_id}")

    async def startup_reconcile(self, grace_s: float) -> list[asyncio.Task[Any]]:
        """After a controller (re)start: every known UP server must say hello within grace.

        Unfinished failovers (their intents) are run again; returns their tasks.
        """
        for server in (await self.store.servers()).values():
            if server.state in (ServerState.UP, ServerState.DRAINING) and \
                    not self.agents.connected(server.server_id):
                if server.connected:  # to the controller before this one
                    server.connected = False
                    await self.store.put_server(server)
                self.watch.watch(server.server_id, grace_s=grace_s)
        resumed = []
        for intent_id, intent in (await self.store.intents()).items():
            logger.info("resuming after restart: unfinished %s (%s)", intent.get("kind"),
                        intent)
            if intent.get("kind") == FAILOVER:
                # A failover of servers declared together names them all (server_ids).
                for server_id in intent.get("server_ids") or [intent.get("server_id")]:
                    if server_id:
                        resumed.append(self.executor.spawn(
                            self.resume_failover(server_id),
                            f"resumed failover of {server_id}"))
            await self.store.done_intent(intent_id)
        return resumed
