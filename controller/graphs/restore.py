"""Rebuilding a live graph after a controller restart: what the agents run, what to adopt.

The agents keep their replica processes across a controller restart and list them in their
hello (``Hello.replicas``). :class:`Inventories` keeps those lists (minus the exits reported
since); :func:`plan_adoption` — a pure function of the graph's stored record and the replicas
that run — decides what the new incarnation of the manager adopts, which role holders failed
while no controller watched (their backups are promoted by the recovery that follows), which
standbys stay in the pool and which processes are stopped (``controller/graphs/runtime.py``
carries it out).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from controller.graphs.records import GraphRecord
from stateful.messages import GraphConfig
from understudy.wire.protocol import ReplicaInfo

logger = logging.getLogger(__name__)

_SPARE = re.compile(r"^spare\.(\d+)$")


@dataclass(frozen=True)
class Running:
    """A replica process an agent runs."""

    server_id: str
    address: str


@dataclass(frozen=True)
class Adoption:
    """What a restarted controller does with one graph's replicas."""

    config: GraphConfig
    """The newest config the previous manager sent."""
    adopt: dict[str, Running]
    """Replicas the new manager takes over (role holders and standbys)."""
    failed: list[tuple[str | None, str]]
    """(operator, node): role holders that are gone or were declared failed; one recovery."""
    spares: list[str]
    """Standbys that stay in the pool."""
    stop: list[tuple[str, str]]
    """(server, node): processes of this graph no one counts on (killed)."""
    next_spare: int
    """First standby number never used (node ids are never reused)."""
    missing_spares: int = 0
    """Standbys the pool lost while no controller watched (started again)."""


def plan_adoption(record: GraphRecord, running: Mapping[str, Running]) -> Adoption:
    """Adopt what the record knows and still runs; fail the role holders that do not run.

    A role holder the previous manager declared failed is failed again even if it runs (it was
    fenced, or was about to be): it is adopted only so the fence reaches it.
    """
    if record.config is None:
        raise ValueError(f"graph {record.name!r} has no stored config to restore")
    config = GraphConfig.model_validate(record.config)
    roles = config.roles
    dead = set(record.dead)
    spares = [n for n in record.spares if n in running and n not in dead and n not in roles]
    adopt = {n: r for n, r in running.items() if n in roles or n in spares}
    failed: list[tuple[str | None, str]] = [(roles[n][0], n) for n in sorted(roles)
                                            if n not in running or n in dead]
    stop = sorted((r.server_id, n) for n, r in running.items() if n not in adopt)
    known = set(roles) | set(record.spares) | dead | {r.node for r in record.replicas} | \
        set(running)
    numbers = [int(m.group(1)) for n in known if (m := _SPARE.match(n))]
    wanted = record.registration.spares
    return Adoption(config=config, adopt=adopt, failed=failed, spares=spares, stop=stop,
                    next_spare=max(numbers, default=-1) + 1,
                    missing_spares=max(0, wanted - len(spares)))


@dataclass
class Inventories:
    """The replica processes each connected agent runs, from its hello and its exit reports."""

    by_server: dict[str, dict[tuple[str, str], ReplicaInfo]] = field(default_factory=dict)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def hello(self, server_id: str, replicas: Collection[ReplicaInfo]) -> None:
        """An agent (re)connected and listed what it runs."""
        self.by_server[server_id] = {(r.graph, r.node): r for r in replicas}
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def exited(self, server_id: str, graph: str, node: str) -> None:
        """An agent reported a replica's exit."""
        self.by_server.get(server_id, {}).pop((graph, node), None)

    def forget(self, server_id: str) -> None:
        """The server failed: nothing there runs any more (as far as we count on it)."""
        self.by_server.pop(server_id, None)

    def running(self, graph: str) -> dict[str, Running]:
        """Node -> where it runs, for one graph."""
        return {node: Running(server, info.address)
                for server, replicas in self.by_server.items()
                for (g, node), info in replicas.items() if g == graph}

    async def wait_for(self, servers: Collection[str], timeout_s: float) -> set[str]:
        """Until every one of ``servers`` said hello, or ``timeout_s``; the ones that did not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while missing := set(servers) - set(self.by_server):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return missing
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return set(servers) - set(self.by_server)
        return set()
