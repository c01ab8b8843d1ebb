"""Keeps every app's extra instances and parity models where its protection asks for them.

A loop, like the orchestrator's convergence: whenever the records changed since its last pass
(a registration, a replica that became ready, a failure that forgot replicas), it decides for
each app that asks for instances or parity models (``controller.decide.protection``) under the
planning lock and the apps' locks, on a snapshot rebuilt after each app's commit (one app's new
replicas take room the next one cannot have), and hands the loads and unloads to the executor.
A server failure needs nothing of its own here: the failover forgets the replicas the server
held, and the next pass places them again elsewhere, which is the parity models' (and the extra
instances') failover.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace

from controller.decide.decision import Decision, event_for
from controller.decide.protection import REMOVED_EVENTS, decide_protection, wants_protection
from controller.executor import Executor
from controller.interfaces import Clock, RecordStore
from controller.records import AppRecord, Replica, ServerRecord
from controller.snapshot import build_snapshot
from policies.errors import PolicyError
from policies.model import Family, Role
from understudy.wire.protocol import ModelState

logger = logging.getLogger(__name__)

INTERVAL_S = 0.5


class ProtectionKeeper:
    """Converges the apps' instances and parity models to their specs."""

    def __init__(self, executor: Executor, store: RecordStore, families: Mapping[str, Family],
                 clock: Clock) -> None:
        self.executor = executor
        self.store = store
        self.families = families
        self.clock = clock
        self._unplaced: dict[str, tuple[str, ...]] = {}
        self._seen: dict[str, set[tuple[Role, str, str]]] = {}
        """Per app, the instances and parity models it held at the last pass: one the failover
        forgot since (with its server) is announced removed, so the gateways stop sending."""

    async def run_forever(self, interval_s: float = INTERVAL_S) -> None:
        """A pass every ``interval_s`` when the records changed; a failed pass is logged."""
        converged_at: int | None = None
        while True:
            await asyncio.sleep(interval_s)
            try:
                revision = await self.store.revision()
                if revision != converged_at:
                    await self.converge()
                    converged_at = revision
            except Exception:  # noqa: BLE001 - keep converging (Redis restarting ...)
                logger.exception("protection pass failed")

    async def converge(self) -> int:
        """One pass over the apps that ask for protection; the number of decisions made."""
        view = await self.store.view()
        todo = sorted(a for a, record in view.apps.items() if wants_protection(record))
        if not todo:
            return 0
        ex = self.executor
        decisions = []
        async with ex.locks.plan, ex.locks.apps(todo):
            for app_id in todo:
                now = await self.store.view()
                record = await self.store.get_app(app_id)
                if record is None:
                    self._seen.pop(app_id, None)
                    continue
                vanished = self._seen.get(app_id, set()) - _held(record)
                try:
                    snapshot = build_snapshot(self.families, now.servers, now.apps)
                    decision, unplaced = decide_protection(record, snapshot, now.servers,
                                                           self.families, self.clock.time())
                except PolicyError as exc:
                    logger.warning("protection of %s: %s", app_id, exc)
                    continue
                if unplaced and self._unplaced.get(app_id) != unplaced:
                    logger.warning("protection of %s: %s", app_id, "; ".join(unplaced))
                self._unplaced[app_id] = unplaced
                self._seen[app_id] = _held(record)
                if vanished:
                    decision = _announce(record, vanished, now.servers, self.clock.time(),
                                         decision)
                if decision is None:
                    continue
                await ex.commit(decision)
                decisions.append(decision)
                for note in decision.notes:
                    logger.info("protection: %s", note)
        for decision in decisions:
            if decision.stages:
                ex.spawn(ex.act(decision), "protection")
        return len(decisions)


def _held(record: AppRecord) -> set[tuple[Role, str, str]]:
    return {(r.role, r.server_id, r.variant) for r in record.replicas
            if r.role in REMOVED_EVENTS and r.state is not ModelState.UNLOADING}


def _announce(record: AppRecord, vanished: set[tuple[Role, str, str]],
              servers: Mapping[str, ServerRecord], now: float,
              decision: Decision | None) -> Decision:
    """``decision`` (or none) with the removal of replicas forgotten elsewhere announced."""
    events = tuple(event_for(record, REMOVED_EVENTS[role], Replica(
        server_id=server_id, variant=variant, role=role), "its server failed", servers, None,
        now) for role, server_id, variant in sorted(vanished))
    if decision is None:
        return Decision(events=events)
    return replace(decision, events=decision.events + events)
