"""Candidate generation for the warm-backup ILP: which (app, variant, server) may be chosen.

Every rule here only removes columns that no feasible or no optimal solution of FailLite's
eq. (1)-(7) can use, so pruning never changes the optimum:

* eq. (4) primary independence (and site independence, §3.4), the user's exclusion list and
  pins, and variants above the primary (``policies/replica_rules.py``): rules, not pruning;
* eq. (6) latency SLO, checked per server (latency depends on the server's type and speed);
* eq. (2)/(3): a variant larger than a server's free capacity, or than the whole warm budget,
  can never be placed there;
* dominance: variant j of an app is dropped when another variant j' needs no more of any
  resource, is at least as accurate and at least as fast on every server type present;
  swapping j for j' in any solution keeps it feasible and does not lower the objective.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

from policies.model import Application, ClusterSnapshot, Role, Server, Variant, latency_for
from policies.replica_rules import allowed_variants, pinned_site, scoped, spreads_sites
from policies.resources import COMPUTE, MEMORY_MB, Resources

_EPS = 1e-9

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Column:
    """A candidate warm backup: ``variant`` of app number ``app`` on server number ``server``."""

    app: int
    server: int
    variant: Variant
    value: float
    demand: tuple[float, ...]


@dataclass(frozen=True)
class WarmProblem:
    """The warm-backup instance after pruning, indexed for model building."""

    apps: tuple[Application, ...]
    wanted: tuple[int, ...]
    servers: tuple[Server, ...]
    resources: tuple[str, ...]
    capacity: tuple[tuple[float, ...], ...]
    budget: tuple[float, ...]
    columns: tuple[Column, ...]
    spread_sites: tuple[bool, ...]
    """Per app: its backups avoid its primary's site and use distinct sites."""
    unplaceable: dict[str, str] = field(default_factory=dict)

    @property
    def total_wanted(self) -> int:
        return sum(self.wanted)

    # Indexes over ``columns``, built once: the master, the packer and its repair and upgrade
    # steps all need them, several times per plan.

    @cached_property
    def columns_by_item(self) -> dict[tuple[int, str], list[int]]:
        """Column indices per (app index, variant name), in server order."""
        return _group(self.columns, lambda c: (c.app, c.variant.name))

    @cached_property
    def columns_by_app(self) -> dict[int, list[int]]:
        """Column indices per app index."""
        return _group(self.columns, lambda c: c.app)

    @cached_property
    def columns_by_app_server(self) -> dict[tuple[int, int], list[int]]:
        """Column indices per (app index, server index)."""
        return _group(self.columns, lambda c: (c.app, c.server))


def _group(columns: Sequence[Column], key: Callable[[Column], K]) -> dict[K, list[int]]:
    groups: dict[K, list[int]] = defaultdict(list)
    for n, column in enumerate(columns):
        groups[key(column)].append(n)
    return dict(groups)


def warm_capacity(snapshot: ClusterSnapshot) -> dict[str, Resources]:
    """Free capacity per live server if every current warm backup were unloaded.

    The ILP re-plans all warm backups, so the memory they hold now is available to it.
    """
    free = dict(snapshot.free)
    for placement in snapshot.placements:
        if placement.role is Role.WARM and placement.server_id in free:
            app = snapshot.app_by_id[placement.app_id]
            demand = snapshot.variant_of(placement).demand(app.max_rate_rps)
            free[placement.server_id] = free[placement.server_id] + demand
    return free


def build_warm_problem(snapshot: ClusterSnapshot, *, alpha: float, replicas: int,
                       site_independent: bool, keep_current_bonus: float = 0.0,
                       variant_filter: frozenset[str] | None = None) -> WarmProblem:
    """Prune FailLite's app x variant x server space down to the columns worth a variable.

    ``variant_filter`` restricts every app to the named variants (used to express baselines).
    ``site_independent`` is the resolved setting (``replica_rules.resolve_site_independent``).
    """
    free = warm_capacity(snapshot)
    servers = tuple(s for s in snapshot.servers if s.server_id in free)
    resources = tuple(sorted({MEMORY_MB, COMPUTE}.union(*(set(c) for c in free.values()))))
    capacity = tuple(tuple(max(0.0, free[s.server_id][r]) for r in resources) for s in servers)
    budget = tuple((1.0 - alpha) * sum(c[n] for c in capacity) for n in range(len(resources)))
    current = {(p.app_id, p.server_id, p.variant) for p in snapshot.placements
               if p.role is Role.WARM}
    speed_groups = sorted({(s.server_type, s.speed) for s in servers})

    apps: list[Application] = []
    wanted: list[int] = []
    spread: list[bool] = []
    columns: list[Column] = []
    unplaceable: dict[str, str] = {}
    for app in snapshot.apps:
        if not app.critical:
            continue
        want = app.backups_wanted(replicas)
        primary = snapshot.primary_by_app.get(app.app_id)
        if want == 0:
            continue
        if primary is None or primary.server_id in snapshot.failed_servers:
            unplaceable[app.app_id] = "the app has no live primary to back up"
            continue
        index = len(apps)
        spreads = spreads_sites(app, site_independent)
        allowed = _allowed_servers(snapshot, app, primary.server_id, servers, spreads)
        variants = _undominated_variants(snapshot, app, speed_groups, variant_filter)
        app_columns = _columns_for(app, index, variants, allowed, servers, capacity, budget,
                                   resources, current, keep_current_bonus)
        apps.append(app)
        wanted.append(want)
        spread.append(spreads)
        columns.extend(app_columns)
        if len({c.server for c in app_columns}) < want:
            unplaceable[app.app_id] = _why_short(snapshot, app, allowed, variants, app_columns,
                                                 want)
    return WarmProblem(tuple(apps), tuple(wanted), servers, resources, capacity, budget,
                       tuple(columns), tuple(spread), unplaceable)


