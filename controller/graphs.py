"""Service graphs on the cluster: NSPB replicas on the agents, frontend and manager in here.

A registered graph is deployed with ``stateful.runtime.LocalGraph`` — the same recovery manager
(``Coordinator``) and frontend the local runtime uses, hosted in the controller process — over an
:class:`AgentReplicaLauncher`, which starts every replica process through the agent of a server
chosen by ``controller.graph_placement`` (a stateful operator's primary and backup on different
servers, different sites when there are several; standbys spread over the live servers).

Failure signals, all ending in ``on_replica_failed(operator, replica)`` through the replica
handle's ``wait()`` (the death watch ``LocalGraph`` keeps on every replica):

* the controller's detector declares a server failed -> :meth:`GraphManager.on_server_failed`
  ends the handles of every replica there (an adjacent failure when a stateful primary and the
  backup of its successor shared it: the coordinator handles both in one recovery);
* an agent reports a replica process exit (``replica_exited``) -> that handle ends;
* a replica that does not answer a recovery round in time (the coordinator's own timeout).

Replica processes are started and stopped by ``controller/graph_launcher.py``.

Knows nothing of HTTP (``controller/graph_api.py`` is the REST layer).

**Controller restarts.** The frontend (request log, pending replies) and the manager (epochs,
durable points) live only in this process and are not rebuilt: on start-up every graph Redis
remembers as live is marked ``interrupted``; its replicas are stopped as their agents reconnect
and list them in their hello. The spec and last placement stay listed; delete and register the
graph again to redeploy it (its operators' state starts fresh). HAMS replicates the manager and
frontend with SMR; we do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from dataclasses import dataclass, field
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
from controller.graph_launcher import SERVER_GONE, AgentReplicaLauncher
from controller.graph_placement import (
    Host,
    OperatorSlots,
    PlacementError,
    place_graph,
    place_spare,
    spare_rank,
)
from controller.graph_records import (
    GraphRecord,
    GraphRegistration,
    GraphStatus,
    RecoveryView,
    ReplicaView,
)
from controller.records import ServerState, now
from controller.store import Store
from stateful.core.coordinator import initial_config
from stateful.core.frontend import ClientRequest
from stateful.graph import GraphSpec
from stateful.messages import NoiseSpec, Payload, RuntimeOptions
from stateful.operators import check_kinds
from stateful.runtime import LocalGraph
from understudy.protocol import Hello, ReplicaExited, StopReplicaCommand

logger = logging.getLogger(__name__)

TRITON_KIND = "triton"
PERSIST_INTERVAL_S = 0.5
"""How often a live graph's placement is compared with what Redis has (written on change)."""


class GraphTimeoutError(ControllerError):
    """A graph request got no reply in time (the graph may still answer it later)."""

    status = 504


class GraphDeployError(ControllerError):
    """The graph's replicas could not be started (an agent refused or is gone; retryable)."""

    status = 503
    retryable = True


@dataclass
class LiveGraph:
    """A deployed graph: its record, runtime and launcher."""

    record: GraphRecord
    graph: LocalGraph
    launcher: AgentReplicaLauncher
    plan: dict[str, str]
    """Server of each initial replica (standbys are placed as they start)."""
    partners: dict[str, str] = field(default_factory=dict)
    """Primary <-> backup node of each stateful operator in the initial placement."""
    watcher: asyncio.Task[None] | None = None
    answered: int = 0


