"""Independent checker of a warm plan against FailLite's constraints, for tests and benches.

It recomputes everything from the snapshot (not from the planner's internal tables), so a
bug in candidate pruning or packing shows up as a violation here. The rules of
``policies/replica_rules.py`` (pins, never above the primary variant, site independence
resolved per snapshot and waived for pinned apps) are checked here too.
"""

from __future__ import annotations

from collections import defaultdict

from policies.actions import WarmAssignment, WarmPlan
from policies.config import WarmPlanConfig
from policies.model import ClusterSnapshot
from policies.replica_rules import (
    may_use_variant,
    pinned_site,
    resolve_site_independent,
    spreads_sites,
)
from policies.resources import Resources, total
from policies.warm_candidates import warm_capacity

_EPS = 1e-6


def warm_plan_violations(snapshot: ClusterSnapshot, plan: WarmPlan,
                         config: WarmPlanConfig) -> list[str]:
    """Every constraint the plan breaks, as readable sentences (empty when valid)."""
    problems: list[str] = []
    site_independent = resolve_site_independent(snapshot, config.site_independent)
    free = warm_capacity(snapshot)
    load: dict[str, list[Resources]] = defaultdict(list)
    per_app: dict[str, list[str]] = defaultdict(list)
    for a in plan.assignments:
        app = snapshot.app_by_id.get(a.app_id)
        server = snapshot.server_by_id.get(a.server_id)
        if app is None or server is None:
            problems.append(f"{a}: unknown app or server")
            continue
        if not app.critical:
            problems.append(f"{a.app_id}: not in K but has a warm backup")
        if a.server_id not in free:
            problems.append(f"{a.app_id}: backup on failed server {a.server_id}")
            continue
        variant = snapshot.family_of(app).variant(a.variant)
        problems.extend(_placement_violations(snapshot, a, site_independent))
        load[a.server_id].append(variant.demand(app.max_rate_rps))
        per_app[a.app_id].append(a.server_id)
    for server_id, demands in load.items():
        used = total(demands)
        if not used.fits_within(free[server_id] + {k: _EPS for k in used}):
            problems.append(f"{server_id}: backups use {used}, free is {free[server_id]}")
    overall = total(d for demands in load.values() for d in demands)
    budget = total(free.values()).scaled(1.0 - config.alpha)
    if not overall.fits_within(budget + {k: _EPS for k in overall}):
        problems.append(f"backups use {overall}, more than the (1 - alpha) budget {budget}")
    problems.extend(_spread_violations(snapshot, per_app, config, site_independent))
    return problems


def _spread_violations(snapshot: ClusterSnapshot, per_app: dict[str, list[str]],
                       config: WarmPlanConfig, site_independent: bool) -> list[str]:
    problems = []
    for app_id, servers in per_app.items():
        app = snapshot.app_by_id[app_id]
        want = app.backups_wanted(config.replicas)
        if len(servers) > want:
            problems.append(f"{app_id}: {len(servers)} backups, wants {want}")
        if len(set(servers)) < len(servers):
            problems.append(f"{app_id}: two backups on one server")
        sites = [snapshot.site_of(s) for s in servers]
        if spreads_sites(app, site_independent) and len(set(sites)) < len(sites):
            problems.append(f"{app_id}: two backups in one site")
    return problems


def _placement_violations(snapshot: ClusterSnapshot, a: WarmAssignment,
                          site_independent: bool) -> list[str]:
    problems = []
    app = snapshot.app_by_id[a.app_id]
    server = snapshot.server_by_id[a.server_id]
    variant = snapshot.family_of(app).variant(a.variant)
    primary = snapshot.primary_by_app.get(a.app_id)
    if primary is None or primary.server_id in snapshot.failed_servers:
        problems.append(f"{a.app_id}: backup of an app with no live primary")
    if primary is not None and primary.server_id == a.server_id:
        problems.append(f"{a.app_id}: backup on its primary's server")
    if (primary is not None and spreads_sites(app, site_independent)
            and snapshot.site_of(primary.server_id) == server.site_id):
        problems.append(f"{a.app_id}: backup in its primary's site")
    if not app.may_back_up_on(server):
        problems.append(f"{a.app_id}: backup on excluded server {a.server_id}")
    site = pinned_site(snapshot, app)
    if site is not None and server.site_id != site:
        problems.append(f"{a.app_id}: backup on {a.server_id} outside its pinned site {site}")
    if not may_use_variant(snapshot, app, variant):
        problems.append(f"{a.app_id}: backup {a.variant} is larger or more accurate than its "
                        f"primary {snapshot.primary_variant(app).name}")
    if not app.meets_slo(variant, server):
        problems.append(f"{a.app_id}: {a.variant} misses its SLO on {a.server_id}")
    return problems
