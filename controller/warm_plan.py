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
from controller.record_cache import RecordsView
from controller.records import RuntimeConfig, ServerState
from controller.snapshot import build_snapshot, warm_backups
from policies.actions import LoadVariant, WarmPlan
from policies.model import Family
from policies.policy import FailoverPolicy

logger = logging.getLogger(__name__)

WARM_REPLAN_DEBOUNCE_S = 0.3
"""A requested re-plan starts this long after the first request. Requests come in bursts
(registrations, the switches and interims of one failure), and a failover's switches
promote replicas that served nothing a moment ago while their apps' first requests are on the
way: the re-plan's solve runs in the controller, above inference, and its backup loads run at
the loads' raised priority (``model_repo/runtime.py``), so on a server (or a one-machine
testbed) they share, starting them at once delays those first answers."""
RETRY_MAX_S = 60.0
"""Longest wait before a failed re-plan is tried again (doubling from 2 s)."""
OPTIMISTIC_SOLVES = 3
"""Solves outside the planning lock before one is made under it."""
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
        failures = 0
        while self._pending:
            await asyncio.sleep(WARM_REPLAN_DEBOUNCE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.executor.no_urgent_loads.wait(), URGENT_HOLD_MAX_S)
            self._pending = False
            waiters, self._waiters = self._waiters, []
            try:
                await self.replan()
            except Exception as exc:  # noqa: BLE001 - told to the waiters; tried again
                failures += 1
                retry_s = min(RETRY_MAX_S, 2.0 ** failures)
                logger.exception("warm re-plan failed (%d in a row); trying again in %.0f s",
                                 failures, retry_s)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                await asyncio.sleep(retry_s)
                self._pending = True  # the apps it was for are still uncovered
                continue
            failures = 0
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def replan(self) -> dict[str, Any]:
        """Solve the warm-backup plan and converge the warm replicas to it.

        The solve runs outside the planning lock, on the records as they were: a failover's
        cold round or a placement need not wait for it. The plan is applied under the lock
        if no server changed meanwhile (:func:`servers_unchanged`; otherwise it is solved
        again, and after ``OPTIMISTIC_SOLVES`` tries under the lock, so it always ends), minus
        what apps written meanwhile would make wrong (:meth:`_apply`).
        """
        ex = self.executor
        for _ in range(OPTIMISTIC_SOLVES):
            view = await self.store.view()
            plan = await self._solve(view)
            async with ex.locks.plan:
                fresh = await self.store.view()
                if servers_unchanged(view, fresh):
                    summary, decisions = await self._apply(plan, view, fresh)
                    break
            logger.info("a server failed or shrank while the warm plan was solved; solving again")
        else:
            async with ex.locks.plan:
                view = await self.store.view()
                plan = await self._solve(view)
                summary, decisions = await self._apply(plan, view, await self.store.view())
        logger.info("warm plan: %d backups (%d new, %d removed), %d uncovered, %s in %.3f s",
                    len(plan.assignments), summary["loads"], summary["unloads"],
                    len(plan.uncovered), plan.stats.status, plan.stats.total_s)
        await asyncio.gather(*(ex.run(d.stages) for d in decisions))
        return summary

    async def _solve(self, view: RecordsView) -> WarmPlan:
        """The policy's warm plan for the records of ``view`` (snapshot and solve in a thread)."""
        policy = self.policy()

        def solve() -> WarmPlan:
            return policy.plan_warm(build_snapshot(self.families, view.servers, view.apps))

        started = self.clock.monotonic()
        plan = await asyncio.to_thread(solve)
        self.metrics.solve.observe(self.clock.monotonic() - started)
        return plan

    async def _apply(self, plan: WarmPlan, solved_on: RecordsView, now: RecordsView
                     ) -> tuple[dict[str, Any], list[Decision]]:
        """Commit the loads and unloads that bring the records to ``plan`` (hold the lock).

        What changed since the solve is left for the next re-plan (requested here): an app
        written meanwhile gets no load or unload, and no backup loads onto a server where
        such an app holds something or where an unload is held back (the plan counted the
        room as it was).
        """
        ex = self.executor
        desired = {(a.app_id, a.server_id, a.variant) for a in plan.assignments}
        live = [s for s, r in now.servers.items() if r.state is ServerState.UP]
        current = warm_backups(now.apps, live)
        changed, dirty = changed_since(solved_on, now)
        to_unload = sorted(current - desired)
        dirty |= {server for app, server, _ in to_unload if app in changed}
        to_unload = [k for k in to_unload if k[0] not in changed]
        to_load = sorted(k for k in desired - current
                         if k[0] not in changed and k[1] not in dirty)
        held_back = len(desired - current) - len(to_load)
        decisions: list[Decision] = []
        # Each app's record is read again and written under its own lock: a load that
        # finished meanwhile (under the app's lock, not the planning lock) wrote a newer
        # record, which writing an older copy back would undo.
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
        summary["held_back"] = held_back
        await self.store.put_plan(summary)
        if held_back or len(to_unload) < len(current - desired):
            logger.info("warm plan: %d backups held back (their records changed during the "
                        "solve); re-planning", held_back)
            self.request()
        return summary, decisions

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


def servers_unchanged(solved_on: RecordsView, now: RecordsView) -> bool:
    """Whether every server the plan could use is as it was (still up, same capacity).

    A server that joined or came back since is merely room the plan does not use yet (the
    re-plan its arrival requested will); one that failed or shrank makes the plan wrong.
    """
    for server_id, before in solved_on.servers.items():
        after = now.servers.get(server_id)
        if before is after or before.state is not ServerState.UP:
            continue
        if after is None or after.state is not ServerState.UP or \
                before.capacity != after.capacity:
            return False
    return True


def changed_since(solved_on: RecordsView, now: RecordsView) -> tuple[set[str], set[str]]:
    """The apps written since ``solved_on`` and the servers they held replicas on, then or now.

    A plan solved on the older records counted their room as it was then.
    """
    changed = {a for a in now.app_ids if solved_on.apps.get(a) is not now.apps[a]}
    changed |= {a for a in solved_on.app_ids if a not in now.apps}
    servers: set[str] = set()
    for app_id in changed:
        for record in (solved_on.apps.get(app_id), now.apps.get(app_id)):
            if record is not None:
                servers |= {r.server_id for r in record.replicas}
    return changed, servers
