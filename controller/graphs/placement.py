"""Where a service graph's replica processes run: pure functions of the live servers.

The rule that matters (HAMS §III-A, DESIGN.md "Stateful models"): a stateful operator's primary
and backup never share a server, and sit in different sites whenever the live servers span more
than one, so one server (or site) failure never takes both. A replica only goes where its
demand (``ReplicaDemand``: memory, compute) fits what the server has left after the apps placed
there and the replicas it runs already; among those, to the server with the most free memory
(worst-fit, as primaries are placed), then the fewest replicas (of every graph), ties broken by
server id so a placement is reproducible. Hot standbys (spares) are spread the same way, so a
promotion's new backup can be taken from a server other than the new primary's
(:func:`spare_rank` is the coordinator's preference when it takes one).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass


class PlacementError(ValueError):
    """The live servers cannot host the graph under the placement rule."""


@dataclass(frozen=True)
class Host:
    """A live server that can run replicas."""

    server_id: str
    site_id: str
    replicas: int = 0
    """Replicas (of any graph) it runs already."""
    free_memory_mb: float = math.inf
    """Memory left after the apps placed there and the replicas it runs (inf: not known)."""
    free_compute: float = math.inf
    """Compute share left likewise."""


@dataclass(frozen=True)
class ReplicaDemand:
    """What one replica process of a graph needs on its server."""

    memory_mb: float = 0.0
    compute: float = 0.0


@dataclass(frozen=True)
class OperatorSlots:
    """The replica nodes of one operator in a fresh deployment (``initial_config``)."""

    operator: str
    primary: str
    backup: str | None = None


class _Room:
    """What each host has left while a placement is being made."""

    def __init__(self, hosts: Sequence[Host], demand: ReplicaDemand) -> None:
        self.demand = demand
        self.load: Counter[str] = Counter({h.server_id: h.replicas for h in hosts})
        self.memory = {h.server_id: h.free_memory_mb for h in hosts}
        self.compute = {h.server_id: h.free_compute for h in hosts}

    def fits(self, host: Host) -> bool:
        return (self.demand.memory_mb <= self.memory[host.server_id]
                and self.demand.compute <= self.compute[host.server_id])

    def key(self, host: Host) -> tuple[float, int, str]:
        return (-self.memory[host.server_id], self.load[host.server_id], host.server_id)

    def take(self, host: Host) -> str:
        self.load[host.server_id] += 1
        self.memory[host.server_id] -= self.demand.memory_mb
        self.compute[host.server_id] -= self.demand.compute
        return host.server_id


def _no_room(hosts: Sequence[Host], demand: ReplicaDemand) -> PlacementError:
    left = ", ".join(f"{h.server_id}: {h.free_memory_mb:g} MB, {h.free_compute:g} compute"
                     for h in hosts)
    return PlacementError(f"no live server has room for a replica ({demand.memory_mb:g} MB, "
                          f"{demand.compute:g} compute); left: {left}")


def _pick(hosts: Sequence[Host], room: _Room, avoid: Host | None = None) -> Host:
    """The fitting host with the most free memory, then the fewest replicas.

    With ``avoid``: on another site if any fits, else on another server.
    """
    fitting = [h for h in hosts if room.fits(h)]
    if not fitting:
        raise _no_room(hosts, room.demand)
    candidates = fitting
    if avoid is not None:
        other_site = [h for h in fitting if h.site_id != avoid.site_id]
        other_server = [h for h in fitting if h.server_id != avoid.server_id]
        candidates = other_site or other_server
        if not candidates:
            raise PlacementError(
                f"a primary and its backup need two live servers with room; only "
                f"{avoid.server_id} has it" if len(hosts) > 1 else
                f"a primary and its backup need two live servers; only {avoid.server_id} is up")
    return min(candidates, key=room.key)


def place_graph(slots: Iterable[OperatorSlots], spares: Sequence[str],
                hosts: Sequence[Host], demand: ReplicaDemand = ReplicaDemand()) -> dict[str, str]:
    """Node -> server id for a new deployment (stateful pairs first, then the rest, spares last).

    Raises :class:`PlacementError` when there is no live server, a replica fits on none, or a
    primary/backup pair would have to share one.
    """
    if not hosts:
        raise PlacementError("no live server to run the graph's replicas on")
    by_id = {h.server_id: h for h in hosts}
    room = _Room(hosts, demand)
    where: dict[str, str] = {}
    ordered = sorted(slots, key=lambda s: (s.backup is None, s.operator))
    for slot in ordered:
        primary = room.take(_pick(hosts, room))
        where[slot.primary] = primary
        if slot.backup is not None:
            where[slot.backup] = room.take(_pick(hosts, room, avoid=by_id[primary]))
    for spare in spares:
        where[spare] = room.take(_pick(hosts, room))
    return where


def place_spare(hosts: Sequence[Host], spares_on: Mapping[str, int],
                needed_away_from: Collection[str] = (),
                demand: ReplicaDemand = ReplicaDemand()) -> str:
    """Server for one more standby (or a replacement), among the live servers it fits.

    The one with the fewest standbys, then replicas, then the most free memory.

    Servers in ``needed_away_from`` (those of primaries waiting for a backup) come last: a
    standby there could not become their backup.
    """
    if not hosts:
        raise PlacementError("no live server to start a standby on")
    room = _Room(hosts, demand)
    fitting = [h for h in hosts if room.fits(h)]
    if not fitting:
        raise _no_room(hosts, demand)
    return min(fitting, key=lambda h: (h.server_id in needed_away_from,
                                       spares_on.get(h.server_id, 0), h.replicas,
                                       -h.free_memory_mb, h.server_id)).server_id


def spare_rank(candidate_server: str | None, partner_server: str | None,
               site_of: Mapping[str, str], live_servers: Collection[str]) -> int | None:
    """How well a standby on ``candidate_server`` pairs with a replica on ``partner_server``.

    0: another site (or no partner); 1: same site, another server; None (never): the same
    server while another server is live — the coordinator then asks for another standby
    instead. With a single live server left, 2: a same-server backup still covers a crash.
    """
    if partner_server is None:
        return 0
    if candidate_server is None or candidate_server == partner_server:
        others = set(live_servers) - {partner_server}
        return 2 if not others and candidate_server is not None else None
    if site_of.get(candidate_server) != site_of.get(partner_server):
        return 0
    return 1
