"""Replica processes of a service graph on the agents: ``stateful.runtime.ReplicaLauncher``.

``AgentReplicaLauncher.launch(node)`` sends ``start_replica`` to the agent of the server the
graph manager chose and returns an :class:`AgentReplicaHandle` once the agent answered with the
replica's address. The handle's ``wait()`` — the death watch ``LocalGraph`` keeps on every
replica — returns when the agent reports the process's exit or the controller declares its
server failed (:meth:`AgentReplicaLauncher.fail_server`); ``kill()`` fences it through the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.agents import AgentHub
from controller.errors import AgentCommandError, AgentUnavailableError
from controller.graphs.placement import PlacementError
from stateful.errors import LaunchError
from understudy.wire.protocol import StartReplicaCommand, StopReplicaCommand

logger = logging.getLogger(__name__)

LAUNCH_TRIES = 5
"""Starts tried for one replica before giving up."""
RETRY_DELAY_S = 0.5
"""Pause before a retry: a server failed by a false alarm is usually taken back by then."""
SERVER_GONE = -1
"""Exit status given to the handles of replicas on a server declared failed."""


class _ServerFailed(LaunchError):
    """The start was abandoned: its server was declared failed meanwhile."""


@dataclass
class AgentReplicaHandle:
    """A replica process on an agent (``stateful.runtime.ReplicaHandle``)."""

    node: str
    address: str
    server_id: str
    launcher: AgentReplicaLauncher = field(repr=False)
    exited: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future(), repr=False)
    killed: bool = False

    async def wait(self) -> int:
        """The exit status, once the agent reported the exit or the server failed."""
        return await asyncio.shield(self.exited)

    def mark_exited(self, code: int) -> None:
        """The death watch fires (idempotent)."""
        if not self.exited.done():
            self.exited.set_result(code)

    def kill(self) -> None:
        """Fence it: ask its agent for a SIGKILL.

        Sent even when the handle already ended: a server declared failed may be alive after
        all (a false alarm), and its replica must not keep serving an old role.
        """
        if not self.killed:
            self.killed = True
            self.launcher.spawn(self.launcher.stop(self, kill=True))

    async def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM through the agent, SIGKILL after ``timeout_s``."""
        await self.launcher.stop(self, timeout_s=timeout_s)


