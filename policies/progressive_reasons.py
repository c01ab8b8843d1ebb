"""Why ``plan_progressive`` gave an app up: reasons an operator can act on.

Every statement is checked against the plan's final state, per latency class (the servers of
one type and speed, on which the same variants meet the SLO): the smallest variant the app may
use there, and what it needs against the most that is left on a server it may use. So a reason
never names one class's variant beside another's free memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.model import Application, ClusterSnapshot
from policies.progressive_state import EPSILON, PlanApp, PlanCluster
from policies.replica_rules import pinned_site
from policies.resources import MEMORY_MB


class Reasons:
    """The reason for each app given up, on a finished plan's cluster.

    What is left per latency class is computed once per exclusion list (O(S)), not per app.
    """

    def __init__(self, snapshot: ClusterSnapshot, cluster: PlanCluster,
                 names: Sequence[str]) -> None:
        self.snapshot, self.cluster, self.names = snapshot, cluster, names
        self.members: list[list[int]] = [[] for _ in cluster.orders]
        for k, c in enumerate(cluster.klass):
            self.members[c].append(k)
        self.lefts: dict[object, list[list[float] | None]] = {}

    def __call__(self, info: PlanApp) -> str:
        app = info.app
        lefts = self._lefts(info)
        usable = [c for c, left in enumerate(lefts) if left is not None]
        if not usable:
            return self._nowhere(app)
        groups: dict[int, list[float]] = {}  # interim variant -> most left per resource
        for c in usable:
            j, left = info.interim[c], lefts[c]
            if j >= 0 and left is not None:
                groups[j] = list(map(max, groups[j], left)) if j in groups else left
        if not groups:
            top = self.snapshot.families[app.family].variants[info.top].name
            scope = "of its family" if app.allow_larger_backups else f"up to its primary {top!r}"
            return (f"no variant {scope} meets its latency SLO of {app.latency_slo_ms:g} ms on "
                    f"any live server it may use")
        what = ("a variant meeting its latency SLO there" if app.latency_slo_ms is not None
                else "even the smallest variant it may use")
        return (f"no live server it may use has room for {what} (plus the transient reserve): "
                + "; ".join(self._short(info, j, groups[j]) for j in sorted(groups)))

    def _lefts(self, info: PlanApp) -> list[list[float] | None]:
        """Per latency class: the most left per resource on a server the app may use there."""
        app, cluster = info.app, self.cluster
        key = ((app.excluded_servers, app.excluded_sites, app.allowed_backup_sites)
               if info.restricted else None)
        found = self.lefts.get(key)
        if found is None:
            found = []
            for members in self.members:
                left: list[float] | None = None
                for k in members:
                    if info.restricted and not app.may_back_up_on(cluster.servers[k]):
                        continue
                    room = [f - u - r for f, u, r in zip(cluster.free[k], cluster.used[k],
                                                          cluster.reserve[k], strict=True)]
                    left = room if left is None else list(map(max, left, room))
                found.append(left)
            self.lefts[key] = found
        return found

    def _nowhere(self, app: Application) -> str:
        if not self.cluster.servers:
            return "no live server is available"
        site = pinned_site(self.snapshot, app)
        if site is not None:
            return (f"it is pinned to site {site!r}, where no live server may hold it (none is "
                    f"live, or its exclusion list rules them out)")
        return "its exclusion list rules out every live server"

    def _short(self, info: PlanApp, variant: int, left: Sequence[float]) -> str:
        """What ``variant`` needs that no server left: memory, else the other resources."""
        name = repr(self.snapshot.families[info.app.family].variants[variant].name)
        need = info.dem[variant]
        if need[0] > left[0] + EPSILON:
            return f"{name} needs {need[0]:g} MB GPU memory where at most {left[0]:g} MB is left"
        parts = [f"{resource} {need[r]:g} where at most {left[r]:g} is left"
                 for r, resource in enumerate(self.names)
                 if resource != MEMORY_MB and need[r] > left[r] + EPSILON]
        if parts:
            return f"{name} needs " + ", ".join(parts)
        # Each resource is left somewhere, but never all of them on one server.
        return f"{name} fits no single server: none has its memory and other resources at once"