def runtime_options(reg: GraphRegistration) -> RuntimeOptions:
    """The NSPB runtime options of a registration."""
    noise = NoiseSpec(seed=reg.noise_seed) if reg.noise_seed is not None else None
    return RuntimeOptions(mode=reg.mode, observe=reg.observe, noise=noise)


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
        self._sites: dict[str, str] = {}
        self._usable: set[str] = set()
        """Servers whose record is up (not drained); liveness is asked of the detector."""
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """After a (re)start: graphs Redis remembers as live lost their frontend and manager."""
        for record in (await self.store.graphs()).values():
            if record.status in (GraphStatus.DEPLOYING, GraphStatus.SERVING,
                                 GraphStatus.RECOVERING):
                record.status = GraphStatus.INTERRUPTED
                record.reason = ("the controller restarted: the graph's frontend and recovery "
                                 "manager were lost; its replicas are stopped as their agents "
                                 "reconnect; delete and register it again to redeploy")
                await self.store.put_graph(record)
                logger.warning("graph %s: %s", record.name, record.reason)

    async def close(self) -> None:
        """Controller shutdown: stop every live graph's replicas, mark the graphs interrupted."""
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
            hosts = await self._hosts()
            config = initial_config(spec, runtime_options(reg))
            slots = [OperatorSlots(op, where.primary or "", where.backup)
                     for op, where in config.placements.items()]
            try:
                plan = place_graph(slots, [], hosts)
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
        check_kinds(spec)  # unknown kinds or a stateful flag that disagrees: 422
        return spec

    def _build(self, record: GraphRecord, plan: dict[str, str]) -> LiveGraph:
        reg = record.registration
        run_dir = self.run_dir / "graphs" / record.name
        shutil.rmtree(run_dir / "observe", ignore_errors=True)  # an earlier graph's files
        run_dir.mkdir(parents=True, exist_ok=True)
        observe_dir = (run_dir / "observe").resolve() if reg.observe else None
        holder: list[LiveGraph] = []
        launcher = AgentReplicaLauncher(record.name, self.agents,
                                        lambda node, avoid: self._choose(holder[0], node, avoid),
                                        observe_dir)
        graph = LocalGraph(reg.spec, runtime_options(reg), launcher=launcher, run_dir=run_dir,
                           spares=reg.spares, host=self.host)

        def rank(candidate: str, partner: str | None) -> int | None:
            return spare_rank(launcher.server_of(candidate), launcher.server_of(partner),
                              self._sites, [h.server_id for h in self._live_hosts()])

        graph.coordinator.spare_rank = rank
        live = LiveGraph(record=record, graph=graph, launcher=launcher, plan=plan)
        holder.append(live)
        return live

    def _choose(self, live: LiveGraph, node: str, avoid: set[str]) -> str:
        """Server for a replica: the plan for the initial ones, the spread for standbys."""
        planned = live.plan.get(node)
        if planned is not None and planned not in avoid:
            return planned
        # A retry (its server failed during the start) or a standby: never next to the
        # operator's other replica.
        partner = live.launcher.server_of(live.partners.get(node))
        hosts = [h for h in self._live_hosts() if h.server_id not in avoid | {partner}]
        spares_on: dict[str, int] = {}
        for other in self.live.values():
            for spare in other.graph.coordinator.spares:
                server = other.launcher.server_of(spare)
                if server is not None:
                    spares_on[server] = spares_on.get(server, 0) + 1
            for starting, (server, _) in other.launcher.starting.items():
                if starting not in other.plan:
                    spares_on[server] = spares_on.get(server, 0) + 1
        return place_spare(hosts, spares_on, self._waiting_for_backup(live))

    @staticmethod
    def _waiting_for_backup(live: LiveGraph) -> set[str]:
        """Servers of stateful primaries whose backup is missing or dead."""
        coordinator = live.graph.coordinator
        config = coordinator.config
        if config is None or live.graph.options.mode.value == "bare":
            return set()
        found = set()
        for op in config.graph.topology.stateful:
            where = config.placements[op]
            if where.backup is None or where.backup in coordinator.dead:
                server = live.launcher.server_of(where.primary)
                if server is not None:
                    found.add(server)
        return found

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
        await self.store.put_graph(self._snapshot(live))
        live.watcher = asyncio.ensure_future(self._watch(live))
        return True

    async def _watch(self, live: LiveGraph) -> None:
        """Persist the placement after every recovery (and any standby change), once a second."""
        seen = (-1, -1, -1)
        while self.live.get(live.record.name) is live:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            config = live.graph.config
            state = (len(live.graph.recoveries), config.version if config else 0,
                     len(live.launcher.handles))
            if state == seen:
                continue
            seen = state
            try:
                await self.store.put_graph(self._snapshot(live))
            except Exception:  # noqa: BLE001 - keep watching; the next pass writes again
                logger.exception("graph %s: could not persist its placement", live.record.name)

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
        graph, coordinator = live.graph, live.graph.coordinator
        record = live.record.model_copy(deep=True)
        record.requests = live.answered
        config = coordinator.config
        if record.status in (GraphStatus.SERVING, GraphStatus.RECOVERING):
            record.status = GraphStatus.SERVING if graph.replicated() else \
                GraphStatus.RECOVERING
        if config is not None:
            record.config_version = config.version
            record.placements = {op: {"primary": w.primary, "backup": w.backup,
                                      "epoch": w.epoch} for op, w in config.placements.items()}
        roles = config.roles if config is not None else {}
        replicas = []
        for node, handle in sorted(live.launcher.handles.items()):
            alive = not handle.exited.done() and node not in coordinator.dead
            op, role = roles.get(node, (None, "standby" if node in coordinator.spares
                                        else "idle"))
            replicas.append(ReplicaView(node=node, server_id=handle.server_id,
                                        site_id=self._sites.get(handle.server_id),
                                        address=handle.address, operator=op,
                                        role=role if alive else "dead", alive=alive))
        record.replicas = replicas
        record.recoveries = [RecoveryView(
            recovery=r.recovery, failed=list(r.failed), promoted=list(r.promoted),
            rolled_back=list(r.rolled_back), restarted=list(r.restarted),
            duration_ms=round((r.finished_at - r.started_at) * 1e3, 3))
            for r in graph.recoveries]
        return record

    async def _hosts(self) -> list[Host]:
        servers = await self.store.servers()
        self._sites.update({s.server_id: s.site_id for s in servers.values()})
        self._usable = {s.server_id for s in servers.values() if s.state is ServerState.UP}
        return self._live_hosts()

    def _live_hosts(self) -> list[Host]:
        load: dict[str, int] = {}
        for live in self.live.values():
            for handle in live.launcher.handles.values():
                if not handle.exited.done():
                    load[handle.server_id] = load.get(handle.server_id, 0) + 1
        # Fresh every time: a server the detector failed (even a false alarm) gets nothing new.
        up = [s for s in self._usable
              if self.agents.connected(s) and self.agents.detector.watching(s)]
        return [Host(s, self._sites.get(s, s), load.get(s, 0)) for s in sorted(up)]

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
        try:
            outputs = await live.graph.submit(request, timeout_s=timeout_s)
        except TimeoutError as exc:
            raise GraphTimeoutError(f"graph {name!r}: no reply within {timeout_s:g} s") from exc
        live.answered += 1
        return dict(outputs)

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

    # --- failure signals (called on the event loop) ------------------------------------------

    def on_server_failed(self, server_id: str) -> None:
        """The detector declared a server failed: every replica there failed with it."""
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
        self._sites[hello.server_id] = hello.site_id
        self._usable.add(hello.server_id)
        for info in hello.replicas:
            live = self.live.get(info.graph)
            handle = live.launcher.handles.get(info.node) if live is not None else None
            wanted = handle is not None and handle.server_id == hello.server_id and \
                not handle.exited.done()
            starting = live is not None and info.node in live.launcher.starting
            if wanted or starting:
                continue
            logger.warning("server %s runs replica %s/%s that no live graph uses; stopping it",
                           hello.server_id, info.graph, info.node)
            command = StopReplicaCommand(command_id=self.agents.next_id(), graph=info.graph,
                                         node=info.node, kill=True)
            self._keep(asyncio.ensure_future(self._quiet(
                self.agents.command(hello.server_id, command))))  # type: ignore[arg-type]

    async def _quiet(self, coroutine: Any) -> None:
        try:
            await coroutine
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.info("stray replica stop: %s", exc)

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tasks.discard)