def _allowed_servers(snapshot: ClusterSnapshot, app: Application, primary_server: str,
                     servers: Sequence[Server], spreads: bool) -> list[int]:
    primary_site = snapshot.site_of(primary_server)
    scope = scoped(snapshot, app)  # the exclusion list with the pin folded in
    return [k for k, s in enumerate(servers)
            if s.server_id != primary_server
            and not (spreads and s.site_id == primary_site)
            and scope.may_back_up_on(s)]


def _undominated_variants(snapshot: ClusterSnapshot, app: Application,
                          speed_groups: Sequence[tuple[str, float]],
                          variant_filter: frozenset[str] | None) -> list[Variant]:
    variants = [v for v in allowed_variants(snapshot, app)
                if variant_filter is None or v.name in variant_filter]
    profiles = []
    for v in variants:
        demand = v.demand(app.max_rate_rps)
        latencies = tuple(latency_for(v, server_type, speed) for server_type, speed in speed_groups)
        profiles.append((v, demand, latencies))
    kept = []
    for j, (v, demand, latencies) in enumerate(profiles):
        dominated = any(
            _dominates(other, j2, (v, demand, latencies), j)
            for j2, other in enumerate(profiles) if j2 != j)
        if not dominated:
            kept.append(v)
    return kept


def _dominates(a: tuple[Variant, Resources, tuple[float, ...]], a_index: int,
               b: tuple[Variant, Resources, tuple[float, ...]], b_index: int) -> bool:
    variant_a, demand_a, lat_a = a
    variant_b, demand_b, lat_b = b
    if variant_a.accuracy < variant_b.accuracy - _EPS or not demand_a.fits_within(demand_b):
        return False
    if any(x > y + _EPS for x, y in zip(lat_a, lat_b, strict=True)):
        return False
    equal = (abs(variant_a.accuracy - variant_b.accuracy) <= _EPS and demand_a == demand_b
             and all(abs(x - y) <= _EPS for x, y in zip(lat_a, lat_b, strict=True)))
    # Exact twins: keep the one listed first so that exactly one survives.
    return not equal or a_index < b_index


def _columns_for(app: Application, index: int, variants: Sequence[Variant],
                 allowed: Sequence[int], servers: Sequence[Server],
                 capacity: Sequence[tuple[float, ...]], budget: Sequence[float],
                 resources: Sequence[str], current: set[tuple[str, str, str]],
                 keep_current_bonus: float) -> list[Column]:
    out = []
    for variant in variants:
        demand_vector = variant.demand(app.max_rate_rps)
        demand = tuple(demand_vector[r] for r in resources)
        if any(d > b + _EPS for d, b in zip(demand, budget, strict=True)):
            continue
        value = variant.accuracy * app.max_rate_rps
        for k in allowed:
            if any(d > c + _EPS for d, c in zip(demand, capacity[k], strict=True)):
                continue
            server = servers[k]
            if not app.meets_slo(variant, server):
                continue
            bonus = 1.0
            if (app.app_id, server.server_id, variant.name) in current:
                bonus += keep_current_bonus
            out.append(Column(index, k, variant, value * bonus, demand))
    return out


def _why_short(snapshot: ClusterSnapshot, app: Application, allowed: Sequence[int],
               variants: Sequence[Variant], columns: Sequence[Column], want: int) -> str:
    if not allowed:
        site = pinned_site(snapshot, app)
        if site is not None:
            return f"pinned to site {site!r}: no other live server there may hold a backup"
        return "no live server is allowed for a backup (primary/site independence or " \
               "exclusion list)"
    if len(allowed) < want:
        return f"only {len(allowed)} servers are allowed for {want} backups"
    if not variants:
        return "no variant the app may use passes the variant filter"
    if not columns:
        smallest = min(variants, key=lambda v: v.memory_mb)
        return (f"no allowed server has free capacity (within the latency SLO) even for the "
                f"smallest variant {smallest.name!r}")
    return f"only {len({c.server for c in columns})} allowed servers can hold any variant"
