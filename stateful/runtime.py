"""A service graph deployed as real processes on this machine, with its frontend and manager.

``LocalGraph`` launches every replica through a ``ReplicaLauncher`` (local subprocesses by
default; the agent will implement the same protocol on each server), hosts the manager
(``Coordinator``) and the frontend in this process, and watches the replica processes: a death
becomes ``on_replica_failed(operator, replica)`` — the failure signal the controller's
detector will call instead once the agents host replicas. A warm pool of blank replica
processes (``spares``) serves as HAMS's hot standbys (§V): new backups, rejoins and stateless
restarts take one instead of waiting for a process to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from stateful.checker import ConsistencyChecker, ConsistencyReport, read_observations
from stateful.core.coordinator import Coordinator, initial_config
from stateful.core.effects import Effect, Kill, LaunchSpare, Observe, RecoveryDone, Reply
from stateful.core.frontend import ClientRequest, FrontendNode
from stateful.errors import LaunchError, ReplicaUnavailableError
from stateful.graph import FRONTEND, MANAGER, GraphSpec
from stateful.messages import GraphConfig, Mode, Payload, RuntimeOptions
from stateful.nodehost import NodeHost
from stateful.replica_main import READY

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


class ReplicaHandle(Protocol):
    """A launched replica process, wherever it runs."""

    node: str
    address: str
    """``host:port`` it listens on."""

    async def wait(self) -> int:
        """Return the exit status once the process ended (the failure watch)."""
        ...

    def kill(self) -> None:
        """SIGKILL it now (fencing before a promotion); no-op if it already ended."""
        ...

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop gracefully (SIGTERM), then kill after ``timeout_s``."""
        ...


class ReplicaLauncher(Protocol):
    """Starts blank replica processes; the agent implements this for its server."""

    async def launch(self, node: str, server: str | None = None) -> ReplicaHandle:
        """Start ``python -m stateful.replica_main --node NODE`` and return once it listens.

        ``server`` is where to run it (None: the launcher chooses). Whoever places replicas
        (the controller) must keep a stateful operator's primary and backup on different
        servers — different sites where site independence is on.
        """
        ...


@dataclass
class SubprocessHandle:
    node: str
    address: str
    process: asyncio.subprocess.Process

    async def wait(self) -> int:
        return await self.process.wait()

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                self.kill()
                await self.process.wait()
        await self._close_pipe()

    async def _close_pipe(self) -> None:
        """Read the stdout pipe to its end, so its transport closes while the loop runs.

        The exit status can arrive before the pipe's end of file: a graph stopped right then
        left the subprocess transport to the garbage collector, after the loop had closed.
        """
        if self.process.stdout is None:
            return
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(self.process.stdout.read(), 2.0)
        await asyncio.sleep(0)  # the transport's close runs in the next loop turn


async def _reap(process: asyncio.subprocess.Process) -> None:
    """Kill a replica that never became ready, and close its pipe while the loop runs.

    Waiting for the exit status alone leaves the stdout pipe's transport open; the garbage
    collector then closed it after the event loop had (pytest's unraisable-exception warning).
    """
    handle = SubprocessHandle(node="", address="", process=process)
    handle.kill()
    await handle.stop()


@dataclass
class SubprocessLauncher:
    """Replica processes on this machine; logs go to ``run_dir/<node>.log``."""

    run_dir: Path
    observe_dir: Path | None = None
    ready_timeout_s: float = 60.0
    log_level: str = "WARNING"
    python: str = sys.executable

    async def launch(self, node: str, server: str | None = None) -> SubprocessHandle:
        """Start a local process (``server`` is ignored: everything runs on this machine)."""
        args = [self.python, "-m", "stateful.replica_main", "--node", node,
                "--log-level", self.log_level]
        if self.observe_dir is not None:
            args += ["--observe-dir", str(self.observe_dir)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / f"{node}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
                start_new_session=True)
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), self.ready_timeout_s)
        except TimeoutError:
            line = b""
        except asyncio.CancelledError:
            # The graph stopped while this standby started: do not leave it behind (it runs
            # in its own session, so nothing else would stop it).
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(_reap(process), 5.0)
            raise
        word, _, address = line.decode().strip().partition(" ")
        if word != READY or not address:
            await _reap(process)
            raise LaunchError(f"replica {node} did not become ready (see "
                              f"{self.run_dir / (node + '.log')})")
        return SubprocessHandle(node=node, address=address, process=process)


@dataclass
class _Waiter:
    count: int
    future: asyncio.Future[None]


