"""A server failed: its warm switches at once, its cold recoveries in a shared planning round.

1. **The switch** (:meth:`Failovers.switch`) holds the locks of the apps on the failed server
   only (the record cache's index finds them), not the planning lock, and builds no snapshot
   of the cluster: the server is marked failed, each app served there with a live warm backup
   switches to it, and its clients hear. Its cost does not grow with the cluster, and it
   never waits for a plan being made (a warm re-plan, another failure's cold round).
2. **The cold round** (:meth:`Failovers.recover`): every switched failure not yet planned
   joins the next round. A round holds the planning lock, builds one snapshot (in a thread on
   a large cluster, so the loop keeps switching the other servers of a failing site), asks
   the policy for one plan for all of its servers, and commits it under the locks of the apps
   it touches, after checking that no server it loads onto failed meanwhile. The round's
   loads run outside the lock: the next round plans while they load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.decide.decision import Decision
from controller.decide.failover import (
    choose_warm_switches,
    decide_cold_batch,
    decide_servers_failed,
)
from controller.declarations import Declaration, DeclarationLog
from controller.executor import Executor
from controller.interfaces import AgentLink, Clock, FailureWatch, RecordStore
from controller.metrics import Metrics
from controller.record_cache import RecordsView
from controller.records import AppRecord, ServerRecord, ServerState
from controller.snapshot import build_snapshot, free_memory_mb
from policies.actions import FailoverPlan, WarmSwitch
from policies.model import Family, Role
from policies.policy import FailoverPolicy

logger = logging.getLogger(__name__)

INLINE_PLAN_WORK = 2_000
"""apps x servers up to which a round is planned on the event loop: a plan this size takes
about a millisecond; a larger one (its snapshot too) goes to a thread so that the loop keeps
switching the other failed servers and answering the API."""

SWITCH_GATHER_S = 0.002
"""How long the first declaration of a burst waits for the others, to switch them together."""

SWITCH_GATHER_MAX_S = 0.012
"""The longest a burst that keeps growing is gathered before its switches go out."""

STALE_PLAN_RETRIES = 3
"""Rounds planned again when a server the plan loads onto failed while it was made."""


@dataclass(frozen=True)
class _SwitchRequest:
    server_id: str
    reason: str
    detected_at: float
    resuming: bool
    done: asyncio.Future[Failure | None]


@dataclass
class Failure:
    """One declared server on its way through a failover."""

    server_id: str
    reason: str
    detected_at: float
    intent: str | None
    declaration: Declaration | None
    switched: frozenset[str]
    """Apps switched to a warm backup."""
    release_urgent: Callable[[], None] = lambda: None
    """Ends the executor's urgent-work mark (once the cold round is committed)."""
    recovered: set[str] = field(default_factory=set)
    """Apps the cold round recovers or gives up (the declaration's moved apps)."""
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class Failovers:
    """Switches failed servers' apps to their warm backups and plans the rest in rounds."""

    def __init__(self, executor: Executor, store: RecordStore, agents: AgentLink,
                 watch: FailureWatch, families: Mapping[str, Family],
                 policy: Callable[[], FailoverPolicy], metrics: Metrics, clock: Clock,
                 replan_warm: Callable[[], Awaitable[Any]],
                 declarations: DeclarationLog | None = None) -> None:
        self.executor = executor
        self.store = store
        self.agents = agents
        self.watch = watch
        self.families = families
        self.policy = policy
        self.metrics = metrics
        self.clock = clock
        self.replan_warm = replan_warm
        self.declarations = declarations
        self.last_seen: dict[str, float] = {}
        """When each declared server was last heard from (for its declaration)."""
        self._waiting: dict[str, Failure] = {}
        self._rounds: asyncio.Task[Any] | None = None
        self._to_switch: list[_SwitchRequest] = []
        self._switcher: asyncio.Task[Any] | None = None
        self._switching = 0
        self._no_switching = asyncio.Event()
        """Set while no switch is in progress: a round waits for it (see _run_rounds)."""
        self._no_switching.set()

    # --- 1. the switch -----------------------------------------------------------------------

    async def switch(self, server_id: str, reason: str, detected_at: float,
                     resuming: bool) -> Failure | None:
        """Mark the server failed and switch its apps with a live warm backup.

        Servers declared together (a site: the monitor reports them in one burst) switch
        together: one set of locks, one decision, one write, one push of events.

        None when there is nothing to do: the server is unknown, or not in the state
        expected (``resuming``: already failed), or heard from again (a false alarm, logged
        as a cancelled declaration).
        """
        ex = self.executor
        self._switching += 1
        self._no_switching.clear()
        release_urgent = ex.hold_urgent()  # until the failure's cold round is committed
        request = _SwitchRequest(server_id, reason, detected_at, resuming,
                                 asyncio.get_running_loop().create_future())
        self._to_switch.append(request)
        if self._switcher is None or self._switcher.done():
            self._switcher = ex.spawn(self._switch_queued(), "warm switches")
        failure: Failure | None = None
        try:
            failure = await request.done
            if failure is not None:
                failure.release_urgent = release_urgent
            return failure
        finally:
            self._switching -= 1
            if not self._switching:
                self._no_switching.set()
            if failure is None:
                release_urgent()

    async def _switch_queued(self) -> None:
        while self._to_switch:
            await self._gather_burst()
            queued, self._to_switch = self._to_switch, []
            first: dict[str, _SwitchRequest] = {}
            for request in queued:
                if request.server_id in first:
                    request.done.set_result(None)  # declared twice: one failover
                else:
                    first[request.server_id] = request
            for resuming in (False, True):
                group = [r for r in first.values() if r.resuming is resuming]
                if not group:
                    continue
                try:
                    failures = await self._switch_together(group)
                except BaseException as exc:
                    for request in group:
                        if not request.done.done():
                            request.done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for request in group:
                    if not request.done.done():
                        request.done.set_result(failures.get(request.server_id))

    async def _gather_burst(self) -> None:
        """Wait while declarations keep arriving (a site's), at most SWITCH_GATHER_MAX_S.

        The monitor's reports can reach this loop in more than one read; a lone failure
        waits SWITCH_GATHER_S once.
        """
        seen, waited = 0, 0.0
        while len(self._to_switch) > seen and waited < SWITCH_GATHER_MAX_S:
            seen = len(self._to_switch)
            await asyncio.sleep(SWITCH_GATHER_S)
            waited += SWITCH_GATHER_S

    async def _switch_together(self, requests: list[_SwitchRequest]) -> dict[str, Failure]:
        """The switches of ``requests``' servers under the locks of every app on them."""
        on: dict[str, list[str]] = {r.server_id: await self.store.apps_on(r.server_id)
                                    for r in requests}
        app_ids = sorted({a for ids in on.values() for a in ids})
        while True:
            async with self.executor.locks.apps(app_ids):
                on = {s: await self.store.apps_on(s) for s in on}
                now_on = {a for ids in on.values() for a in ids}
                if now_on <= set(app_ids):
                    return await self._switch_locked(requests, on)
            # An app got a replica there while we waited: take its lock too, in id order.
            app_ids = sorted(set(app_ids) | now_on)

    async def _switch_locked(self, requests: list[_SwitchRequest],
                             on: dict[str, list[str]]) -> dict[str, Failure]:
        locked_at = self.clock.time()
        all_servers = await self.store.server_records()  # read-only; no view of the apps
        failing: list[_SwitchRequest] = []
        for request in requests:
            server = all_servers.get(request.server_id)
            if server is None or (server.state is ServerState.FAILED) is not request.resuming:
                continue
            if self.watch.watching(request.server_id):
                # Heard from again while this task waited for the locks: not failed.
                logger.warning("server %s is alive again; failover cancelled", request.server_id)
                self.watch.false_alarm(request.server_id)
                if not request.resuming:
                    await self._declared([(server, request.reason, request.detected_at,
                                           on[request.server_id])], cancelled=True)
                continue
            failing.append(request)
        if not failing:
            return {}
        down = {r.server_id for r in failing}
        live = {s for s, r in all_servers.items() if r.state is ServerState.UP and s not in down}
        site_of = {s: r.site_id for s, r in all_servers.items()}
        switches: dict[str, tuple[WarmSwitch, ...]] = {}
        for request in failing:
            # Decided on the shared read-only records; only the apps that switch are copied.
            looked = {a: r for a in on[request.server_id]
                      if (r := await self.store.app_record(a)) is not None}
            free = await self._free_memory(_tied_candidates(looked, request.server_id, live),
                                           all_servers)
            switches[request.server_id] = choose_warm_switches(
                looked, request.server_id, live, self.families, _lookup(free), site_of)
        apps = {w.app_id: r for chosen in switches.values() for w in chosen
                if (r := await self.store.get_app(w.app_id)) is not None}
        servers: dict[str, ServerRecord] = dict(all_servers)
        for server_id in down:
            servers[server_id] = ServerRecord.model_validate(all_servers[server_id].model_dump())
        failed = decide_servers_failed(
            apps, servers, [(r.server_id, r.reason, r.detected_at) for r in failing],
            {s: self.agents.connected(s) for s in down}, switches, self.clock.time())
        intent = await self.executor.commit(failed)
        moved = {r.server_id: frozenset(w.app_id for w in switches[r.server_id]
                                        if w.app_id in apps) for r in failing}
        for request in failing:
            self._announced(request.server_id, len(moved[request.server_id]),
                            request.detected_at, locked_at)
        # Logged once the warm switches are out, all in one write.
        declarations = await self._declared(
            [(all_servers[r.server_id], r.reason, r.detected_at, on[r.server_id])
             for r in failing if not r.resuming])
        return {r.server_id: Failure(r.server_id, r.reason, r.detected_at, intent,
                                     declarations.get(r.server_id), moved[r.server_id])
                for r in failing}

    async def _free_memory(self, server_ids: set[str],
                           servers: Mapping[str, ServerRecord]) -> dict[str, float]:
        free = {}
        for server_id in server_ids:
            records = [r for a in await self.store.apps_on(server_id)
                       if (r := await self.store.app_record(a)) is not None]
            free[server_id] = free_memory_mb(servers[server_id], records, self.families)
        return free

    def _announced(self, server_id: str, switched: int, detected_at: float,
                   locked_at: float) -> None:
        """Log and count the warm switches just written and pushed to the clients."""
        now = self.clock.time()
        logger.info("failover of %s: %d warm switches announced %.1f ms after detection "
                    "(%.1f ms waiting for the apps' locks)", server_id, switched,
                    (now - detected_at) * 1000, (locked_at - detected_at) * 1000)
        for _ in range(switched):
            self.metrics.failovers.labels("warm").inc()
            self.metrics.mttr.labels("warm").observe(now - detected_at)

    async def _declared(self, found: list[tuple[ServerRecord, str, float, list[str]]],
                        cancelled: bool = False) -> dict[str, Declaration]:
        """Log the declarations (true or false: the log keeps every one), in one write.

        ``found``: (server, reason, detection time, apps affected) of each; returns them by
        server.
        """
        if self.declarations is None:
            return {}
        stored = await self.declarations.add_many(
            [self._declaration(server, reason, at, affected, cancelled)
             for server, reason, at, affected in found])
        return {d.server_id: d for d in stored}

    def _declaration(self, server: ServerRecord, reason: str, detected_at: float,
                     affected: list[str], cancelled: bool = False) -> Declaration:
        last_seen = self.last_seen.pop(server.server_id, detected_at)
        return Declaration(server_id=server.server_id, site_id=server.site_id, reason=reason,
                           detected_at=detected_at, last_seen=last_seen,
                           boot_id=server.boot_id, apps_affected=sorted(affected),
                           cancelled=cancelled)

    # --- 2. the cold round -------------------------------------------------------------------

    async def recover(self, failure: Failure) -> None:
        """Join the next cold round; return once its loads are done and the warm plan redone."""
        self._waiting[failure.server_id] = failure
        if self._rounds is None or self._rounds.done():
            self._rounds = self.executor.spawn(self._run_rounds(), "failover rounds")
        await failure.done

    async def _run_rounds(self) -> None:
        while self._waiting:
            # Switches first: a site's servers are declared within milliseconds of each
            # other, and a round planning meanwhile (a thread holding the GIL half the time)
            # would slow every switch still to come; waiting also puts them all in one round.
            await self._no_switching.wait()
            async with self.executor.locks.plan:
                batch, self._waiting = self._waiting, {}
                try:
                    cold, plan = await self._round(batch)
                except BaseException as exc:
                    _release_urgent(batch)
                    for failure in batch.values():
                        if not failure.done.done():
                            failure.done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
            _release_urgent(batch)  # the round's own urgent loads take over from here
            if batch:
                self.executor.spawn(self._finish(batch, cold, plan),
                                    f"cold recoveries of {_names(batch)}")

    async def _round(self, batch: dict[str, Failure]) -> tuple[Decision, FailoverPlan]:
        """Plan and commit one round (hold the planning lock)."""
        for attempt in range(STALE_PLAN_RETRIES + 1):
            view = await self.store.view()
            for server_id in [s for s in batch if (found := view.servers.get(s)) is None
                              or found.state is not ServerState.FAILED]:
                # Taken back (a false alarm) before its round: nothing of it to recover, and
                # planning it as failed would drop what the take-back just re-adopted.
                logger.info("failover of %s: taken back before its cold round", server_id)
                gone = batch.pop(server_id)
                _release_urgent({server_id: gone})
                gone.done.set_result(None)
            if not batch:
                return Decision(), FailoverPlan(failed_servers=frozenset(), warm_switches=(),
                                                recoveries=(), unrecoverable=())
            plan, snapshot_primaries, planned_ms = await self._plan(view, sorted(batch))
            touched = {r.app_id for r in plan.recoveries} | \
                {u.app_id for u in plan.unrecoverable} | {p.app_id for p in plan.preempted}
            for server_id in batch:
                touched |= set(await self.store.apps_on(server_id))
            async with self.executor.locks.apps(touched):
                fresh = (await self.store.view()).servers
                lost = sorted({r.server_id for r in plan.recoveries} - {
                    s for s, r in fresh.items() if r.state is ServerState.UP})
                if lost and attempt < STALE_PLAN_RETRIES:
                    logger.warning("failover of %s: %s failed while it was planned; planning "
                                   "again", _names(batch), ", ".join(lost))
                    batch.update(self._waiting)
                    self._waiting = {}
                    continue
                apps = {a: r for a in sorted(touched)
                        if (r := await self.store.get_app(a)) is not None}
                cause = {a: s for a, s in snapshot_primaries.items() if s in batch}
                cold = decide_cold_batch(
                    apps, plan, {s: f.detected_at for s, f in batch.items()}, cause,
                    self.families, self.clock.time(), fresh)
                await self.executor.commit(cold)
            break
        late = [e for e in cold.events if e.kind == "warm_switch"]
        late_ids = {e.app_id for e in late}
        for app_id, recovery in cold.recoveries.items():
            failure = batch.get(recovery.failed_server)
            if failure is not None and (app_id in cause or app_id in late_ids):
                failure.recovered.add(app_id)
        now = self.clock.time()
        for event in late:
            self.metrics.failovers.labels("warm").inc()
            self.metrics.mttr.labels("warm").observe(now - (event.failure_at or now))
        if late:
            logger.warning("failover of %s: %d late warm switches (%s): their backups were "
                           "written after the switch read them", _names(batch), len(late),
                           ", ".join(e.app_id for e in late))
        self.metrics.failovers.labels("progressive").inc(len(plan.recoveries))
        self.metrics.failovers.labels("unrecoverable").inc(len(plan.unrecoverable))
        logger.info("failover of %s planned in %.1f ms (%d servers, %d progressive, "
                    "%d unrecoverable, %d late warm switches)", _names(batch), planned_ms,
                    len(batch), len(plan.recoveries), len(plan.unrecoverable), len(late))
        return cold, plan

    async def _plan(self, view: RecordsView, failed: list[str]
                    ) -> tuple[FailoverPlan, dict[str, str], float]:
        """The policy's plan on a snapshot of ``view``, with what it took to make.

        Also returns each app's serving server before the failures and the milliseconds the
        snapshot and the plan took.
        """
        asked = self.clock.monotonic()
        policy = self.policy()

        def plan() -> tuple[FailoverPlan, dict[str, str], float, float]:
            cpu = time.thread_time()
            snapshot = build_snapshot(self.families, view.servers, view.apps)
            built_at = self.clock.monotonic()
            primaries = {a: p.server_id for a, p in snapshot.primary_by_app.items()
                         if p.server_id in failed}
            made = policy.plan_failover(snapshot, failed)
            return made, primaries, built_at, time.thread_time() - cpu

        if len(view.apps) * len(view.servers) <= INLINE_PLAN_WORK:
            made, primaries, built_at, cpu_s = plan()
        else:
            made, primaries, built_at, cpu_s = await asyncio.to_thread(plan)
        planned_s = self.clock.monotonic() - asked
        self.metrics.failover_plan.observe(planned_s)
        logger.info("failover of %s: snapshot %.1f ms, then plan %.1f ms (%.1f ms of CPU)",
                    _names(dict.fromkeys(failed)), (built_at - asked) * 1000,
                    (asked + planned_s - built_at) * 1000, cpu_s * 1000)
        return made, primaries, planned_s * 1000

    async def _finish(self, batch: dict[str, Failure], cold: Decision,
                      plan: FailoverPlan) -> None:
        """The round's loads, the warm re-plan, then each failure is done."""
        try:
            for failure in batch.values():
                if failure.declaration is not None and self.declarations is not None:
                    await self.declarations.update(failure.declaration.seq, apps_moved=sorted(
                        failure.switched | failure.recovered))
            await self.executor.act(cold)
            try:
                await self.replan_warm()
            except Exception:  # noqa: BLE001 - the recoveries are done; the planner retries
                logger.exception("warm re-plan after the failover of %s failed", _names(batch))
            # Servers switched together share one intent.
            for intent in {f.intent for f in batch.values() if f.intent is not None}:
                await self.store.done_intent(intent)
        except BaseException as exc:
            for failure in batch.values():
                if not failure.done.done():
                    failure.done.set_exception(exc)
            raise
        for failure in batch.values():
            if not failure.done.done():
                failure.done.set_result(None)


def _lookup(free: Mapping[str, float]) -> Callable[[str], float]:
    """A server's free memory from ``free`` (0 when it was not worked out)."""
    return lambda server_id: free.get(server_id, 0.0)


def _release_urgent(batch: Mapping[str, Failure]) -> None:
    for failure in batch.values():
        failure.release_urgent()


def _tied_candidates(apps: Mapping[str, AppRecord], server_id: str, live: set[str]) -> set[str]:
    """Servers of the warm backups of apps served from ``server_id`` that have more than one.

    Only between those can the choice come down to free memory.
    """
    servers: set[str] = set()
    for record in apps.values():
        if record.serving is None or record.serving[0] != server_id:
            continue
        warm = {r.server_id for r in record.replicas if r.role is Role.WARM
                and r.server_id in live}
        if len(warm) > 1:
            servers |= warm
    return servers


def _names(batch: Mapping[str, Any]) -> str:
    """The servers of a round, for the log (one token)."""
    names = sorted(batch)
    return "+".join(names[:3]) + (f"+{len(names) - 3}more" if len(names) > 3 else "")
