"""The full-size baselines of FailLite §5.1: Full-Size-Warm, Full-Size-Cold, Full-Size-Warm (K).

They ignore the accuracy/resource trade-off: every backup, warm or cold, is the app's
full-size model (``snapshot.primary_variant(app)``), so a recovered app loses no accuracy
but fewer apps can be recovered. Placement is memory worst-fit everywhere: the server with
the most free memory on which the whole demand vector fits, ties to the smaller server id.
Pins and site independence follow ``policies/replica_rules.py``, as for Understudy.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.actions import (
    FailoverPlan,
    ProgressiveRecovery,
    SolveStats,
    UncoveredApp,
    Unrecoverable,
    WarmAssignment,
    WarmPlan,
)
from policies.config import WarmPlanConfig
from policies.failover import resolve_failed_servers, split_affected
from policies.model import Application, ClusterSnapshot, Server, Variant
from policies.primary import worst_fit
from policies.replica_rules import (
    may_hold_replica,
    pinned_site,
    resolve_site_independent,
    spreads_sites,
)
from policies.resources import MEMORY_MB, Resources, total
from policies.warm_candidates import warm_capacity

# --- shared greedy pieces ------------------------------------------------------------------


def _may_host(snapshot: ClusterSnapshot, app: Application, variant: Variant,
              server: Server) -> bool:
    """The pin, the exclusion list and the latency SLO allow a backup of ``app`` there."""
    return may_hold_replica(snapshot, app, server) and app.meets_slo(variant, server)


def _full_demand(snapshot: ClusterSnapshot, app: Application) -> Resources:
    return snapshot.primary_variant(app).demand(app.max_rate_rps)


def _largest_first(snapshot: ClusterSnapshot, apps: Iterable[Application]) -> list[Application]:
    """``apps`` by decreasing full-size memory demand, ties by app id."""
    return sorted(apps, key=lambda a: (-_full_demand(snapshot, a)[MEMORY_MB], a.app_id))


def _warm_candidates(snapshot: ClusterSnapshot, app: Application, variant: Variant,
                     primary_server: str, taken: Sequence[Server],
                     site_independent: bool) -> list[Server]:
    """Live servers allowed to hold one more warm backup of ``app``.

    Never the primary's server, nor a server already holding one of ``taken``; with
    ``site_independent`` (resolved) never the primary's site nor a site already used by
    ``taken``, unless the app is pinned.
    """
    banned_servers = {primary_server} | {s.server_id for s in taken}
    banned_sites: set[str] = set()
    if spreads_sites(app, site_independent):
        banned_sites = {snapshot.site_of(primary_server)} | {s.site_id for s in taken}
    return [s for s in snapshot.live_servers()
            if s.server_id not in banned_servers and s.site_id not in banned_sites
            and _may_host(snapshot, app, variant, s)]


def _greedy_warm(snapshot: ClusterSnapshot, apps: Sequence[Application],
                 config: WarmPlanConfig, budget_share: float | None) -> WarmPlan:
    """Full-size warm backups for ``apps`` in the given order, memory worst-fit.

    Current warm backups do not hold capacity (they are re-planned). With ``budget_share``
    the backups together use at most that share of the total free capacity, per resource.
    """
    free = warm_capacity(snapshot)
    site_independent = resolve_site_independent(snapshot, config.site_independent)
    budget = None if budget_share is None else total(free.values()).scaled(budget_share)
    assignments: list[WarmAssignment] = []
    uncovered: list[UncoveredApp] = []
    for app in apps:
        wanted = app.backups_wanted(config.replicas)
        if wanted == 0:
            continue
        primary = snapshot.primary_by_app.get(app.app_id)
        if primary is None or primary.server_id not in free:
            uncovered.append(UncoveredApp(app.app_id, wanted, 0,
                                          "the app has no live primary to back up"))
            continue
        variant = snapshot.primary_variant(app)
        demand = variant.demand(app.max_rate_rps)
        taken: list[Server] = []
        reason = ""
        while len(taken) < wanted:
            candidates = _warm_candidates(snapshot, app, variant, primary.server_id, taken,
                                          site_independent)
            server = worst_fit(candidates, demand, free)
            if not candidates:
                reason = ("no further live server passes primary/site independence, the latency "
                          "SLO, the pin and the exclusion list")
            elif budget is not None and not demand.fits_within(budget):
                reason = f"the warm budget left, (1 - alpha) of free capacity, is {budget}"
            elif server is None:
                reason = f"no eligible server has free capacity for full-size {variant.name!r}"
            if reason or server is None:
                break
            free[server.server_id] = free[server.server_id] - demand
            if budget is not None:
                budget = budget - demand
            taken.append(server)
            assignments.append(WarmAssignment(app.app_id, server.server_id, variant.name,
                                              variant.accuracy))
        if len(taken) < wanted:
            uncovered.append(UncoveredApp(app.app_id, wanted, len(taken), reason))
    objective = sum(a.accuracy * snapshot.app_by_id[a.app_id].max_rate_rps for a in assignments)
    notes = () if budget_share is None else (f"warm budget share {budget_share:g}",)
    stats = SolveStats(method="greedy", solver="none", status="ok", objective=objective,
                       notes=notes)
    return WarmPlan(tuple(assignments), tuple(uncovered), stats)


def _cold_full_size(after: ClusterSnapshot, app_ids: Sequence[str], seed: int,
                    ) -> tuple[tuple[ProgressiveRecovery, ...], tuple[Unrecoverable, ...]]:
    """Load full-size cold replicas on ``after``'s live servers, memory worst-fit.

    The critical apps go first, largest first; the others follow in an order shuffled by
    ``random.Random(seed)`` (FailLite: "randomly loads other failover replicas").
    """
    apps = [after.app_by_id[a] for a in sorted(app_ids)]
    others = [a for a in apps if not a.critical]
    random.Random(seed).shuffle(others)
    order = _largest_first(after, (a for a in apps if a.critical)) + others
    free: dict[str, Resources] = dict(after.free)
    live = after.live_servers()
    recoveries: list[ProgressiveRecovery] = []
    unrecoverable: list[Unrecoverable] = []
    for app in order:
        variant = after.primary_variant(app)
        demand = variant.demand(app.max_rate_rps)
        allowed = [s for s in live if _may_host(after, app, variant, s)]
        server = worst_fit(allowed, demand, free)
        if server is None:
            where = "in its pinned site " if pinned_site(after, app) is not None else ""
            why = (f"no live server has room for full-size {variant.name!r}" if allowed else
                   f"no live server {where}meets the latency SLO and the exclusion list")
            unrecoverable.append(Unrecoverable(app.app_id, why))
            continue
        free[server.server_id] = free[server.server_id] - demand
        recoveries.append(ProgressiveRecovery(app.app_id, server.server_id,
                                              variant.name, variant.name))
    return tuple(recoveries), tuple(unrecoverable)


def _critical_then_others(snapshot: ClusterSnapshot) -> tuple[list[Application],
                                                                list[Application]]:
    critical = _largest_first(snapshot, (a for a in snapshot.apps if a.critical))
    others = _largest_first(snapshot, (a for a in snapshot.apps if not a.critical))
    return critical, others


# --- the policies --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FullSizeWarm:
    """Full-size warm backups for every app that fits: K first, then the others.

    Uses all free capacity (``warm.alpha`` is ignored); honours ``warm.replicas`` (or an
    app's ``warm_replicas``) and ``warm.site_independent``. On failure only warm switches
    happen: an affected app without a live warm backup is not recovered.
    """

    warm: WarmPlanConfig = field(default_factory=WarmPlanConfig)
    name: ClassVar[str] = "full-size-warm"

    def plan_warm(self, snapshot: ClusterSnapshot) -> WarmPlan:
        critical, others = _critical_then_others(snapshot)
        return _greedy_warm(snapshot, critical + others, self.warm, budget_share=None)

    def plan_failover(self, snapshot: ClusterSnapshot,
                      failed_servers: Iterable[str]) -> FailoverPlan:
        failed = resolve_failed_servers(snapshot, failed_servers)
        _, switches, cold = split_affected(snapshot, failed)
        unrecoverable = tuple(Unrecoverable(a, "no warm backup") for a in cold)
        return FailoverPlan(failed, switches, (), unrecoverable)

    def plan_recovery(self, snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> FailoverPlan:
        """Full-size loads where they fit (the placement any app without a primary gets)."""
        return _recover_full_size(snapshot, app_ids, seed=0)


def _recover_full_size(snapshot: ClusterSnapshot, app_ids: Sequence[str],
                       seed: int) -> FailoverPlan:
    """Full-size cold loads for apps in an outage (``FailoverPolicy.plan_recovery``)."""
    recoveries, unrecoverable = _cold_full_size(snapshot, app_ids, seed)
    return FailoverPlan(frozenset(), (), recoveries, unrecoverable)


def _warm_then_cold_full_size(snapshot: ClusterSnapshot, failed_servers: Iterable[str],
                              seed: int) -> FailoverPlan:
    """Switch to live warm backups, then load full-size cold replicas for the rest."""
    failed = resolve_failed_servers(snapshot, failed_servers)
    after, switches, cold = split_affected(snapshot, failed)
    recoveries, unrecoverable = _cold_full_size(after, cold, seed)
    return FailoverPlan(failed, switches, recoveries, unrecoverable)


@dataclass(frozen=True, slots=True)
class FullSizeCold:
    """No warm backups; on failure, full-size cold loads: K first, then the rest at random.

    ``seed`` fixes the random order, so a plan is a pure function of its inputs. Warm
    replicas already present in a snapshot (never placed by this policy) are still used.
    """

    seed: int = 0
    name: ClassVar[str] = "full-size-cold"

    def plan_warm(self, snapshot: ClusterSnapshot) -> WarmPlan:
        stats = SolveStats(method="none", solver="none", status="ok", objective=0.0)
        return WarmPlan(assignments=(), uncovered=(), stats=stats)

    def plan_failover(self, snapshot: ClusterSnapshot,
                      failed_servers: Iterable[str]) -> FailoverPlan:
        return _warm_then_cold_full_size(snapshot, failed_servers, self.seed)

    def plan_recovery(self, snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> FailoverPlan:
        return _recover_full_size(snapshot, app_ids, self.seed)


@dataclass(frozen=True, slots=True)
class FullSizeWarmK:
    """Full-size warm backups for K only, within (1 - alpha) of the free capacity; cold rest.

    Honours ``warm.alpha``, ``warm.replicas`` (or an app's ``warm_replicas``) and
    ``warm.site_independent``. On failure: warm switches, then full-size cold loads as in
    ``FullSizeCold`` (critical apps first, the others in a ``seed``-shuffled order).
    """

    warm: WarmPlanConfig = field(default_factory=WarmPlanConfig)
    seed: int = 0
    name: ClassVar[str] = "full-size-warm-k"

    def plan_warm(self, snapshot: ClusterSnapshot) -> WarmPlan:
        critical, _ = _critical_then_others(snapshot)
        return _greedy_warm(snapshot, critical, self.warm, budget_share=1.0 - self.warm.alpha)

    def plan_failover(self, snapshot: ClusterSnapshot,
                      failed_servers: Iterable[str]) -> FailoverPlan:
        return _warm_then_cold_full_size(snapshot, failed_servers, self.seed)

    def plan_recovery(self, snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> FailoverPlan:
        return _recover_full_size(snapshot, app_ids, self.seed)