@dataclass
class LocalGraph:
    graph: GraphSpec
    options: RuntimeOptions
    launcher: ReplicaLauncher | None = None
    run_dir: Path | None = None
    spares: int = 1
    round_timeout_s: float = 2.0
    host: str = "127.0.0.1"
    """Address the manager and frontend listen on; replicas elsewhere must reach it."""
    recoveries: list[RecoveryDone] = field(default_factory=list)
    kill_times: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"understudy-{self.graph.name}-"))
        self.observe_dir = self.run_dir / "observe" if self.options.observe else None
        if self.launcher is None:
            self.launcher = SubprocessLauncher(self.run_dir, self.observe_dir)
        self.coordinator = Coordinator(clock=time.monotonic, round_timeout_s=self.round_timeout_s)
        self.frontend = FrontendNode()
        self.node_host = NodeHost(self.host, outcome=self._outcome)
        if self.options.link_mbps:
            self.node_host.transport.link_bps = self.options.link_mbps * 1e6
        self.node_host.add(MANAGER, self.coordinator)
        self.node_host.add(FRONTEND, self.frontend)
        self.handles: dict[str, ReplicaHandle] = {}
        self.replies: dict[int, asyncio.Future[Mapping[str, Payload]]] = {}
        self.local_events: list[BaseModel] = []
        """Observations of this process (frontend submits and replies)."""
        self._spare_ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiters: list[_Waiter] = []
        self._stopping = False
        self._early_deaths: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        address = await self.node_host.start()
        config = initial_config(self.graph, self.options)
        spare_names = [self._spare_name() for _ in range(self.spares)]
        handles = await asyncio.gather(*(self._launch(n) for n in [*config.nodes, *spare_names]))
        addresses = {h.node: h.address for h in handles}
        addresses[MANAGER] = addresses[FRONTEND] = address
        self.node_host.learn(addresses)
        config = config.evolve(addresses=addresses)
        self._apply(MANAGER, self.coordinator.deploy(config, spare_names))
        for node in self._early_deaths:  # died before there was a config to fail them in
            self.on_replica_failed(None, node)
        await self._until(lambda: self.frontend.config is not None, 30.0)

    async def __aenter__(self) -> LocalGraph:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.gather(*(h.stop() for h in self.handles.values()),
                             return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        # Cancelled launches reap their processes; let them, so no subprocess transport is
        # left for the garbage collector after the loop closes.
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=5.0)
        await self.node_host.close()

    # -- client API --------------------------------------------------------------------------

    def submit_nowait(self, request: ClientRequest) -> asyncio.Future[Mapping[str, Payload]]:
        """Send a request into the graph; the future resolves with the reply's outputs."""
        return self.submit_many_nowait([request])[0]

    def submit_many_nowait(
            self, requests: list[ClientRequest]) -> list[asyncio.Future[Mapping[str, Payload]]]:
        """Send requests together (one message per entry operator); a future per request."""
        if self._stopping:
            raise ReplicaUnavailableError("the graph is stopping")
        rids, effects = self.frontend.submit_many(requests)
        loop = asyncio.get_running_loop()
        futures = []
        for rid in rids:
            future: asyncio.Future[Mapping[str, Payload]] = loop.create_future()
            self.replies[rid] = future
            futures.append(future)
        self._apply(FRONTEND, effects)
        return futures

    async def submit(self, request: ClientRequest,
                     timeout_s: float = 30.0) -> Mapping[str, Payload]:
        return await asyncio.wait_for(self.submit_nowait(request), timeout_s)

    async def set_batch_size(self, batch_size: int, timeout_s: float = 10.0) -> None:
        """Reconfigure the running graph to another batch size (no restart)."""
        graph = GraphSpec.model_validate({**self.graph.model_dump(), "batch_size": batch_size})
        self._apply(MANAGER, self.coordinator.reconfigure(graph))
        self.graph = graph
        await self._until(lambda: self.frontend.config is not None
                          and self.frontend.config.graph.batch_size == batch_size, timeout_s)

    # -- failures ----------------------------------------------------------------------------

    def on_replica_failed(self, operator: str | None, replica: str) -> None:
        """The failure signal: a replica process (or its server) is gone."""
        self._apply(MANAGER, self.coordinator.on_replica_failed(operator, replica))

    def on_replicas_failed(self, replicas: list[tuple[str | None, str]]) -> None:
        """Replicas that failed together (a server): one recovery for all of them."""
        self._apply(MANAGER, self.coordinator.on_replicas_failed(replicas))

    def kill(self, node: str) -> float:
        """SIGKILL a replica process (a crash, for tests and the benchmark)."""
        self.kill_times[node] = time.monotonic()
        self.handles[node].kill()
        return self.kill_times[node]

    def node_of(self, op: str, role: str) -> str | None:
        config = self.coordinator.config
        if config is None:
            return None
        where = config.placements[op]
        return where.primary if role in ("primary", "stateless") else where.backup

    async def wait_recoveries(self, count: int, timeout_s: float = 30.0) -> None:
        """Until ``count`` recoveries finished in total."""
        if len(self.recoveries) >= count:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(count, future))
        await asyncio.wait_for(future, timeout_s)

    async def wait_replicated(self, timeout_s: float = 30.0, standbys: int = 0) -> None:
        """Wait until the graph is fully replicated again.

        That is: no recovery runs, every placed replica is a live process, every stateful
        operator's backup has applied a state, and at least ``standbys`` blank standbys wait in
        the pool.
        """
        await self._until(lambda: self._replicated() and len(self.coordinator.spares) >= standbys,
                          timeout_s)

    def replicated(self) -> bool:
        """Whether the graph is fully replicated now (see :meth:`wait_replicated`)."""
        return self._replicated()

    def _replicated(self) -> bool:
        config = self.coordinator.config
        if config is None or self.coordinator.busy:
            return False
        stateful = self.graph.topology.stateful
        for op, where in config.placements.items():
            replicated = op in stateful and self.options.mode is not Mode.BARE
            wanted = [where.primary] + ([where.backup] if replicated else [])
            if any(n is None or n in self.coordinator.dead for n in wanted):
                return False
            if replicated and self.coordinator.synced.get(op) != (where.backup, where.epoch):
                return False  # the backup has not applied its first state yet
        return True

    def report(self) -> ConsistencyReport:
        """Verify every observation (this process's and the replicas' files)."""
        checker = ConsistencyChecker(self.graph.topology.stateful)
        if self.observe_dir is not None and self.observe_dir.exists():
            checker.record_all(read_observations(sorted(self.observe_dir.glob("*.jsonl"))))
        checker.record_all(self.local_events)
        return checker.verify()

    # -- machinery ---------------------------------------------------------------------------

    @property
    def config(self) -> GraphConfig | None:
        return self.coordinator.config

    def _spare_name(self) -> str:
        return f"spare.{next(self._spare_ids)}"

    async def _launch(self, node: str) -> ReplicaHandle:
        assert self.launcher is not None
        handle = await self.launcher.launch(node)
        if self._stopping:
            # Started while stop() was stopping the others (it took their list before this).
            await handle.stop()
            raise LaunchError(f"replica {node} started while the graph stopped")
        self.handles[node] = handle
        self._spawn(self._watch(handle))
        return handle

    async def _watch(self, handle: ReplicaHandle) -> None:
        status = await handle.wait()
        if not self._stopping:
            logger.warning("replica %s exited with status %s", handle.node, status)
            if self.config is None:
                self._early_deaths.append(handle.node)
                return
            role = self.config.roles.get(handle.node) if self.config else None
            self.on_replica_failed(role[0] if role else None, handle.node)

    async def _launch_spare(self) -> None:
        node = self._spare_name()
        try:
            handle = await self._launch(node)
        except LaunchError:
            logger.exception("could not start standby %s", node)
            return
        self.node_host.learn({node: handle.address})
        self._apply(MANAGER, self.coordinator.on_spare_ready(node, handle.address))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _apply(self, name: str, effects: list[Effect]) -> None:
        self.node_host.apply(name, effects)

    def _outcome(self, node: str, effect: Effect) -> None:
        if isinstance(effect, Reply):
            future = self.replies.pop(effect.request_id, None)
            if future is not None and not future.done():
                future.set_result(effect.outputs)
        elif isinstance(effect, Observe):
            self.local_events.append(effect.event)
        elif isinstance(effect, Kill):
            handle = self.handles.get(effect.node)
            if handle is not None:
                handle.kill()
        elif isinstance(effect, LaunchSpare):
            for _ in range(effect.count):
                self._spawn(self._launch_spare())
        elif isinstance(effect, RecoveryDone):
            self.recoveries.append(effect)
            for waiter in [w for w in self._waiters if len(self.recoveries) >= w.count]:
                self._waiters.remove(waiter)
                if not waiter.future.done():
                    waiter.future.set_result(None)

    async def _until(self, condition: Callable[[], bool], timeout_s: float) -> None:
        """Wait for a condition the event loop makes true (polled at 5 ms, hard timeout)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout_s} s")
            await asyncio.sleep(0.005)
