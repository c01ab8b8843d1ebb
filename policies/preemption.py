"""Preempting warm backups of healthy apps when a large failure leaves apps unrecoverable.

A warm backup is insurance for an app whose primary still serves. When a failure is so large
(a whole edge site, or several) that Algorithm 1 cannot recover every affected app in the free
capacity, keeping that insurance costs affected apps their service. With
``ProgressiveConfig.preempt_warm`` the progressive step then unloads warm backups of healthy
apps, as few and as cheap as it can:

1. Algorithm 1 on the free capacity (the paper's behaviour). If every app is recovered, or no
   healthy app holds a warm backup, that plan stands.
2. The preemptible backups are ordered least valuable first (accuracy x request rate, then app
   id and server). Algorithm 1 with all of them unloaded gives the most apps preemption can
   recover; if that is no more than plan 1, plan 1 stands.
3. A binary search finds the shortest prefix of that order whose unloading lets Algorithm 1
   recover that many apps (about log2(n) more runs of Algorithm 1).
4. Backups of that prefix on servers where the plan does not need their room are kept: per
   server, most valuable first, a backup stays when the plan's load (transient reserve
   included, as Algorithm 1 counts it) still fits beside it.

The repair step (re-planning warm backups) later restores the insurance where room allows.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.actions import ProgressivePlan, ProgressiveRecovery
from policies.config import ProgressiveConfig
from policies.model import ClusterSnapshot, Placement, Role
from policies.progressive import plan_progressive
from policies.resources import Resources


def preemptible_backups(after: ClusterSnapshot) -> tuple[Placement, ...]:
    """Warm backups on live servers of apps whose primary is alive, least valuable first."""
    out = []
    for placement in after.placements:
        if placement.role is not Role.WARM or placement.server_id not in after.free:
            continue
        primary = after.primary_by_app.get(placement.app_id)
        if primary is None or primary.server_id in after.failed_servers:
            continue
        out.append(placement)
    return tuple(sorted(out, key=lambda p: (_value(after, p), p.app_id, p.server_id)))


def _value(snapshot: ClusterSnapshot, placement: Placement) -> float:
    app = snapshot.app_by_id[placement.app_id]
    return snapshot.variant_of(placement).accuracy * app.max_rate_rps


def _demand(snapshot: ClusterSnapshot, placement: Placement) -> Resources:
    app = snapshot.app_by_id[placement.app_id]
    return snapshot.variant_of(placement).demand(app.max_rate_rps)


def recovery_load(snapshot: ClusterSnapshot,
                  recoveries: Sequence[ProgressiveRecovery]) -> dict[str, Resources]:
    """Per server, what ``recoveries`` need while they run, as ``plan_progressive`` counts it.

    Σ max(interim, target) over the server's recoveries, plus the largest min(interim, target)
    of one upgrading app (upgrades run one at a time per server).
    """
    steady: dict[str, Resources] = {}
    reserve: dict[str, dict[str, float]] = {}
    for r in recoveries:
        app = snapshot.app_by_id[r.app_id]
        family = snapshot.family_of(app)
        target = family.variant(r.target_variant).demand(app.max_rate_rps)
        interim = family.variant(r.interim_variant).demand(app.max_rate_rps)
        names = set(target) | set(interim)
        high = Resources({n: max(target[n], interim[n]) for n in names})
        steady[r.server_id] = steady.get(r.server_id, Resources()) + high
        if r.interim_variant != r.target_variant:
            held = reserve.setdefault(r.server_id, {})
            for n in names:
                held[n] = max(held.get(n, 0.0), min(target[n], interim[n]))
    return {k: steady[k] + reserve.get(k, {}) for k in steady}


def _without(snapshot: ClusterSnapshot, gone: Sequence[Placement]) -> ClusterSnapshot:
    drop = set(gone)
    return snapshot.with_placements(p for p in snapshot.placements if p not in drop)


def _restore(after: ClusterSnapshot, plan: ProgressivePlan,
             evicted: Sequence[Placement]) -> tuple[Placement, ...]:
    """The evicted backups the plan really needs gone (step 4 of the module docstring)."""
    load = recovery_load(after, plan.recoveries)
    room: dict[str, Resources] = {}
    for placement in evicted:
        server = placement.server_id
        room[server] = room.get(server, after.free[server]) + _demand(after, placement)
    needed = []
    for placement in reversed(evicted):  # most valuable first
        server = placement.server_id
        left = room[server] - _demand(after, placement)
        if load.get(server, Resources()).fits_within(left):
            room[server] = left  # it stays loaded
        else:
            needed.append(placement)
    return tuple(reversed(needed))


def replan_preempting(after: ClusterSnapshot, cold: Sequence[str], config: ProgressiveConfig,
                      first: ProgressivePlan) -> tuple[ProgressivePlan, tuple[Placement, ...]]:
    """Improve ``first`` (Algorithm 1 for ``cold`` on ``after``) by preempting warm backups.

    Returns the plan to run and the warm placements to unload before its loads (steps 2-4 of
    the module docstring); ``(first, ())`` when preemption recovers no more apps.
    """
    if not first.unrecoverable:
        return first, ()
    order = preemptible_backups(after)
    if not order:
        return first, ()
    best = plan_progressive(_without(after, order), cold, config)
    goal = len(best.recoveries)
    if goal <= len(first.recoveries):
        return first, ()
    low, high = 0, len(order)  # recovering `goal` apps fails at low (or low == 0), holds at high
    while high - low > 1:
        middle = (low + high) // 2
        plan = plan_progressive(_without(after, order[:middle]), cold, config)
        if len(plan.recoveries) >= goal:
            high, best = middle, plan
        else:
            low = middle
    return best, _restore(after, best, order[:high])
