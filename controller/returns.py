"""A server comes back: hello, take-back after a false alarm, reconcile, fail-back.

A server returns in three ways: its agent says hello again (restarted, or reconnected after a
failover), a server declared failed is heard from on its open connection (:meth:`revive`, a
false alarm), or its agent restarted Triton (:meth:`on_triton_up`). Each converges the agent to
the records and then brings apps home when the configuration asks for fail-back.
"""

from __future__ import annotations

import logging

from controller.errors import AgentCommandError, AgentUnavailableError
from controller.orchestrator import Orchestrator
from controller.records import (
    AppRecord,
    Replica,
    ReplicaRole,
    ReplicaState,
    ServerRecord,
    ServerState,
)
from controller.takeback import take_back
from understudy.wire.protocol import Hello, InventoryItem, TritonUp, UnloadCommand

logger = logging.getLogger(__name__)

FIRST_HEARTBEAT_GRACE_S = 1.0


class ServerReturns:
    """What the controller does when a server (re)connects or is heard from again."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator
        self._reviving: set[str] = set()

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
            o.prefetcher.server_joined(hello.server_id)
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

    async def _take_back(self, server_id: str, inventory: list[InventoryItem],
                         revive: bool = False) -> bool:
        """Switch apps back to models a returned server still holds (controller.takeback).

        With ``revive`` the server, still marked failed, is marked up in the same transaction
        (after a failover of it that is still running: the planning lock); returns False when
        it is no longer failed, so someone else took it back.
        """
        o = self.o
        async with o.plan_lock, o.every_app_locked():
            servers: list[ServerRecord] = []
            if revive:
                record = (await o.store.servers()).get(server_id)
                if record is None or record.state is not ServerState.FAILED:
                    return False
                record.state = ServerState.UP
                servers.append(record)
            apps = await o.store.apps()
            result = take_back(server_id, inventory, apps, o.accuracy)
            changed = sorted({a for a, _ in result.adopted + result.backups})
            if changed or servers:
                await o.store.commit(apps=[apps[a] for a in changed], servers=servers)
        if not changed:
            return True
        logger.warning("server %s returned holding models: %d serve again without a load (%s), "
                       "%d kept as warm backups", server_id, len(result.adopted),
                       ", ".join(f"{a}/{v}" for a, v in result.adopted), len(result.backups))
        for app_id, replica_server, variant in result.retired:
            o.spawn(o.unload_replica(app_id, replica_server, variant),
                    f"retiring {app_id}/{variant} after a take-back")
        for app_id, _ in result.adopted:
            o.metrics.events.labels("take_back").inc()
            await o.advance(app_id)
        return True

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
                    await self.fail_back(record.app_id)
        o.request_warm_replan()

    async def fail_back(self, app_id: str) -> None:
        """Load the app's home primary again; :meth:`advance` switches to it when ready."""
        o = self.o
        async with o.plan_lock, o.every_app_locked():
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
        """A server declared failed is heard from again on its open connection.

        Its inventory is read while it is still marked failed, and it is marked up in the same
        locked step that takes back its models: a re-plan in between used to see it up and
        empty, and put warm backups into the room its own apps were about to take back (the
        server then held more than its capacity, and the plan could not be made to fit).
        """
        o = self.o
        if server_id in self._reviving:
            return  # the watchdog and the detector can both report one revival
        self._reviving.add(server_id)
        try:
            record = (await o.store.servers()).get(server_id)
            if record is None or record.state is not ServerState.FAILED:
                return
            o.agents.detector.false_alarm(server_id)
            logger.warning("server %s declared failed earlier is alive; taking it back",
                           server_id)
            try:
                inventory = await o.agents.inventory(server_id)
            except (AgentUnavailableError, AgentCommandError) as exc:
                logger.warning("inventory of revived %s: %s", server_id, exc)
                inventory = []
            if await self._take_back(server_id, inventory, revive=True):
                await self.reconcile_server(server_id, inventory)
                await self._after_join(server_id, True)
        finally:
            self._reviving.discard(server_id)

    async def retry_failbacks(self, servers: dict[str, ServerRecord]) -> None:
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
            await self.fail_back(record.app_id)

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

