"""Which servers may run graph replicas now, and the server of each replica as it starts.

The placement rules are pure functions (``controller.graphs.placement``); this is what feeds
them: the servers whose record is up and whose agent is connected and watched by the detector
(a server the detector failed, even on a false alarm, gets nothing new), each with the replicas
every live graph runs there and the capacity left after the apps (the orchestrator's snapshot,
through ``free_of``) and those replicas. :meth:`GraphHosts.choose` is the launcher's callback:
the initial plan for a graph's first replicas, the spread rule for standbys and retries.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping

from controller.agents import AgentHub
from controller.graphs.live import LiveGraph, replica_demand
from controller.graphs.placement import Host, place_spare, spare_rank
from controller.records import ServerState
from controller.store import Store
from policies.resources import COMPUTE, MEMORY_MB


class GraphHosts:
    """The cluster as graph placement sees it, over the manager's live graphs."""

    def __init__(self, store: Store, agents: AgentHub, live: Mapping[str, LiveGraph]) -> None:
        self.store = store
        self.agents = agents
        self.live = live
        """The manager's live graphs (shared, not copied): their replicas take room."""
        self.sites: dict[str, str] = {}
        self.usable: set[str] = set()
        """Servers whose record is up (not drained); liveness is asked of the detector."""
        self.free_of: Callable[[], Awaitable[Mapping[str, Mapping[str, float]]]] | None = None
        """Each live server's capacity left after the apps placed there (set by the service)."""
        self._free: dict[str, Mapping[str, float]] = {}

    def hello(self, server_id: str, site_id: str) -> None:
        """An agent (re)connected."""
        self.sites[server_id] = site_id
        self.usable.add(server_id)

    async def refresh_free(self) -> None:
        """Ask the service for the capacity the apps leave on each server."""
        if self.free_of is not None:
            self._free = {s: dict(r) for s, r in (await self.free_of()).items()}

    async def refresh(self) -> list[Host]:
        """Re-read the servers (and their capacity), then :meth:`hosts`."""
        await self.refresh_free()
        servers = await self.store.servers()
        self.sites.update({s.server_id: s.site_id for s in servers.values()})
        self.usable = {s.server_id for s in servers.values() if s.state is ServerState.UP}
        return self.hosts()

    def hosts(self) -> list[Host]:
        """The servers a replica may go to now, with what each has left."""
        load: dict[str, int] = {}
        memory: dict[str, float] = {}
        compute: dict[str, float] = {}
        for live in self.live.values():
            demand = replica_demand(live.record.registration)
            for handle in live.launcher.handles.values():
                if not handle.exited.done():
                    server = handle.server_id
                    load[server] = load.get(server, 0) + 1
                    memory[server] = memory.get(server, 0.0) + demand.memory_mb
                    compute[server] = compute.get(server, 0.0) + demand.compute
        # Fresh every time: a server the detector failed (even a false alarm) gets nothing new.
        up = [s for s in self.usable
              if self.agents.connected(s) and self.agents.detector.watching(s)]
        free = {s: self._free.get(s, {}) for s in up}
        return [Host(s, self.sites.get(s, s), load.get(s, 0),
                     free[s].get(MEMORY_MB, math.inf) - memory.get(s, 0.0),
                     free[s].get(COMPUTE, math.inf) - compute.get(s, 0.0)) for s in sorted(up)]

    def choose(self, live: LiveGraph, node: str, avoid: set[str]) -> str:
        """Server for a replica: the plan for the initial ones, the spread for standbys."""
        planned = live.plan.get(node)
        if planned is not None and planned not in avoid:
            return planned
        # A retry (its server failed during the start) or a standby: never next to the
        # operator's other replica.
        partner = live.launcher.server_of(live.partners.get(node))
        hosts = [h for h in self.hosts() if h.server_id not in avoid | {partner}]
        spares_on: dict[str, int] = {}
        for other in self.live.values():
            for spare in other.graph.coordinator.spares:
                server = other.launcher.server_of(spare)
                if server is not None:
                    spares_on[server] = spares_on.get(server, 0) + 1
            for starting, (server, _) in other.launcher.starting.items():
                if starting not in other.plan:
                    spares_on[server] = spares_on.get(server, 0) + 1
        return place_spare(hosts, spares_on, waiting_for_backup(live),
                           replica_demand(live.record.registration))

    def spare_rank(self, live: LiveGraph, candidate: str, partner: str | None) -> int | None:
        """The coordinator's preference among standbys for a new backup of ``partner``."""
        launcher = live.launcher
        return spare_rank(launcher.server_of(candidate), launcher.server_of(partner),
                          self.sites, [h.server_id for h in self.hosts()])


def waiting_for_backup(live: LiveGraph) -> set[str]:
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