class AgentReplicaLauncher:
    """``stateful.runtime.ReplicaLauncher`` over the agents, for one graph."""

    def __init__(self, graph: str, agents: AgentHub, choose: Callable[[str, set[str]], str],
                 observe_dir: Path | None = None, ready_timeout_s: float = 120.0) -> None:
        self.graph = graph
        self.agents = agents
        self.choose = choose
        """``(node, servers to avoid) -> server``; raises ``PlacementError``."""
        self.observe_dir = observe_dir
        self.ready_timeout_s = ready_timeout_s
        self.handles: dict[str, AgentReplicaHandle] = {}
        self.starting: dict[str, tuple[str, asyncio.Task[Any]]] = {}
        self.closed = False
        """The graph is stopping: no new starts; a start that completes anyway is undone."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def server_of(self, node: str | None) -> str | None:
        """Where a replica runs (or is being started)."""
        if node is None:
            return None
        handle = self.handles.get(node)
        if handle is not None:
            return handle.server_id
        starting = self.starting.get(node)
        return starting[0] if starting else None

    async def launch(self, node: str, server: str | None = None) -> AgentReplicaHandle:
        """Start ``node`` on ``server`` (None: where the manager places it, retrying).

        A start abandoned because its server was declared failed is retried after a pause on
        whatever server is then live (the same one after a false alarm); a server that refused
        the start is avoided.
        """
        refused: set[str] = set()
        last: Exception | None = None
        for attempt in range(LAUNCH_TRIES if server is None else 1):
            if attempt:
                await asyncio.sleep(RETRY_DELAY_S * attempt)
            if self.closed:
                raise LaunchError(f"replica {node}: the graph is stopping")
            try:
                target = server or self.choose(node, refused)
            except PlacementError as exc:
                last = LaunchError(f"replica {node}: {exc}")
                continue
            try:
                return await self._launch_on(node, target)
            except _ServerFailed as exc:
                logger.warning("graph %s: %s", self.graph, exc)
                last = exc
            except LaunchError as exc:
                logger.warning("graph %s: %s", self.graph, exc)
                refused.add(target)
                last = exc
        raise LaunchError(f"replica {node} did not start: {last}")

    async def _launch_on(self, node: str, server_id: str) -> AgentReplicaHandle:
        command = StartReplicaCommand(
            command_id=self.agents.next_id(), graph=self.graph, node=node,
            observe_dir=str(self.observe_dir) if self.observe_dir else None,
            ready_timeout_s=self.ready_timeout_s)
        task = asyncio.ensure_future(self.agents.command(server_id, command,  # type: ignore[arg-type]
                                                         timeout_s=self.ready_timeout_s + 30))
        self.starting[node] = (server_id, task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            # The graph stopped (LocalGraph cancels its tasks): the agent may still start it.
            task.cancel()
            self.spawn(self._stop_on(node, server_id, kill=True))
            raise
        finally:
            self.starting.pop(node, None)
        if task.cancelled():
            # The agent may still start it (a false alarm): make sure it does not linger.
            self.spawn(self._stop_on(node, server_id, kill=True))
            raise _ServerFailed(f"replica {node}: server {server_id} failed during the start")
        try:
            result = task.result()
        except (AgentUnavailableError, AgentCommandError) as exc:
            raise LaunchError(f"replica {node} on {server_id}: {exc}") from exc
        if result.replica is None:
            raise LaunchError(f"replica {node} on {server_id}: the agent sent no address")
        handle = AgentReplicaHandle(node, result.replica.address, server_id, self)
        if self.closed:
            self.spawn(self._stop_on(node, server_id, kill=True))
            raise LaunchError(f"replica {node}: the graph stopped while it started")
        self.handles[node] = handle
        logger.info("graph %s: replica %s runs on %s at %s", self.graph, node, server_id,
                    handle.address)
        return handle

    async def stop(self, handle: AgentReplicaHandle, kill: bool = False,
                   timeout_s: float = 5.0) -> None:
        """Stop (or kill) a replica through its agent; a gone agent took it along."""
        if handle.exited.done() and not kill:
            return
        await self._stop_on(handle.node, handle.server_id, kill, timeout_s)
        handle.mark_exited(-9 if kill else -15)

    async def _stop_on(self, node: str, server_id: str, kill: bool = True,
                       timeout_s: float = 5.0) -> None:
        command = StopReplicaCommand(command_id=self.agents.next_id(), graph=self.graph,
                                     node=node, kill=kill, timeout_s=timeout_s)
        try:
            await self.agents.command(server_id, command,  # type: ignore[arg-type]
                                      timeout_s=timeout_s + 15)
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.info("graph %s: stopping %s on %s: %s", self.graph, node, server_id, exc)

    async def stop_node(self, node: str, server_id: str) -> None:
        """Kill a process of this graph that has no handle (not adopted after a restart)."""
        await self._stop_on(node, server_id, kill=True)

    def fail_server(self, server_id: str) -> list[str]:
        """The server failed: end every replica handle there, abandon starts on it."""
        failed = []
        for node, handle in self.handles.items():
            if handle.server_id == server_id and not handle.exited.done():
                handle.mark_exited(SERVER_GONE)
                failed.append(node)
        for target, task in list(self.starting.values()):
            if target == server_id:
                task.cancel()
        return failed

    async def settle(self, timeout_s: float = 20.0) -> None:
        """Wait for the stops and kills sent so far (a start undone while the graph stopped)."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    def spawn(self, coroutine: Any) -> None:
        """Run a fire-and-forget agent command (kill)."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


