"""The testbed topology: which servers, in which sites, with what capacity, and which clients.

One description shared by the local testbed (``understudy testbed up``) and the container
topology (``docker-compose.yml``), so the two cannot drift apart silently (a test checks it).
Server capacity is not chosen here: ``deploy.workload`` sizes it for the generated apps
(``Workload.sized``), as the FailLite generator does for a given headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DEFAULT_SERVERS = 6
DEFAULT_SITES = 3


@dataclass(frozen=True)
class ServerSpec:
    """One testbed server: an agent with its own Triton."""

    server_id: str
    site_id: str
    memory_mb: float | None = None
    """Model memory in MB, as the profiles count it; None until sized (``deploy.workload``)."""
    compute: float | None = None
    """Compute in percent of one reference GPU; None until sized."""

    @property
    def capacity(self) -> dict[str, float]:
        """``{"memory_mb": ..., "compute": ...}``; ValueError for a server not sized yet."""
        if self.memory_mb is None or self.compute is None:
            raise ValueError(f"server {self.server_id} has no capacity yet; size the topology "
                             "with deploy.workload.generate_workload(...).sized(topology)")
        return {"memory_mb": self.memory_mb, "compute": self.compute}

    @property
    def capacity_arg(self) -> str:
        """The ``--capacity`` argument of ``understudy agent``."""
        return capacity_arg(self.capacity)


def capacity_arg(capacity: dict[str, float]) -> str:
    """The ``--capacity`` argument for ``capacity``: ``memory_mb=787.7,compute=8.7713955``.

    Exact (``repr``) figures, so an agent gets the capacity the generator sized, not a rounding.
    """
    return ",".join(f"{key}={float(value)!r}" for key, value in capacity.items())


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
                  families: tuple[str, ...] | None = None) -> Topology:
    """``servers`` servers named ``s1..sN`` over ``sites`` sites ``site-1..site-M`` (not sized).

    ``families``: the model families the apps are drawn from (default: ``Topology``'s).
    """
    if servers < 1 or sites < 1 or sites > servers:
        raise ValueError("need at least one server, at least one site, and no more sites "
                         "than servers")
    site_ids = tuple(f"site-{i + 1}" for i in range(sites))
    specs = tuple(ServerSpec(f"s{i + 1}", site_ids[i % sites]) for i in range(servers))
    topology = Topology(servers=specs, sites=site_ids, apps=apps,
                        critical_fraction=critical_fraction, headroom=headroom)
    return topology if families is None else replace(topology, families=families)
