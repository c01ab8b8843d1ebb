"""The decisions the simulator executes: the same calls, on the same snapshots, as the controller.

The controller must make exactly these calls for the simulator's results to speak for it:

1. ``warm = policy.plan_warm(snapshot)`` on its snapshot of primaries (and current warm
   backups), then apply ``warm.actions(current_warm)``; its state is then
   ``policies.failover.with_warm_plan(snapshot, warm)``.
2. When servers fail: ``plan = policy.plan_failover(state, failed_servers)`` on that state,
   with the failed servers not yet marked failed, then execute ``plan.actions()``.

``decide_warm`` and ``decide_failover`` are those two steps; ``sim.runner`` uses nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.actions import FailoverPlan, WarmPlan
from policies.failover import with_warm_plan
from policies.model import ClusterSnapshot
from policies.policy import FailoverPolicy


def decide_warm(policy: FailoverPolicy,
                snapshot: ClusterSnapshot) -> tuple[WarmPlan, ClusterSnapshot]:
    """The policy's warm plan and the state once its backups are loaded."""
    warm = policy.plan_warm(snapshot)
    return warm, with_warm_plan(snapshot, warm)


def decide_failover(policy: FailoverPolicy, state: ClusterSnapshot,
                    failed_servers: Iterable[str]) -> FailoverPlan:
    """The policy's plan when ``failed_servers`` fail in ``state``."""
    return policy.plan_failover(state, failed_servers)
