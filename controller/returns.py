"""A server comes back: hello, take-back after a false alarm, reconcile, fail-back/forward.

A server returns in three ways: its agent says hello again (restarted, or reconnected after a
failover), a server declared failed is heard from on its open connection (:meth:`revive`, a
false alarm), or its agent restarted Triton (:meth:`on_triton_up`). Each converges the agent to
the records (``decide.returns``) and then brings apps home when the configuration asks for
fail-back; an app it took back below its home variant while its home is down gets its
target loaded where it serves (fail-forward).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from controller.decide.returns import (
    decide_fail_back,
    decide_fail_forward,
    decide_reconcile,
    decide_take_back,
    stranded_below_home,
)
from controller.declarations import DeclarationLog
from controller.errors import AgentCommandError, AgentUnavailableError
from controller.executor import Executor
from controller.interfaces import AgentLink, FailureWatch, RecordStore
from controller.metrics import Metrics
from controller.records import ServerRecord, ServerState
from controller.snapshot import build_snapshot
from policies.model import Family
from understudy.wire.protocol import Hello, InventoryItem, ModelState, TritonUp

logger = logging.getLogger(__name__)

FIRST_HEARTBEAT_GRACE_S = 1.0


class ServerReturns:
    """What the controller does when a server (re)connects or is heard from again."""

    def __init__(self, executor: Executor, store: RecordStore, agents: AgentLink,
                 watch: FailureWatch, families: Mapping[str, Family], metrics: Metrics,
                 failback: Callable[[], bool], place_unplaced: Callable[[], Awaitable[None]],
                 server_joined: Callable[[str], None],
                 request_warm_replan: Callable[[], None],
                 declarations: DeclarationLog | None = None) -> None:
        self.executor = executor
        self.declarations = declarations
        self.store = store
        self.agents = agents
        self.watch = watch
        self.families = families
        self.metrics = metrics
        self.failback = failback
        self.place_unplaced = place_unplaced
        self.server_joined = server_joined
        self.request_warm_replan = request_warm_replan
        self._reviving: set[str] = set()
        self._failbacks_clear_at: int | None = None
        """The records' revision at which the last fail-back pass found nothing to do."""

    async def on_hello(self, hello: Hello) -> None:
        """An agent connected: register or update its server, reconcile, fail back."""
        record = (await self.store.view()).servers.get(hello.server_id)  # read-only
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
        await self.store.put_server(updated)
        if state is ServerState.UP:
            # The first heartbeat follows the hello; give it a generous first deadline.
            self.watch.watch(hello.server_id,
                             grace_s=max(FIRST_HEARTBEAT_GRACE_S, self.watch.timeout_s))
            self.server_joined(hello.server_id)
        logger.info("server %s (%s) %s with %d models", hello.server_id, hello.site_id,
                    "returned" if was_failed else "connected", len(hello.inventory))
        if was_failed and self.declarations is not None and record is not None:
            # The same agent boot coming back means it never died: a false declaration.
            await self.declarations.mark_alive(hello.server_id, time.time(),
                                               same_boot=record.boot_id == hello.boot_id)
        spawn = self.executor.spawn
        if was_failed:
            spawn(self._return(hello.server_id, hello.inventory), f"return of {hello.server_id}")
            return
        spawn(self.reconcile_server(hello.server_id, hello.inventory),
              f"reconcile {hello.server_id}")
        if record is None:
            spawn(self._after_join(hello.server_id, False), f"join {hello.server_id}")

    async def _return(self, server_id: str, inventory: list[InventoryItem]) -> None:
        """A server declared failed is back: take back what it still holds, then converge."""
        await self._take_back(server_id, inventory)
        await self.reconcile_server(server_id, inventory)
        await self._after_join(server_id, True)

    async def _take_back(self, server_id: str, inventory: list[InventoryItem],
                         revive: bool = False) -> bool:
        """Switch apps back to models a returned server still holds.

        With ``revive`` the server, still marked failed, is marked up in the same transaction
        (after a failover of it that is still running: the planning lock); returns False when
        it is no longer failed, so someone else took it back.
        """
        ex = self.executor
        async with ex.locks.everything():
            revived = None
            if revive:
                revived = (await self.store.servers()).get(server_id)
                if revived is None or revived.state is not ServerState.FAILED:
                    return False
                revived.state = ServerState.UP
            decision = decide_take_back(await self.store.apps(), server_id, inventory,
                                        self.families, revived)
            await ex.commit(decision)
        adopted = sum(len(s.actions) for s in decision.stages if s.name == "adopt")
        self.metrics.events.labels("take_back").inc(adopted)
        await ex.act(decision)
        return True

    async def _after_join(self, server_id: str, failed_before: bool) -> None:
        await self.place_unplaced()  # apps that found no room before
        if failed_before:
            await self.fail_forward(server_id)
        if failed_before and self.failback():
            for record in (await self.store.view()).apps.values():
                if record.home and record.home[0] == server_id and record.serving != record.home:
                    await self.fail_back(record.app_id)
        self.request_warm_replan()

    async def fail_back(self, app_id: str) -> None:
        """Load the app's home primary again; the serving state machine switches to it."""
        ex = self.executor
        async with ex.locks.everything():
            apps, servers = await self.store.apps_and_servers()
            decision = decide_fail_back(apps, build_snapshot(self.families, servers, apps),
                                        app_id, self.families)
            if decision is None:
                return
            await ex.commit(decision)
        ex.spawn(ex.act(decision), f"fail-back of {app_id}")

    async def fail_forward(self, server_id: str) -> None:
        """Apps taken back below their home variant, home down: their target loads here.

        The records of the apps on the server are looked at first, read-only; a snapshot is
        built only when one of them is left below its home (``decide_fail_forward``).
        """
        view = await self.store.view()
        live = {s for s, r in view.servers.items() if r.state is ServerState.UP}
        if not any(stranded_below_home(record, server_id, live, self.families) is not None
                   for a in await self.store.apps_on(server_id)
                   if (record := view.apps.get(a)) is not None):
            return
        ex = self.executor
        async with ex.locks.everything():
            apps, servers = await self.store.apps_and_servers()
            decision = decide_fail_forward(
                {a: apps[a] for a in await self.store.apps_on(server_id) if a in apps},
                build_snapshot(self.families, servers, apps), server_id, self.families)
            if decision is None:
                return
            await ex.commit(decision)
        ex.spawn(ex.act(decision), f"fail-forward on {server_id}")

    async def reconcile_server(self, server_id: str, inventory: list[InventoryItem]) -> None:
        """Converge one agent to the records: re-issue loads and unloads, remove strays."""
        ex = self.executor
        # Under the planning lock no app gains a replica on the server (every load is
        # decided under it), so the apps on it now are all the decision needs.
        async with ex.locks.plan:
            app_ids = await self.store.apps_on(server_id)
            async with ex.locks.apps(app_ids):
                apps = {a: r for a in app_ids if (r := await self.store.get_app(a)) is not None}
                decision = decide_reconcile(apps, server_id, inventory)
                await ex.commit(decision)
        ex.spawn(ex.act(decision), f"reconcile {server_id}")

    async def revive(self, server_id: str) -> None:
        """A server declared failed is heard from again on its open connection.

        Its inventory is read while it is still marked failed, and it is marked up in the same
        locked step that takes back its models: a re-plan in between would see it up and
        empty, and put warm backups into the room its own apps were about to take back.
        """
        if server_id in self._reviving:
            return  # the watchdog and the detector can both report one revival
        self._reviving.add(server_id)
        try:
            record = (await self.store.servers()).get(server_id)
            if record is None or record.state is not ServerState.FAILED:
                return
            self.watch.false_alarm(server_id)
            logger.warning("server %s declared failed earlier is alive; taking it back",
                           server_id)
            if self.declarations is not None:
                await self.declarations.mark_alive(server_id, time.time(), same_boot=None)
            try:
                inventory = await self.agents.inventory(server_id)
            except (AgentUnavailableError, AgentCommandError) as exc:
                logger.warning("inventory of revived %s: %s", server_id, exc)
                inventory = []
            if await self._take_back(server_id, inventory, revive=True):
                self.server_joined(server_id)  # prefetches skipped it while it was failed
                await self.reconcile_server(server_id, inventory)
                await self._after_join(server_id, True)
        finally:
            self._reviving.discard(server_id)

    def reviving(self, server_id: str) -> bool:
        """Whether a revival of the server (its take-back) is under way."""
        return server_id in self._reviving

    async def retry_failbacks(self, servers: Mapping[str, ServerRecord]) -> None:
        """Apps away from (or smaller than) their home, home server up, nothing in flight.

        A pass that found nothing is not repeated until the records change (the watchdog
        runs it every second; 10,000 apps are worth not looking at again for nothing).
        """
        view = await self.store.view()
        if view.revision == self._failbacks_clear_at:
            return
        tried = False
        for record in view.apps.values():
            home = record.home
            if home is None or record.serving == home or record.serving is None:
                continue
            server = servers.get(home[0])
            if server is None or server.state is not ServerState.UP or not server.connected:
                continue
            if any(r.state is not ModelState.READY for r in record.replicas):
                continue
            tried = True
            await self.fail_back(record.app_id)
        self._failbacks_clear_at = None if tried else view.revision

    async def on_triton_up(self, server_id: str, message: TritonUp) -> None:
        """The agent restarted its Triton: treat it as the server's return."""
        servers = await self.store.servers()
        record = servers.get(server_id)
        if record is None:
            return
        endpoints = message.endpoints
        if (record.http, record.grpc) != (endpoints.http, endpoints.grpc):
            # Restarted on new ports (the old ones were taken): clients must go there.
            record.http, record.grpc = endpoints.http, endpoints.grpc
            await self.store.put_server(record)
        if record.state is ServerState.FAILED:
            record.state = ServerState.UP
            await self.store.put_server(record)
            self.watch.watch(server_id)
            self.server_joined(server_id)  # prefetches skipped it while it was failed
            self.executor.spawn(self._after_join(server_id, True), f"return of {server_id}")
