"""Warm backups without an ILP: FailLite Algorithm 1 run over the apps in K (§5.1).

For clusters where the warm-backup ILP does not fit a time budget, the paper's simulations
"utilize the proposed heuristic (Algorithm 1)" for the warm step too. We run
``plan_progressive`` on a derived snapshot:

* the current warm backups are dropped (the plan replaces them, as the ILP's does);
* each server keeps a share α of its free capacity for cold failover (FailLite Fig. 3 draws
  the reserve per server; the ILP's eq. 3 reserves α of the total instead, which is looser);
* each app in K is barred from its primary's server (eq. 4), and from its primary's site with
  ``site_independent`` (§3.4, unless the app is pinned), on top of its own exclusion list;
  the latency SLO, pins and "never above the primary variant" are checked by Algorithm 1
  as usual (``policies/replica_rules.py``);
* for R > 1 backups the heuristic runs R rounds; each round also bars the servers (and sites)
  of the backups already chosen;
* with ``keep_current_bonus`` (the default) a current backup that still obeys every rule
  and fits the reserve is kept where it is, the more accurate first, and only the backups
  missing are planned: the ILP prefers keeping one too, and a re-plan after one failure
  then loads the few backups it lost instead of moving thousands that were fine.

Algorithm 1 keeps room on each server for one interim variant while a target loads; a warm
backup loads its variant directly, so that reserve is a small safety margin here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from policies.actions import SolveStats, UncoveredApp, WarmAssignment, WarmPlan
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.model import Application, ClusterSnapshot, Placement, Role
from policies.progressive import plan_progressive
from policies.replica_rules import (
    may_hold_replica,
    may_use_variant,
    resolve_site_independent,
    spreads_sites,
)
from policies.resources import Resources

_CONFIG = ProgressiveConfig(upgrade=True, order="priority")


def plan_warm_heuristic(snapshot: ClusterSnapshot, config: WarmPlanConfig, *,
                        clock: Callable[[], float] = time.perf_counter) -> WarmPlan:
    """Warm backups for K chosen by Algorithm 1 within (1 - α) of each server's free room."""
    started = clock()
    site_independent = resolve_site_independent(snapshot, config.site_independent)
    base = _derived(snapshot, config.alpha)
    wanted = {a.app_id: a.backups_wanted(config.replicas) for a in snapshot.apps if a.critical}
    reasons: dict[str, str] = {}
    todo = []
    for app_id, want in sorted(wanted.items()):
        primary = snapshot.primary_by_app.get(app_id)
        if want == 0:
            continue
        if primary is None or primary.server_id in snapshot.failed_servers:
            reasons[app_id] = "the app has no live primary to back up"
        else:
            todo.append(app_id)
    chosen: dict[str, list[WarmAssignment]] = {a: [] for a in todo}
    if config.keep_current_bonus > 0:
        base = _keep_current(base, snapshot, chosen, wanted, site_independent)
    for _ in range(max(wanted.values(), default=0)):
        round_apps = [a for a in todo if len(chosen[a]) < wanted[a]]
        if not round_apps:
            break
        state = _barred(base, snapshot, chosen, site_independent)
        plan = plan_progressive(state, round_apps, _CONFIG)
        for r in plan.recoveries:
            variant = state.family_of(state.app_by_id[r.app_id]).variant(r.target_variant)
            chosen[r.app_id].append(WarmAssignment(r.app_id, r.server_id, r.target_variant,
                                                   variant.accuracy))
        for u in plan.unrecoverable:
            reasons.setdefault(u.app_id, u.reason)
        base = base.with_placements(with_backups(base.placements, tuple(
            Placement(r.app_id, r.server_id, r.target_variant, Role.WARM)
            for r in plan.recoveries)))
    assignments = tuple(a for app_id in todo for a in chosen[app_id])
    uncovered = tuple(
        UncoveredApp(app_id, wanted[app_id], len(chosen.get(app_id, ())), reasons.get(
            app_id, "capacity: (1 - alpha) of the servers' free room is exhausted"))
        for app_id in sorted(wanted)
        if wanted[app_id] and len(chosen.get(app_id, ())) < wanted[app_id])
    objective = sum(a.accuracy * snapshot.app_by_id[a.app_id].max_rate_rps for a in assignments)
    elapsed = clock() - started
    stats = SolveStats(method="heuristic", solver="none", status="heuristic",
                       objective=objective, solve_s=elapsed, total_s=elapsed,
                       notes=("FailLite Algorithm 1 over K, alpha reserved per server",))
    return WarmPlan(assignments, uncovered, stats)


