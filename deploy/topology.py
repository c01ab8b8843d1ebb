"""The testbed topology: which servers, in which sites, with what capacity, and which clients.

One description shared by the local testbed (``understudy testbed up``) and the container
topology (``docker-compose.yml``), so the two cannot drift apart silently (a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SERVERS = 6
DEFAULT_SITES = 3
DEFAULT_SERVER_MEMORY_MB = 2400.0
"""Per-server memory capacity of the testbed (model memory in MB, as the profiles count it)."""
DEFAULT_SERVER_COMPUTE = 100.0
"""Per-server compute capacity, in percent of one reference GPU."""


@dataclass(frozen=True)
class ServerSpec:
    """One testbed server: an agent with its own Triton."""

    server_id: str
    site_id: str
    memory_mb: float = DEFAULT_SERVER_MEMORY_MB
    compute: float = DEFAULT_SERVER_COMPUTE

    @property
    def capacity_arg(self) -> str:
        """The ``--capacity`` argument of ``understudy agent``."""
        return f"memory_mb={self.memory_mb:g},compute={self.compute:g}"


@dataclass(frozen=True)
class Topology:
    """Servers spread round-robin over sites; one load-generating client per app."""

    servers: tuple[ServerSpec, ...]
    sites: tuple[str, ...]
    apps: int = 12
    critical_fraction: float = 0.5
    headroom: float = 0.2
    families: tuple[str, ...] = field(default=("mobilenet_v3", "shufflenet_v2", "convnext",
                                               "efficientnet", "regnet_y"))

    @property
    def server_ids(self) -> list[str]:
        """Server ids in order."""
        return [s.server_id for s in self.servers]

    def site_of(self, server_id: str) -> str:
        """The site holding ``server_id``."""
        return next(s.site_id for s in self.servers if s.server_id == server_id)


def make_topology(servers: int = DEFAULT_SERVERS, sites: int = DEFAULT_SITES, apps: int = 12,
                  critical_fraction: float = 0.5, headroom: float = 0.2,
                  memory_mb: float = DEFAULT_SERVER_MEMORY_MB,
                  compute: float = DEFAULT_SERVER_COMPUTE) -> Topology:
    """``servers`` servers named ``s1..sN`` over ``sites`` sites ``site-1..site-M``."""
    if servers < 1 or sites < 1 or sites > servers:
        raise ValueError("need at least one server, at least one site, and no more sites "
                         "than servers")
    site_ids = tuple(f"site-{i + 1}" for i in range(sites))
    specs = tuple(ServerSpec(f"s{i + 1}", site_ids[i % sites], memory_mb, compute)
                  for i in range(servers))
    return Topology(servers=specs, sites=site_ids, apps=apps,
                    critical_fraction=critical_fraction, headroom=headroom)
