"""Where an app's extra instances and parity models go (ParM's placement, as a pure function).

An app may be served by several *instances* of its variant (the gateway balances its queries
over them) and protected by *parity models* (``parity:k``: one per k instances; the gateway
codes k queries into one parity query for it). Both are placed like variants, with these rules:

- every instance on its own server: no two instances of the app share one;
- **independence**: a parity model never shares a server with any instance of the app (so the
  loss of one server costs at most one prediction of a coding group, which the parity model
  rebuilds), nor with another parity model of the app;
- the app's exclusion lists hold (``Application.may_back_up_on``), and the server must have the
  room: an instance or a parity model reserves what the deployed variant takes at the app's
  rate (a parity model has the deployed model's architecture, ParM §4.3);
- among the servers left, the one with the most free memory (worst fit, as primaries), then
  the smallest id; instances are placed before parity models, which then avoid them too.

Pure: a snapshot and a request in, placements out; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.errors import UnknownReferenceError
from policies.model import ClusterSnapshot, Placement, Role, Server
from policies.resources import MEMORY_MB, Resources


@dataclass(frozen=True, slots=True)
class ProtectionNeed:
    """What one app lacks: ``instances`` more instances and ``parity`` more parity models."""

    app_id: str
    variant: str
    """The deployed variant (its demand is what each instance and parity model reserves)."""
    instances: int = 0
    parity: int = 0
    parity_variant: str = ""
    instance_servers: frozenset[str] = frozenset()
    """Servers holding an instance of the app now (the serving replica's included)."""
    parity_servers: frozenset[str] = frozenset()
    """Servers holding a parity model of the app now."""


@dataclass(frozen=True, slots=True)
class ProtectionPlan:
    """The new placements (role INSTANCE or PARITY) and why any wanted one found no server."""

    placements: tuple[Placement, ...] = ()
    unplaced: tuple[str, ...] = ()


def independent(parity_server: str, instance_servers: frozenset[str] | set[str]) -> bool:
    """Whether a parity model on ``parity_server`` is independent of the app's instances."""
    return parity_server not in instance_servers


def place_protection(snapshot: ClusterSnapshot, need: ProtectionNeed) -> ProtectionPlan:
    """Servers for the instances and parity models ``need`` asks for (see the module doc)."""
    app = snapshot.app_by_id.get(need.app_id)
    if app is None:
        raise UnknownReferenceError(f"unknown app {need.app_id!r}")
    demand = snapshot.families[app.family].variant(need.variant).demand(app.max_rate_rps)
    free: dict[str, Resources] = dict(snapshot.free)
    instances = set(need.instance_servers)
    parity = set(need.parity_servers)
    placements: list[Placement] = []
    unplaced: list[str] = []

    def best(excluded: set[str]) -> Server | None:
        fits = [s for s in snapshot.live_servers()
                if s.server_id not in excluded and app.may_back_up_on(s)
                and demand.fits_within(free[s.server_id])]
        return min(fits, key=lambda s: (-free[s.server_id].get(MEMORY_MB, 0.0), s.server_id),
                   default=None)

    for role, count, variant in ((Role.INSTANCE, need.instances, need.variant),
                                 (Role.PARITY, need.parity, need.parity_variant)):
        for _ in range(count):
            server = best(instances | parity)
            if server is None:
                unplaced.append(f"no server with room for {variant} ({role.value}) apart from "
                                f"the app's instances and parity models")
                break
            free[server.server_id] = free[server.server_id] - demand
            (instances if role is Role.INSTANCE else parity).add(server.server_id)
            placements.append(Placement(need.app_id, server.server_id, variant, role))
    return ProtectionPlan(tuple(placements), tuple(unplaced))
