"""Where a service graph's replica processes run: pure functions of the live servers.

The rule that matters (HAMS §III-A, DESIGN.md "Stateful models"): a stateful operator's primary
and backup never share a server, and sit in different sites whenever the live servers span more
than one, so one server (or site) failure never takes both. Everything else is spreading: each
replica goes to the live server holding the fewest replicas (of every graph), ties broken by
server id so a placement is reproducible. Hot standbys (spares) are spread the same way, so a
promotion's new backup can be taken from a server other than the new primary's
(:func:`spare_rank` is the coordinator's preference when it takes one).
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class OperatorSlots:
    """The replica nodes of one operator in a fresh deployment (``initial_config``)."""

    operator: str
    primary: str
    backup: str | None = None


def _pick(hosts: Sequence[Host], load: Counter[str], avoid: Host | None = None) -> Host:
    """Least-loaded host; with ``avoid``, another site if any, else another server."""
    candidates = list(hosts)
    if avoid is not None:
        other_site = [h for h in candidates if h.site_id != avoid.site_id]
        other_server = [h for h in candidates if h.server_id != avoid.server_id]
        candidates = other_site or other_server
        if not candidates:
            raise PlacementError(
                f"a primary and its backup need two live servers; only {avoid.server_id} is up")
    return min(candidates, key=lambda h: (load[h.server_id], h.server_id))


def place_graph(slots: Iterable[OperatorSlots], spares: Sequence[str],
                hosts: Sequence[Host]) -> dict[str, str]:
    """Node -> server id for a new deployment (stateful pairs first, then the rest, spares last).

    Raises :class:`PlacementError` when there is no live server, or a primary/backup pair would
    have to share one.
    """
    if not hosts:
        raise PlacementError("no live server to run the graph's replicas on")
    by_id = {h.server_id: h for h in hosts}
    load: Counter[str] = Counter({h.server_id: h.replicas for h in hosts})
    where: dict[str, str] = {}
    ordered = sorted(slots, key=lambda s: (s.backup is None, s.operator))
    for slot in ordered:
        primary = _pick(hosts, load)
        where[slot.primary] = primary.server_id
        load[primary.server_id] += 1
        if slot.backup is not None:
            backup = _pick(hosts, load, avoid=by_id[primary.server_id])
            where[slot.backup] = backup.server_id
            load[backup.server_id] += 1
    for spare in spares:
        host = _pick(hosts, load)
        where[spare] = host.server_id
        load[host.server_id] += 1
    return where


def place_spare(hosts: Sequence[Host], spares_on: Mapping[str, int],
                needed_away_from: Collection[str] = ()) -> str:
    """Server for one more standby: the live server with the fewest standbys, then replicas.

    Servers in ``needed_away_from`` (those of primaries waiting for a backup) come last: a
    standby there could not become their backup.
    """
    if not hosts:
        raise PlacementError("no live server to start a standby on")
    return min(hosts, key=lambda h: (h.server_id in needed_away_from,
                                     spares_on.get(h.server_id, 0), h.replicas,
                                     h.server_id)).server_id


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
