"""The warm step's upkeep: re-plan the warm backups (the ILP) and converge the replicas to it.

A re-plan is requested by any change of where an app is served and runs debounced, so bursts
(registrations, the interims of one failure) coalesce into one solve; it also waits while urgent
loads are in flight. The failover calls :meth:`WarmPlanner.replan` directly once its own loads
are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from controller.records import Replica, ReplicaRole, ReplicaState
from controller.snapshot import warm_backups

if TYPE_CHECKING:
    from controller.orchestrator import Orchestrator

logger = logging.getLogger(__name__)

WARM_REPLAN_DEBOUNCE_S = 0.05
URGENT_HOLD_MAX_S = 10.0
"""A requested warm re-plan waits while urgent loads (interims, apps with nothing serving) are
in flight, at most this long: its backup loads would take CPU and disk from the loads that end
an outage (on the testbed a re-plan triggered by the first interim of a failure loaded a
convnext backup while four more interims of that failure were still loading)."""

Key = tuple[str, str, str]
"""(app, server, variant) of a warm backup."""


class WarmPlanner:
    """Re-plans the warm backups of one orchestrator's cluster."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator
        self._pending = False
        self._task: asyncio.Task[Any] | None = None
        self._urgent_loads = 0
        self._no_urgent_loads = asyncio.Event()
        self._no_urgent_loads.set()

    @contextlib.contextmanager
    def urgent_load(self) -> Any:
        """Marks an urgent load in flight for the body of the ``with``."""
        self._urgent_loads += 1
        self._no_urgent_loads.clear()
        try:
            yield
        finally:
            self._urgent_loads -= 1
            if self._urgent_loads == 0:
                self._no_urgent_loads.set()

    def request(self) -> None:
        """Re-plan soon; bursts of requests coalesce into one."""
        self._pending = True
        if self._task is None or self._task.done():
            self._task = self.o.spawn(self._loop(), "warm re-plan")

    async def _loop(self) -> None:
        while self._pending:
            await asyncio.sleep(WARM_REPLAN_DEBOUNCE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._no_urgent_loads.wait(), URGENT_HOLD_MAX_S)
            self._pending = False
            await self.replan()

    async def replan(self) -> dict[str, Any]:
        """Solve the warm-backup plan and converge the warm replicas to it."""
        o = self.o
        async with o.plan_lock:
            snapshot, apps, _ = await o.snapshot()
            started = time.perf_counter()
            plan = await asyncio.to_thread(o.policy().plan_warm, snapshot)
            o.metrics.solve.observe(time.perf_counter() - started)
            desired = {(a.app_id, a.server_id, a.variant) for a in plan.assignments}
            current = warm_backups(apps, (s.server_id for s in snapshot.servers))
            to_load, to_unload = await self._write_diff(sorted(desired - current),
                                                        sorted(current - desired))
            summary = {
                "solved_at": time.time(), "policy": o.config.policy,
                "assignments": [{"app_id": a.app_id, "server_id": a.server_id,
                                 "variant": a.variant, "accuracy": a.accuracy}
                                for a in plan.assignments],
                "uncovered": [{"app_id": u.app_id, "reason": u.reason} for u in plan.uncovered],
                "stats": {"method": plan.stats.method, "solver": plan.stats.solver,
                          "status": plan.stats.status, "objective": plan.stats.objective,
                          "bound": plan.stats.bound, "gap": plan.stats.gap,
                          "build_s": plan.stats.build_s, "solve_s": plan.stats.solve_s,
                          "total_s": plan.stats.total_s, "notes": list(plan.stats.notes)},
                "loads": len(to_load), "unloads": len(to_unload)}
            await o.store.put_plan(summary)
        logger.info("warm plan: %d backups (%d new, %d removed), %d uncovered, %s in %.3f s",
                    len(desired), len(to_load), len(to_unload), len(plan.uncovered),
                    plan.stats.status, plan.stats.total_s)
        await asyncio.gather(
            *(self._load(a, s, v) for a, s, v in to_load),
            *(o.unload_replica(a, s, v) for a, s, v in to_unload))
        return summary

    async def _write_diff(self, to_load: list[Key], to_unload: list[Key]
                          ) -> tuple[list[Key], list[Key]]:
        """Record the backups to load and unload; returns those that still apply.

        Each app's record is read again and written under its own lock: the plan was made
        from records read before the solve, and a load finishing meanwhile (under the app's
        lock, not the planning lock) wrote a newer record, which writing the plan's copy
        back would undo (an app's primary stayed 'loading' for good after its load ended).
        """
        o = self.o
        loads: list[Key] = []
        unloads: list[Key] = []
        for app_id in sorted({a for a, _, _ in to_load + to_unload}):
            async with o.app_lock(app_id):
                record = await o.store.get_app(app_id)
                if record is None:
                    continue
                for _, server_id, variant in (k for k in to_load if k[0] == app_id):
                    key = (server_id, variant)
                    existing = record.replica(server_id, variant)
                    if record.serving == key or (
                            existing is not None and existing.role is not ReplicaRole.WARM
                            and existing.state in (ReplicaState.LOADING, ReplicaState.READY)):
                        continue  # that model has another use now
                    # Never two replicas of one (server, variant): one being unloaded is reused.
                    record.replicas = [r for r in record.replicas if r.key != key]
                    record.replicas.append(Replica(server_id=server_id, variant=variant,
                                                   role=ReplicaRole.WARM, accuracy=o.accuracy(
                                                       record.spec.family, variant)))
                    loads.append((app_id, server_id, variant))
                for _, server_id, variant in (k for k in to_unload if k[0] == app_id):
                    replica = record.replica(server_id, variant)
                    if replica is None or replica.role is not ReplicaRole.WARM \
                            or record.serving == replica.key:
                        continue  # promoted (a warm switch) since the plan read it
                    replica.state = ReplicaState.UNLOADING
                    unloads.append((app_id, server_id, variant))
                await o.store.put_app(record)
        return loads, unloads

    async def _load(self, app_id: str, server_id: str, variant: str) -> None:
        o = self.o
        if await o.load_replica(app_id, server_id, variant):
            record = await o.store.get_app(app_id)
            replica = record.replica(server_id, variant) if record else None
            if record is not None and replica is not None:
                await o.notify(record, "backup_ready", replica)
