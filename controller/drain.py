"""Drain a server for maintenance: move every app off it without an outage."""

from __future__ import annotations

import asyncio
import logging

from controller.errors import ConflictError, NotFoundError
from controller.orchestrator import Orchestrator
from controller.records import Replica, ReplicaRole, ReplicaState, ServerRecord, ServerState

logger = logging.getLogger(__name__)


class ServerDrain:
    """Planned removal of a server: targets loaded elsewhere first, then the switch, then unload."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator

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
        async with o.plan_lock, o.every_app_locked():
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