def with_backups(placements: tuple[Placement, ...],
                 backups: tuple[Placement, ...]) -> tuple[Placement, ...]:
    """``placements`` plus the warm ``backups``, one placement per (app, server, variant).

    A backup takes the place of a COLD placement of the same variant (a replica the snapshot
    does not count, e.g. one being unloaded): the model is there, and now counts as the
    backup. A backup of a variant already placed in another role adds nothing.
    """
    keys = {(p.app_id, p.server_id, p.variant): p.role for p in placements}
    taken = {(b.app_id, b.server_id, b.variant) for b in backups
             if keys.get((b.app_id, b.server_id, b.variant)) in (None, Role.COLD)}
    kept = tuple(p for p in placements if (p.app_id, p.server_id, p.variant) not in taken)
    return kept + tuple(b for b in backups if (b.app_id, b.server_id, b.variant) in taken)


def _keep_current(base: ClusterSnapshot, snapshot: ClusterSnapshot,
                  chosen: dict[str, list[WarmAssignment]], wanted: dict[str, int],
                  site_independent: bool) -> ClusterSnapshot:
    """Keep the current backups that obey every rule and fit ``base``; fills ``chosen``.

    Returns ``base`` with the kept backups placed (so the rounds plan around them).
    """
    current = sorted((p for p in snapshot.placements
                      if p.role is Role.WARM and p.app_id in chosen
                      and p.server_id not in snapshot.failed_servers),
                     key=lambda p: (-snapshot.variant_of(p).accuracy, p.app_id, p.server_id))
    free = dict(base.free)
    kept: list[Placement] = []
    for placement in current:
        app = snapshot.app_by_id[placement.app_id]
        mine = chosen[app.app_id]
        if len(mine) >= wanted[app.app_id]:
            continue
        primary = snapshot.primary_by_app[app.app_id].server_id
        server = snapshot.server_by_id[placement.server_id]
        taken = {primary} | {a.server_id for a in mine}
        if server.server_id in taken or not may_hold_replica(snapshot, app, server):
            continue
        if (spreads_sites(app, site_independent)
                and server.site_id in {snapshot.site_of(s) for s in taken}):
            continue
        variant = snapshot.variant_of(placement)
        if not may_use_variant(snapshot, app, variant):
            continue
        room = free.get(server.server_id)
        demand = variant.demand(app.max_rate_rps)
        if room is None or not app.meets_slo(variant, server) or not demand.fits_within(room):
            continue
        free[server.server_id] = room - demand
        mine.append(WarmAssignment(app.app_id, server.server_id, variant.name,
                                   variant.accuracy))
        kept.append(placement)
    return base.with_placements(with_backups(base.placements, tuple(kept))) if kept else base


def _derived(snapshot: ClusterSnapshot, alpha: float) -> ClusterSnapshot:
    """No warm backups; each server's capacity shrunk by α of its free room."""
    kept = tuple(p for p in snapshot.placements if p.role is not Role.WARM)
    bare = snapshot.with_placements(kept)
    servers = []
    for server in bare.servers:
        free = bare.free.get(server.server_id)
        if free is None:
            servers.append(server)
            continue
        room = Resources({r: max(0.0, v) for r, v in free.items()})
        servers.append(replace(server, capacity=server.capacity - room.scaled(alpha)))
    return replace(bare, servers=tuple(servers))


def _barred(base: ClusterSnapshot, snapshot: ClusterSnapshot,
            chosen: dict[str, list[WarmAssignment]], site_independent: bool) -> ClusterSnapshot:
    """``base`` whose apps in K may not back up where eq. (4) / §3.4 forbid."""
    apps: list[Application] = []
    for app in base.apps:
        if app.app_id not in chosen:
            apps.append(app)
            continue
        primary = snapshot.primary_by_app[app.app_id].server_id
        servers = {primary} | {a.server_id for a in chosen[app.app_id]}
        sites: set[str] = set()
        if spreads_sites(app, site_independent):
            sites = {snapshot.site_of(s) for s in servers}
        apps.append(replace(app, excluded_servers=app.excluded_servers | servers,
                            excluded_sites=app.excluded_sites | sites))
    return replace(base, apps=tuple(apps))
