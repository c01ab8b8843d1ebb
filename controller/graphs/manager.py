"""Service graphs on the cluster: NSPB replicas on the agents, frontend and manager in here.

A registered graph is deployed with ``stateful.runtime.LocalGraph`` — the same recovery manager
(``Coordinator``) and frontend the local runtime uses, hosted in the controller process — over an
:class:`AgentReplicaLauncher`, which starts every replica process through the agent of a server
chosen by ``controller.graphs.placement`` (a stateful operator's primary and backup on different
servers, different sites when there are several; standbys spread over the live servers) from
the hosts ``controller/graphs/hosts.py`` offers. A graph's record (what Redis and the API see) is
a snapshot of its :class:`~controller.graphs.live.LiveGraph` (``controller/graphs/live.py``).

Failure signals, all ending in ``on_replica_failed(operator, replica)`` through the replica
handle's ``wait()`` (the death watch ``LocalGraph`` keeps on every replica):

* the controller's detector declares a server failed -> :meth:`GraphManager.on_server_failed`
  ends the handles of every replica there (an adjacent failure when a stateful primary and the
  backup of its successor shared it: the coordinator handles both in one recovery);
* an agent reports a replica process exit (``replica_exited``) -> that handle ends;
* a replica that does not answer a recovery round in time (the coordinator's own timeout).

Replica processes are started and stopped by ``controller/graphs/launcher.py``.

Knows nothing of HTTP (``controller/graphs/api.py`` is the REST layer).

**Controller restarts.** The manager writes every config it sends (and every failure it acts
on) to Redis first (``controller/graphs/runtime.py``), and the agents keep their replicas running
while no controller is there. On start-up every graph Redis remembers as live is ``restoring``:
once the agents that ran its replicas said hello again (or ``RESTORE_WAIT_S`` passed), a new
incarnation of the manager and frontend adopts the replicas that still run — their state goes on
— and fails the ones that do not, so their backups are promoted as after a server failure
(``controller/graphs/restore.py``). Client requests in flight at the crash are lost with their
HTTP connections (clients retry them); replies already sent stay consistent. HAMS replicates the
manager and frontend with SMR; we rebuild them from the replicas and Redis instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from controller.agents import AgentHub
from controller.errors import (
    AgentCommandError,
    AgentUnavailableError,
    ConflictError,
    ControllerError,
    InvalidRequestError,
    NotFoundError,
)
from controller.graphs.hosts import GraphHosts
from controller.graphs.launcher import SERVER_GONE, AgentReplicaHandle, AgentReplicaLauncher
from controller.graphs.live import LiveGraph, replica_demand, runtime_options, snapshot
from controller.graphs.placement import OperatorSlots, PlacementError, place_graph
from controller.graphs.records import GraphRecord, GraphRegistration, GraphStatus
from controller.graphs.restore import Inventories, plan_adoption
from controller.graphs.runtime import ClusterGraph
from controller.records import now
from controller.store import Store
from stateful.core.coordinator import initial_config
from stateful.core.frontend import ClientRequest
from stateful.graph import GraphSpec
from stateful.messages import Payload
from understudy.wire.protocol import Hello, ReplicaExited, StopReplicaCommand

logger = logging.getLogger(__name__)

TRITON_KIND = "triton"
PERSIST_INTERVAL_S = 0.5
"""How often a live graph's placement is compared with what Redis has (written on change)."""
RESTORE_WAIT_S = 15.0
"""After a controller restart, how long a graph waits for the agents that ran its replicas to
reconnect before the replicas there count as failed."""
REQUEST_ID_BLOCK = 1000
"""Request ids reserved in Redis at a time (one write per block, before the first id is used)."""
LIVE_STATUSES = (GraphStatus.DEPLOYING, GraphStatus.SERVING, GraphStatus.RECOVERING,
                 GraphStatus.RESTORING)


class GraphTimeoutError(ControllerError):
    """A graph request got no reply in time (the graph may still answer it later)."""

    status = 504


class GraphDeployError(ControllerError):
    """The graph's replicas could not be started (an agent refused or is gone; retryable)."""

    status = 503
    retryable = True


