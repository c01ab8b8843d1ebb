"""Primary placement: memory worst-fit (FailLite §5.1), or the server or site the user pinned."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from policies.errors import UnknownReferenceError
from policies.model import Application, ClusterSnapshot, Placement, Role, Server
from policies.resources import MEMORY_MB, Resources


@dataclass(frozen=True, slots=True)
class UnplacedApp:
    """An app whose primary variant fits on no allowed server."""

    app_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class PrimaryPlacementResult:
    """New primary placements, and the apps that could not be placed."""

    placements: tuple[Placement, ...]
    unplaced: tuple[UnplacedApp, ...]


def place_primaries(snapshot: ClusterSnapshot, app_ids: Sequence[str] | None = None, *,
                    largest_first: bool = True) -> PrimaryPlacementResult:
    """Place the primary variant of each app that has no primary yet.

    ``app_ids`` defaults to every app without a primary. With ``largest_first`` the apps are
    placed in decreasing memory order (better packing for a batch); otherwise in the given
    order (what a controller registering apps one by one does). Each app goes to the live
    server with the most free memory among those where its whole demand vector fits
    (worst-fit balances load and leaves room for backups everywhere); a pinned server or
    site restricts the candidates. Ties go to the smaller server id.
    """
    if app_ids is None:
        todo = [a for a in snapshot.apps if a.app_id not in snapshot.primary_by_app]
    else:
        unknown = [a for a in app_ids if a not in snapshot.app_by_id]
        if unknown:
            raise UnknownReferenceError(f"unknown apps {unknown}")
        todo = [snapshot.app_by_id[a] for a in app_ids if a not in snapshot.primary_by_app]
    demands = {a.app_id: snapshot.primary_variant(a).demand(a.max_rate_rps) for a in todo}
    if largest_first:
        todo.sort(key=lambda a: (-demands[a.app_id][MEMORY_MB], a.app_id))

    free: dict[str, Resources] = dict(snapshot.free)
    live = snapshot.live_servers()
    placements: list[Placement] = []
    unplaced: list[UnplacedApp] = []
    for app in todo:
        demand = demands[app.app_id]
        best = worst_fit(_allowed_servers(app, live), demand, free)
        if best is None:
            unplaced.append(UnplacedApp(app.app_id, _why_unplaced(app, demand, live)))
            continue
        free[best.server_id] = free[best.server_id] - demand
        variant = snapshot.primary_variant(app).name
        placements.append(Placement(app.app_id, best.server_id, variant, Role.PRIMARY))
    return PrimaryPlacementResult(tuple(placements), tuple(unplaced))


def worst_fit(servers: Iterable[Server], demand: Resources,
              free: Mapping[str, Resources]) -> Server | None:
    """The server with the most free memory among ``servers`` where all of ``demand`` fits.

    Ties go to the smaller server id; None when it fits nowhere.
    """
    fitting = [s for s in servers if demand.fits_within(free[s.server_id])]
    return min(fitting, key=lambda s: (-free[s.server_id][MEMORY_MB], s.server_id), default=None)


def _allowed_servers(app: Application, live: Sequence[Server]) -> list[Server]:
    if app.pinned_server is not None:
        return [s for s in live if s.server_id == app.pinned_server]
    if app.pinned_site is not None:
        return [s for s in live if s.site_id == app.pinned_site]
    return list(live)


def _why_unplaced(app: Application, demand: Resources, live: Sequence[Server]) -> str:
    if app.pinned_server is not None:
        if all(s.server_id != app.pinned_server for s in live):
            return f"pinned server {app.pinned_server!r} is down"
        return f"pinned server {app.pinned_server!r} lacks free capacity for {demand}"
    if app.pinned_site is not None:
        return f"no live server in pinned site {app.pinned_site!r} has free capacity for {demand}"
    return f"no live server has free capacity for {demand}"
