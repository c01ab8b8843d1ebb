"""The controller's replica launcher over a fake agent hub: starts, death signals, retries, and
no replica left behind when a start is abandoned."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from controller.errors import AgentCommandError
from controller.graphs.launcher import SERVER_GONE, AgentReplicaLauncher
from controller.graphs.placement import PlacementError
from stateful.errors import LaunchError
from understudy.wire.protocol import (
    CommandResult,
    ReplicaInfo,
    StartReplicaCommand,
    StopReplicaCommand,
)


class FakeHub:
    """Answers start_replica with an address; ``hold`` servers never answer; ``refuse`` fail."""

    def __init__(self, hold: set[str] | None = None, refuse: set[str] | None = None) -> None:
        self.hold = hold or set()
        self.refuse = refuse or set()
        self.sent: list[tuple[str, Any]] = []
        self._ids = itertools.count(1)

    def next_id(self) -> str:
        return f"c{next(self._ids)}"

    async def command(self, server_id: str, command: Any, timeout_s: float = 0) -> CommandResult:
        self.sent.append((server_id, command))
        if server_id in self.hold:
            await asyncio.Event().wait()
        if server_id in self.refuse:
            raise AgentCommandError(f"{server_id}: start_replica failed", retryable=True)
        info = ReplicaInfo(graph=command.graph, node=command.node, address=f"{server_id}:1")
        return CommandResult(command_id=command.command_id, ok=True, command=command.type,
                             replica=info if isinstance(command, StartReplicaCommand) else None)


def launcher(hub: FakeHub, servers: list[str]) -> AgentReplicaLauncher:
    def choose(node: str, avoid: set[str]) -> str:
        left = [s for s in servers if s not in avoid]
        if not left:
            raise PlacementError("no live server")
        return left[0]

    return AgentReplicaLauncher("sp", hub, choose)  # type: ignore[arg-type]


def stops(hub: FakeHub) -> list[tuple[str, str, bool]]:
    return [(s, c.node, c.kill) for s, c in hub.sent if isinstance(c, StopReplicaCommand)]


def test_a_failed_server_ends_the_handles_there_and_kills_are_sent_anyway() -> None:
    async def scenario() -> None:
        hub = FakeHub()
        lau = launcher(hub, ["s1"])
        handle = await lau.launch("a.p0")
        assert (handle.server_id, handle.address) == ("s1", "s1:1")
        waiting = asyncio.ensure_future(handle.wait())
        assert lau.fail_server("s1") == ["a.p0"]
        assert await waiting == SERVER_GONE
        handle.kill()  # the coordinator fences it: a false alarm must not leave it running
        await asyncio.sleep(0)
        assert stops(hub) == [("s1", "a.p0", True)]

    asyncio.run(scenario())


def test_a_start_abandoned_by_a_server_failure_is_retried_and_undone() -> None:
    async def scenario() -> None:
        hub = FakeHub(hold={"s1"})
        servers = ["s1", "s2"]
        lau = launcher(hub, servers)
        start = asyncio.ensure_future(lau.launch("spare.0"))
        await asyncio.sleep(0.01)
        assert lau.server_of("spare.0") == "s1"
        servers.remove("s1")  # declared failed: no longer offered
        lau.fail_server("s1")
        handle = await start
        assert handle.server_id == "s2"
        assert ("s1", "spare.0", True) in stops(hub)  # in case s1 starts it after all

    asyncio.run(scenario())


def test_a_refusing_server_is_avoided_and_a_closed_launcher_starts_nothing() -> None:
    async def scenario() -> None:
        hub = FakeHub(refuse={"s1"})
        lau = launcher(hub, ["s1", "s2"])
        assert (await lau.launch("b.s0")).server_id == "s2"
        lau.closed = True
        with pytest.raises(LaunchError, match="stopping"):
            await lau.launch("c.s0")

    asyncio.run(scenario())
