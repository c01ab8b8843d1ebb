"""Failover building blocks shared by every policy, and the Understudy policy itself.

Understudy is FailLite's two-step approach (§3.1-3.4): warm backups chosen ahead of time by
the warm-backup ILP for the critical apps, and, when servers fail, an instant switch to a
live warm backup where one exists and progressive cold recovery (Algorithm 1) for the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, NamedTuple

from policies.actions import FailoverPlan, WarmPlan, WarmSwitch
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.errors import InvalidInputError, UnknownReferenceError
from policies.model import ClusterSnapshot, Placement, Role
from policies.preemption import replan_preempting
from policies.progressive import plan_progressive
from policies.recovery_order import deferrable_preemptions, interims_shortest_first
from policies.replica_rules import may_hold_replica, may_use_variant
from policies.resources import MEMORY_MB
from policies.warm_heuristic import with_backups
from policies.warm_ilp import plan_warm_backups


class AffectedSplit(NamedTuple):
    """The cluster after a failure, and how each affected app will be recovered."""

    after: ClusterSnapshot
    """The snapshot with the failed servers marked failed (their replicas are gone)."""
    warm_switches: tuple[WarmSwitch, ...]
    """Affected apps that switch to a live warm backup, by app id."""
    cold_app_ids: tuple[str, ...]
    """Affected apps without a live warm backup, by app id: they need a cold recovery."""


def resolve_failed_servers(snapshot: ClusterSnapshot,
                           failed_servers: Iterable[str]) -> frozenset[str]:
    """``failed_servers`` as a set, checked against the snapshot's servers."""
    if isinstance(failed_servers, str):
        raise InvalidInputError(
            f"failed_servers must be an iterable of server ids, not the string {failed_servers!r}")
    failed = frozenset(failed_servers)
    unknown = sorted(s for s in failed if s not in snapshot.server_by_id)
    if unknown:
        raise UnknownReferenceError(
            f"failed servers {unknown} are not in the snapshot; known: "
            f"{sorted(snapshot.server_by_id)}")
    return failed


def with_warm_plan(snapshot: ClusterSnapshot, plan: WarmPlan) -> ClusterSnapshot:
    """``snapshot`` with its warm backups replaced by ``plan``'s.

    This is the state the controller holds once ``plan.actions(current_warm)`` has run, and
    the snapshot to pass to ``plan_failover`` when servers fail; the simulator builds its
    state the same way (``sim.decisions``).
    """
    kept = tuple(p for p in snapshot.placements if p.role is not Role.WARM)
    return snapshot.with_placements(with_backups(kept, plan.placements()))


def affected_app_ids(snapshot: ClusterSnapshot) -> tuple[str, ...]:
    """Apps whose primary replica is on a failed server of ``snapshot``, by app id."""
    return tuple(sorted(app_id for app_id, primary in snapshot.primary_by_app.items()
                        if primary.server_id in snapshot.failed_servers))


def split_affected(snapshot: ClusterSnapshot, failed_servers: Iterable[str]) -> AffectedSplit:
    """Mark ``failed_servers`` failed and sort the affected apps into warm switches and cold.

    An app is affected when its primary is on a failed server (one that just failed, or one
    the snapshot already knew as failed). An affected app with a warm backup on a live
    server switches to the best one: highest accuracy, then most free memory left on its
    server, then smallest server id. The other affected apps are returned as cold. A backup
    the replica rules no longer allow (outside the app's pinned site, or above its primary
    variant: loaded before the rule or the app's spec changed) is not switched to.
    """
    failed = resolve_failed_servers(snapshot, failed_servers)
    after = snapshot.with_failed(failed)
    affected = affected_app_ids(after)
    # Only the affected apps' backups matter: at 10,000 apps, checking the rules on every
    # backup of the cluster cost more than the rest of the split.
    wanted = frozenset(affected)
    live_warm: dict[str, list[Placement]] = {}
    for placement in after.placements:
        if placement.role is Role.WARM and placement.app_id in wanted and \
                placement.server_id in after.free:
            app = after.app_by_id[placement.app_id]
            if (may_hold_replica(after, app, after.server_by_id[placement.server_id])
                    and may_use_variant(after, app, after.variant_of(placement))):
                live_warm.setdefault(placement.app_id, []).append(placement)
    switches: list[WarmSwitch] = []
    cold: list[str] = []
    for app_id in affected:
        candidates = live_warm.get(app_id)
        if not candidates:
            cold.append(app_id)
            continue
        best = min(candidates, key=lambda p: (-after.variant_of(p).accuracy,
                                              -after.free[p.server_id][MEMORY_MB], p.server_id))
        switches.append(WarmSwitch(app_id, best.server_id, best.variant))
    return AffectedSplit(after, tuple(switches), tuple(cold))


@dataclass(frozen=True, slots=True)
class UnderstudyPolicy:
    """FailLite's two-step policy: ILP warm backups for K, then progressive cold failover."""

    warm: WarmPlanConfig = field(default_factory=WarmPlanConfig)
    progressive: ProgressiveConfig = field(default_factory=ProgressiveConfig)
    name: ClassVar[str] = "understudy"

    def plan_warm(self, snapshot: ClusterSnapshot) -> WarmPlan:
        """Warm backups of the critical apps from the warm-backup ILP (FailLite eq. 1-7)."""
        return plan_warm_backups(snapshot, self.warm)

    def plan_failover(self, snapshot: ClusterSnapshot,
                      failed_servers: Iterable[str]) -> FailoverPlan:
        """Warm switches where a live warm backup exists, Algorithm 1 for the other apps.

        The warm backups of unaffected apps stay loaded and keep their memory; the replicas
        on failed servers are gone, so Algorithm 1 sees only the live servers' free capacity.
        With ``progressive.preempt_warm``, when that leaves apps unrecoverable, the fewest
        warm backups of healthy apps that let more apps recover are preempted
        (``policies.preemption``; listed in ``FailoverPlan.preempted``). Recoveries are
        listed in the order their interims should load, and preemptions the interims do not
        need are deferred (``policies.recovery_order``).
        """
        failed = resolve_failed_servers(snapshot, failed_servers)
        after, switches, cold = split_affected(snapshot, failed)
        return replace(self.plan_recovery(after, cold), failed_servers=failed,
                       warm_switches=switches)

    def plan_recovery(self, snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> FailoverPlan:
        """Algorithm 1 for ``app_ids`` on the live servers' free capacity, preempting as above.

        The cold half of :meth:`plan_failover`, also asked for the apps an outage left with
        nothing serving once a failover round is over (``policy.FailoverPolicy``).
        """
        if not app_ids:
            return FailoverPlan(failed_servers=frozenset(), warm_switches=(), recoveries=(),
                                unrecoverable=())
        preempted: tuple[Placement, ...] = ()
        progressive = plan_progressive(snapshot, app_ids, self.progressive)
        notes: tuple[str, ...] = (f"demand ratio {progressive.demand_ratio:.3f}",)
        if self.progressive.preempt_warm:
            progressive, preempted = replan_preempting(snapshot, app_ids, self.progressive,
                                                       progressive)
            if preempted:
                notes += (f"preempted {len(preempted)} warm backups of healthy apps",)
        return FailoverPlan(failed_servers=frozenset(), warm_switches=(),
                            recoveries=interims_shortest_first(snapshot, progressive.recoveries),
                            unrecoverable=progressive.unrecoverable, notes=notes,
                            preempted=preempted,
                            deferred_preemptions=deferrable_preemptions(
                                snapshot, progressive.recoveries, preempted))
