"""The contract every failover policy meets: Understudy (FailLite) and the §5.1 baselines.

A policy is an immutable object holding its configuration; both methods are pure functions
of the snapshot they are given, so the controller and the simulator can call the same
policy and get the same decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from policies.actions import FailoverPlan, WarmPlan
from policies.model import ClusterSnapshot


@runtime_checkable
class FailoverPolicy(Protocol):
    """Plans warm backups ahead of failures, and what to do when servers fail."""

    @property
    def name(self) -> str:
        """Short stable identifier (``"understudy"``, ``"full-size-cold"``, ...)."""
        ...

    def plan_warm(self, snapshot: ClusterSnapshot) -> WarmPlan:
        """The complete set of warm backups this policy wants, given the primaries.

        Existing ``Role.WARM`` placements are re-planned, not kept by default; apply the
        result with ``WarmPlan.actions(current_warm)``.
        """
        ...

    def plan_failover(self, snapshot: ClusterSnapshot,
                      failed_servers: Iterable[str]) -> FailoverPlan:
        """Recover the apps whose primary was on one of ``failed_servers``.

        ``snapshot`` is the state just before the failure (primaries, warm backups, maybe
        interim replicas); ``failed_servers`` are the servers that just failed. Unknown server
        ids raise ``policies.errors.UnknownReferenceError``.
        """
        ...

    def plan_recovery(self, snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> FailoverPlan:
        """Bring back ``app_ids``: apps in an outage that nothing serves or loads.

        No server fails here: these are apps a failover left unrecoverable, or that lost their
        server outside a failover round, found by the controller's convergence pass once
        room may have appeared. The plan has recoveries and unrecoverable apps (and the warm
        backups preempted for them), no warm switches and no failed servers.
        """
        ...