class GraphManager:
    """Registered graphs: deploy, watch, recover, persist, serve requests."""

    def __init__(self, store: Store, agents: AgentHub, run_dir: Path, host: str = "127.0.0.1",
                 controller_url: str = "http://127.0.0.1:8000") -> None:
        self.store = store
        self.agents = agents
        self.run_dir = run_dir
        self.host = host
        self.controller_url = controller_url
        self.live: dict[str, LiveGraph] = {}
        self.hosts = GraphHosts(store, agents, self.live)
        """Where replicas may go (the service sets its ``free_of``)."""
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.inventories = Inventories()
        self.restoring: dict[str, asyncio.Task[None]] = {}

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """After a (re)start: rebuild every graph Redis remembers as live (in the background)."""
        for record in (await self.store.graphs()).values():
            if record.status not in LIVE_STATUSES:
                continue
            if record.config is None:
                record.status = GraphStatus.INTERRUPTED
                record.reason = ("the controller restarted before the graph's first config was "
                                 "written; its replicas are stopped as their agents reconnect; "
                                 "delete and register it again")
                await self.store.put_graph(record)
                logger.warning("graph %s: %s", record.name, record.reason)
                continue
            record.status, record.reason = GraphStatus.RESTORING, "the controller restarted"
            await self.store.put_graph(record)
            self.restoring[record.name] = asyncio.ensure_future(self._restore(record))

    async def _restore(self, record: GraphRecord) -> None:
        """Adopt the replicas that still run; fail (and so replace) the ones that do not."""
        name = record.name
        servers = {r.server_id for r in record.replicas if r.alive}
        absent = await self.inventories.wait_for(servers, RESTORE_WAIT_S)
        if absent:
            logger.warning("graph %s: servers %s did not reconnect within %g s; their replicas "
                           "count as failed", name, sorted(absent), RESTORE_WAIT_S)
        try:
            async with self._lock:
                if self.restoring.pop(name, None) is None:
                    return  # deleted meanwhile
                await self.hosts.refresh()
                plan = plan_adoption(record, self.inventories.running(name))
                record.incarnation += 1
                live = self._build(record, {}, incarnation=record.incarnation, fresh=False)
                live.answered = record.requests
                live.past_recoveries = list(record.recoveries)
                live.partners = {**{w.primary: w.backup for w in plan.config.placements.values()
                                    if w.primary and w.backup},
                                 **{w.backup: w.primary for w in plan.config.placements.values()
                                    if w.primary and w.backup}}
                self.live[name] = live
            for server, node in plan.stop:
                logger.warning("graph %s: stopping replica %s on %s (no role after the "
                               "restart)", name, node, server)
                live.launcher.spawn(live.launcher.stop_node(node, server))
            handles = [AgentReplicaHandle(n, r.address, r.server_id, live.launcher)
                       for n, r in plan.adopt.items()]
            live.launcher.handles.update({h.node: h for h in handles})
            coordinator = live.graph.coordinator
            coordinator.synced = {op: (node, epoch) for op, (node, epoch) in record.synced.items()}
            coordinator.seen = dict(record.seen)
            coordinator.recoveries = len(record.recoveries)
            await live.graph.adopt(plan.config, handles, plan.spares, plan.failed,
                                   next_spare=plan.next_spare, first_request=record.request_ids)
            live.graph.add_spares(plan.missing_spares)
        except Exception as exc:  # noqa: BLE001 - this graph only; the others restore on
            logger.exception("graph %s: restore failed", name)
            live_now = self.live.pop(name, None)
            if live_now is not None:
                await self._stop(live_now)
            record.status, record.reason = GraphStatus.INTERRUPTED, f"restore failed: {exc}"
            await self.store.put_graph(record)
            return
        if self.live.get(name) is not live:
            return
        live.record.status, live.record.reason = GraphStatus.SERVING, ""
        await self._persist(live)
        live.watcher = asyncio.ensure_future(self._watch(live))
        logger.info("graph %s restored (incarnation %d): adopted %s, failed %s", name,
                    record.incarnation, sorted(plan.adopt), [n for _, n in plan.failed])

    async def close(self) -> None:
        """Controller shutdown: stop every live graph's replicas, mark the graphs interrupted."""
        for task in self.restoring.values():
            task.cancel()
        for name in list(self.live):
            live = self.live.pop(name)
            await self._stop(live)
            live.record.status = GraphStatus.INTERRUPTED
            live.record.reason = "the controller stopped"
            with contextlib.suppress(Exception):
                await self.store.put_graph(self._snapshot(live))

    # --- registration ----------------------------------------------------------------------

    async def register(self, reg: GraphRegistration, wait: bool = True) -> GraphRecord:
        """Validate, record (write-ahead), place and start a graph's replicas."""
        spec = await self._prepare(reg)
        reg = reg.model_copy(update={"spec": spec, "batch_size": None})
        record = GraphRecord(name=spec.name, registration=reg, created_at=now())
        async with self._lock:
            if spec.name in self.live or not await self.store.add_graph(record):
                raise ConflictError(f"graph {spec.name!r} is already registered")
            hosts = await self.hosts.refresh()
            config = initial_config(spec, runtime_options(reg))
            slots = [OperatorSlots(op, where.primary or "", where.backup)
                     for op, where in config.placements.items()]
            try:
                plan = place_graph(slots, [], hosts, replica_demand(reg))
            except PlacementError as exc:
                await self.store.delete_graph(spec.name)
                raise ConflictError(f"graph {spec.name!r}: {exc}") from exc
            live = self._build(record, plan)
            live.partners = {**{s.primary: s.backup for s in slots if s.backup},
                             **{s.backup: s.primary for s in slots if s.backup}}
            self.live[spec.name] = live
        logger.info("graph %s: deploying %s in %s mode (%d standbys): %s", spec.name,
                    sorted(plan), reg.mode.value, reg.spares, plan)
        deploy = asyncio.ensure_future(self._deploy(live))
        if not wait:
            self._keep(deploy)
            return self.view(spec.name) if spec.name in self.live else record
        if not await deploy:
            failed = await self.get(spec.name)
            raise GraphDeployError(f"graph {spec.name!r} could not be deployed: "
                                   f"{failed.reason}")
        return await self.get(spec.name)

    async def _prepare(self, reg: GraphRegistration) -> GraphSpec:
        spec = reg.spec
        if reg.batch_size is not None:
            spec = GraphSpec.model_validate({**spec.model_dump(), "batch_size": reg.batch_size})
        operators = []
        for op in spec.operators:
            if op.kind == TRITON_KIND:
                app_id = op.params.get("app_id")
                if not isinstance(app_id, str) or await self.store.get_app(app_id) is None:
                    raise InvalidRequestError(f"operator {op.name!r}: params.app_id must name a "
                                              f"registered app (got {app_id!r})")
                if "controller_url" not in op.params:
                    op = op.model_copy(update={"params": {**op.params,
                                                          "controller_url": self.controller_url}})
            operators.append(op)
        spec = GraphSpec.model_validate({**spec.model_dump(), "operators": operators})
        # Imported here: the operators are torch modules, which a controller that never
        # registers a graph need not import (a second of every start).
        from stateful.operators import check_kinds

        check_kinds(spec)  # unknown kinds or a stateful flag that disagrees: 422
        return spec

    def _build(self, record: GraphRecord, plan: dict[str, str], incarnation: int = 0,
               fresh: bool = True) -> LiveGraph:
        reg = record.registration
        run_dir = self.run_dir / "graphs" / record.name
        if fresh:
            shutil.rmtree(run_dir / "observe", ignore_errors=True)  # an earlier graph's files
        run_dir.mkdir(parents=True, exist_ok=True)
        observe_dir = (run_dir / "observe").resolve() if reg.observe else None
        holder: list[LiveGraph] = []
        launcher = AgentReplicaLauncher(record.name, self.agents,
                                        lambda node, avoid: self.hosts.choose(holder[0], node,
                                                                              avoid),
                                        observe_dir)
        graph = ClusterGraph(reg.spec, runtime_options(reg), launcher=launcher, run_dir=run_dir,
                             spares=reg.spares, host=self.host, incarnation=incarnation,
                             persist=lambda: self._persist(holder[0]))

        graph.coordinator.spare_rank = \
            lambda candidate, partner: self.hosts.spare_rank(holder[0], candidate, partner)
        live = LiveGraph(record=record, graph=graph, launcher=launcher, plan=plan)
        holder.append(live)
        return live

    async def _deploy(self, live: LiveGraph) -> bool:
        """Start the replicas and the frontend; False (recorded as FAILED) when that fails."""
        name = live.record.name
        try:
            await live.graph.start()
        except Exception as exc:  # noqa: BLE001 - any start failure fails this graph only
            logger.exception("graph %s: deployment failed", name)
            await self._stop(live)
            if self.live.get(name) is live:
                del self.live[name]
                live.record.status, live.record.reason = GraphStatus.FAILED, str(exc)
                await self.store.put_graph(self._snapshot(live))
            return False
        if self.live.get(name) is not live:
            await self._stop(live)  # deleted while it deployed
            return False
        live.record.status, live.record.reason = GraphStatus.SERVING, ""
        await self._persist(live)
        live.watcher = asyncio.ensure_future(self._watch(live))
        return True

    async def _watch(self, live: LiveGraph) -> None:
        """Persist the placement after every recovery (and any standby change), once a second."""
        seen = (-1, -1, -1, -1)
        while self.live.get(live.record.name) is live:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            config = live.graph.config
            state = (len(live.graph.recoveries), config.version if config else 0,
                     len(live.launcher.handles), live.answered)
            if state == seen:
                continue
            seen = state
            try:
                await self.hosts.refresh_free()
                await self._persist(live)
            except Exception:  # noqa: BLE001 - keep watching; the next pass writes again
                logger.exception("graph %s: could not persist its placement", live.record.name)

    async def _persist(self, live: LiveGraph) -> None:
        """Write a live graph's record (the manager's state with it), newest snapshot last."""
        async with live.write_lock:
            if self.live.get(live.record.name) is live:
                await self.store.put_graph(self._snapshot(live))

    # --- queries -----------------------------------------------------------------------------

    async def registered(self) -> list[GraphRecord]:
        """Every registered graph (live ones with their current placement)."""
        stored = await self.store.graphs()
        return [self.view(name) if name in self.live else record
                for name, record in stored.items()]

    async def get(self, name: str) -> GraphRecord:
        """One graph; NotFoundError when unknown."""
        if name in self.live:
            return self.view(name)
        record = await self.store.get_graph(name)
        if record is None:
            raise NotFoundError(f"graph {name!r} is not registered")
        return record

    def view(self, name: str) -> GraphRecord:
        """A live graph's record with its current status, replicas and recoveries."""
        return self._snapshot(self.live[name])

    def _snapshot(self, live: LiveGraph) -> GraphRecord:
        return snapshot(live, self.hosts.sites)

    # --- requests ----------------------------------------------------------------------------

    async def submit(self, name: str, request: ClientRequest,
                     timeout_s: float = 30.0) -> dict[str, Payload]:
        """Send a client request into the graph's frontend and wait for its reply."""
        live = self.live.get(name)
        if live is None:
            record = await self.get(name)  # NotFoundError when unknown
            raise ConflictError(f"graph {name!r} is {record.status.value}: {record.reason}")
        if live.graph.frontend.config is None:
            raise ConflictError(f"graph {name!r} is still deploying")
        await self._reserve_id(live)
        try:
            outputs = await live.graph.submit(request, timeout_s=timeout_s)
        except TimeoutError as exc:
            raise GraphTimeoutError(f"graph {name!r}: no reply within {timeout_s:g} s") from exc
        live.answered += 1
        return dict(outputs)

    async def _reserve_id(self, live: LiveGraph) -> None:
        """Write a new block of request ids before the frontend uses the first one of it."""
        if live.graph.frontend.next_id < live.record.request_ids:
            return
        async with live.id_lock:
            if live.graph.frontend.next_id >= live.record.request_ids:
                live.record.request_ids = live.graph.frontend.next_id + REQUEST_ID_BLOCK
                await self._persist(live)

    async def consistency(self, name: str) -> dict[str, Any]:
        """Run the consistency checker over the graph's observations (``observe`` graphs)."""
        live = self.live.get(name)
        if live is None or not live.record.registration.observe:
            raise ConflictError(f"graph {name!r} is not live with observe=true")
        report = await asyncio.to_thread(live.graph.report)
        return {"ok": report.ok, "summary": report.summary(),
                "inconsistencies": [str(i) for i in report.inconsistencies[:100]],
                "inconsistency_count": len(report.inconsistencies), "lost": report.lost[:100],
                "submitted": report.submitted, "replied": report.replied,
                "promotions": report.promotions}

    # --- deletion ----------------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        """Stop a graph's replicas and forget it."""
        async with self._lock:
            live = self.live.pop(name, None)
            if live is None and await self.store.get_graph(name) is None:
                raise NotFoundError(f"graph {name!r} is not registered")
            await self.store.delete_graph(name)
            restoring = self.restoring.pop(name, None)
        if restoring is not None:
            restoring.cancel()
            await self._stop_strays(name)
        if live is not None:
            await self._stop(live)
        logger.info("graph %s deleted", name)

    async def _stop(self, live: LiveGraph) -> None:
        if live.watcher is not None:
            live.watcher.cancel()
        live.launcher.closed = True
        await live.graph.stop()
        for target, task in list(live.launcher.starting.values()):
            logger.info("graph %s: abandoning a start on %s", live.record.name, target)
            task.cancel()
        await asyncio.sleep(0)  # the abandoned starts send their kills
        await live.launcher.settle()

    # --- failure signals (called on the event loop) ------------------------------------------

    def on_server_failed(self, server_id: str) -> None:
        """The detector declared a server failed: every replica there failed with it."""
        self.inventories.forget(server_id)
        for name, live in self.live.items():
            failed = live.launcher.fail_server(server_id)
            if failed:
                logger.warning("graph %s: server %s failed with replicas %s", name, server_id,
                               failed)
                # At once and together (one recovery, adjacent failures included); the
                # handles' death watches that follow find them failed already.
                roles = live.graph.config.roles if live.graph.config is not None else {}
                live.graph.on_replicas_failed(
                    [(roles[n][0] if n in roles else None, n) for n in failed])

    def on_replica_exited(self, server_id: str, message: ReplicaExited) -> None:
        """An agent saw a replica process end."""
        self.inventories.exited(server_id, message.graph, message.node)
        live = self.live.get(message.graph)
        handle = live.launcher.handles.get(message.node) if live is not None else None
        if handle is None or handle.server_id != server_id:
            return
        code = message.exit_code if message.exit_code is not None else SERVER_GONE
        if not message.requested:
            logger.warning("graph %s: replica %s on %s exited (%s)", message.graph,
                           message.node, server_id, code)
        handle.mark_exited(code)

    def on_hello(self, hello: Hello) -> None:
        """An agent (re)connected: learn its site; stop replicas no live graph counts on."""
        self.hosts.hello(hello.server_id, hello.site_id)
        self.inventories.hello(hello.server_id, hello.replicas)
        for info in hello.replicas:
            if info.graph in self.restoring:
                continue  # its restore adopts it or stops it
            live = self.live.get(info.graph)
            handle = live.launcher.handles.get(info.node) if live is not None else None
            wanted = handle is not None and handle.server_id == hello.server_id and \
                not handle.exited.done()
            starting = live is not None and info.node in live.launcher.starting
            if wanted or starting:
                continue
            logger.warning("server %s runs replica %s/%s that no live graph uses; stopping it",
                           hello.server_id, info.graph, info.node)
            self._keep(asyncio.ensure_future(self._stop_stray(hello.server_id, info.graph,
                                                              info.node)))

    async def _stop_strays(self, graph: str) -> None:
        """Kill every process of a graph the agents listed (a graph deleted while restoring)."""
        await asyncio.gather(*(self._stop_stray(r.server_id, graph, node)
                               for node, r in self.inventories.running(graph).items()))

    async def _stop_stray(self, server_id: str, graph: str, node: str) -> None:
        command = StopReplicaCommand(command_id=self.agents.next_id(), graph=graph, node=node,
                                     kill=True)
        await self._quiet(self.agents.command(server_id, command))  # type: ignore[arg-type]

    async def _quiet(self, coroutine: Any) -> None:
        try:
            await coroutine
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.info("stray replica stop: %s", exc)

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tasks.discard)
