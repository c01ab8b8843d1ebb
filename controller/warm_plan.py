"""The warm step's upkeep: re-plan the warm backups (the ILP) and converge the replicas to it.

A re-plan is requested by any change of where an app is served and runs debounced, so bursts
(registrations, the interims of one failure) coalesce into one solve; it also waits while
urgent loads are in flight: its backup loads would take CPU and disk from the loads that end
an outage. A failover calls :meth:`WarmPlanner.replan` directly once its own loads are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from controller.decide.apps import decide_warm_backups
from controller.decide.decision import Decision
from controller.executor import Executor
from controller.interfaces import Clock, RecordStore
from controller.metrics import Metrics
from controller.records import RuntimeConfig
from controller.snapshot import build_snapshot, warm_backups
from policies.actions import LoadVariant, WarmPlan
from policies.model import Family
from policies.policy import FailoverPolicy

logger = logging.getLogger(__name__)

WARM_REPLAN_DEBOUNCE_S = 0.05
URGENT_HOLD_MAX_S = 10.0
"""How long a requested re-plan waits at most for the urgent loads in flight."""


class WarmPlanner:
    """Re-plans the warm backups of one cluster."""

    def __init__(self, executor: Executor, store: RecordStore, families: Mapping[str, Family],
                 config: Callable[[], RuntimeConfig], policy: Callable[[], FailoverPolicy],
                 metrics: Metrics, clock: Clock) -> None:
        self.executor = executor
        self.store = store
        self.families = families
        self.config = config
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self._pending = False
        self._task: asyncio.Task[Any] | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def request(self) -> None:
        """Re-plan soon; bursts of requests coalesce into one."""
        self._pending = True
        if self._task is None or self._task.done():
            self._task = self.executor.spawn(self._loop(), "warm re-plan")

    async def replan_soon(self) -> None:
        """Request a re-plan and wait for one that starts after this call to be done.

        The failovers of a failing site's servers finish one after the other; each waits
        for the warm plan to cover its apps again, and they all share one re-plan.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.request()
        await waiter

    async def _loop(self) -> None:
        while self._pending:
            await asyncio.sleep(WARM_REPLAN_DEBOUNCE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.executor.no_urgent_loads.wait(), URGENT_HOLD_MAX_S)
            self._pending = False
            waiters, self._waiters = self._waiters, []
            try:
                await self.replan()
            except Exception as exc:  # noqa: BLE001 - told to the waiters; requests go on
                logger.exception("warm re-plan failed")
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def replan(self) -> dict[str, Any]:
        """Solve the warm-backup plan and converge the warm replicas to it."""
        ex = self.executor
        async with ex.locks.plan:
            view = await self.store.view()  # read-only; each changed record is read again
            apps = view.apps
            snapshot = build_snapshot(self.families, view.servers, apps)
            started = self.clock.monotonic()
            plan = await asyncio.to_thread(self.policy().plan_warm, snapshot)
            self.metrics.solve.observe(self.clock.monotonic() - started)
            desired = {(a.app_id, a.server_id, a.variant) for a in plan.assignments}
            current = warm_backups(apps, (s.server_id for s in snapshot.servers))
            to_load, to_unload = sorted(desired - current), sorted(current - desired)
            decisions: list[Decision] = []
            # Each app's record is read again and written under its own lock: a load that
            # finished during the solve (under the app's lock, not the planning lock) wrote
            # a newer record, which writing the plan's copy back would undo.
            for app_id in sorted({a for a, _, _ in to_load + to_unload}):
                async with ex.locks.app(app_id):
                    record = await self.store.get_app(app_id)
                    if record is None:
                        continue
                    decision = decide_warm_backups(
                        record, [k for k in to_load if k[0] == app_id],
                        [k for k in to_unload if k[0] == app_id], self.families)
                    await ex.commit(decision)
                    decisions.append(decision)
            summary = self._summary(plan, decisions)
            await self.store.put_plan(summary)
        logger.info("warm plan: %d backups (%d new, %d removed), %d uncovered, %s in %.3f s",
                    len(desired), summary["loads"], summary["unloads"], len(plan.uncovered),
                    plan.stats.status, plan.stats.total_s)
        await asyncio.gather(*(ex.run(d.stages) for d in decisions))
        return summary

    def _summary(self, plan: WarmPlan, decisions: list[Decision]) -> dict[str, Any]:
        actions = [a for d in decisions for s in d.stages for a in s.actions]
        loads = sum(isinstance(a, LoadVariant) for a in actions)
        return {
            "solved_at": self.clock.time(), "policy": self.config().policy,
            "assignments": [{"app_id": a.app_id, "server_id": a.server_id,
                             "variant": a.variant, "accuracy": a.accuracy}
                            for a in plan.assignments],
            "uncovered": [{"app_id": u.app_id, "reason": u.reason} for u in plan.uncovered],
            "stats": {"method": plan.stats.method, "solver": plan.stats.solver,
                      "status": plan.stats.status, "objective": plan.stats.objective,
                      "bound": plan.stats.bound, "gap": plan.stats.gap,
                      "build_s": plan.stats.build_s, "solve_s": plan.stats.solve_s,
                      "total_s": plan.stats.total_s, "notes": list(plan.stats.notes)},
            "loads": loads, "unloads": len(actions) - loads}
