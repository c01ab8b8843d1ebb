"""Convergence as a contract: a loop that checks agents against records and repairs.

The event-driven paths (failover, take-back, fail-back, the warm re-plan) handle what they
are told about. This loop catches what none of them was told about, so that every server
ends up holding exactly what the records say, and every app its best placement:

* **Agents against records.** Each live server's inventory is compared with the records of
  the apps on it (``decide.reconcile.find_discrepancies``): strays (models no record
  accounts for), replicas recorded ready that the server lost, loads and unloads that nothing
  carries out any more. A discrepancy is repaired only once two checks a period apart both
  saw it, with nothing in flight for it either time, and it still holds under the apps'
  locks; each repair is logged and counted (``understudy_repairs_total``).
* **Degraded apps.** An app served below its home variant while its home is down gets a
  more accurate target where one fits (``decide.reconcile.decide_upgrades``), once nothing
  more urgent is under way. Apps whose home is up are brought home by fail-back.

Servers are checked round-robin, each about every ``period_s``, and never more than
``max_checks_per_s`` a second (at 1,000 servers an inventory round trip per server every few
seconds would cost the controller more than the heartbeats do).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping

from controller.decide.reconcile import (
    Finding,
    decide_repairs,
    decide_upgrades,
    find_discrepancies,
    upgrade_candidates,
)
from controller.errors import AgentCommandError, AgentUnavailableError
from controller.executor import Executor
from controller.interfaces import AgentLink, RecordStore
from controller.metrics import Metrics
from controller.records import AppRecord, ServerState
from controller.snapshot import build_snapshot
from policies.model import Family
from understudy.wire.protocol import InventoryItem

logger = logging.getLogger(__name__)

PERIOD_S = 5.0
"""Each live server's inventory is checked about this often (small clusters)."""
MAX_CHECKS_PER_S = 20.0


class Reconciler:
    """Checks agents against the records and degraded apps against what they could have."""

    def __init__(self, executor: Executor, store: RecordStore, agents: AgentLink,
                 families: Mapping[str, Family], metrics: Metrics, *,
                 busy: Callable[[str], bool] = lambda server_id: False,
                 period_s: float = PERIOD_S,
                 max_checks_per_s: float = MAX_CHECKS_PER_S) -> None:
        self.executor = executor
        self.store = store
        self.agents = agents
        self.families = families
        self.metrics = metrics
        self.busy = busy
        """Servers another path is converging right now (a revival's take-back)."""
        self.period_s = period_s
        self.max_checks_per_s = max_checks_per_s
        self._suspects: dict[str, set[Finding]] = {}
        self._due: deque[str] = deque()
        self._upgrades_clear_at: int | None = None

    async def run_forever(self, tick_s: float = 1.0) -> None:
        """One :meth:`tick` a ``tick_s``; a failed tick is logged and the loop goes on."""
        while True:
            await asyncio.sleep(tick_s)
            try:
                await self.tick(tick_s)
            except Exception:  # noqa: BLE001 - keep converging (Redis restarting ...)
                logger.exception("reconciler pass failed")

    async def tick(self, tick_s: float) -> list[Finding]:
        """Check the servers due now, then the degraded apps; returns the repairs made."""
        servers = await self.store.server_records()
        live = sorted(s for s, r in servers.items()
                      if r.state is ServerState.UP and self.agents.connected(s))
        for gone in set(self._suspects) - set(live):
            del self._suspects[gone]
        if not self._due:
            self._due.extend(live)
        count = min(len(self._due), max(1, math.ceil(len(live) * tick_s / self.period_s)),
                    max(1, int(self.max_checks_per_s * tick_s)))
        batch = [self._due.popleft() for _ in range(count)]
        alive = set(live)
        results = await asyncio.gather(*(self.check_server(s) for s in batch if s in alive))
        await self.improve_degraded()
        return [finding for repaired in results for finding in repaired]

    async def check_server(self, server_id: str) -> list[Finding]:
        """Compare one server's inventory with the records; repair what is confirmed.

        The records are read before the inventory: a model loaded in between is then in
        the inventory and not in the records read, and is checked again under the locks.
        """
        if self.busy(server_id):
            return []
        records = [r for a in await self.store.apps_on(server_id)
                   if (r := await self.store.app_record(a)) is not None]
        in_flight = self.executor.in_flight()
        try:
            inventory = await self.agents.inventory(server_id)
        except (AgentUnavailableError, AgentCommandError) as exc:
            logger.debug("reconciler: inventory of %s: %s", server_id, exc)
            return []
        if self.busy(server_id):
            return []
        in_flight |= self.executor.in_flight()
        found = find_discrepancies(records, server_id, inventory, in_flight)
        confirmed = found & self._suspects.get(server_id, set())
        self._suspects[server_id] = found - confirmed
        if not confirmed:
            return []
        return await self._repair(server_id, confirmed, inventory)

    async def _repair(self, server_id: str, confirmed: set[Finding],
                      inventory: list[InventoryItem]) -> list[Finding]:
        ex = self.executor
        # Under the planning lock no app gains a replica on the server (every load is decided
        # under it), so the records read now are the ones the repairs are checked against.
        async with ex.locks.plan:
            app_ids = set(await self.store.apps_on(server_id)) | {f.app_id for f in confirmed}
            async with ex.locks.apps(app_ids):
                apps: dict[str, AppRecord] = {
                    a: r for a in sorted(app_ids) if (r := await self.store.get_app(a))}
                decision, repaired = decide_repairs(apps, server_id, confirmed, inventory,
                                                    ex.in_flight())
                await ex.commit(decision)
        for finding in repaired:
            self.metrics.repairs.labels(finding.kind.value).inc()
            logger.warning("reconciler: %s", finding.describe())
        ex.spawn(ex.act(decision), f"repairs on {server_id}")
        return repaired

    async def improve_degraded(self) -> bool:
        """Load better targets for degraded apps whose home is down; True when any was.

        Not while urgent work is under way (a failover's own recovery comes first), and not
        again before the records change once a look found nothing to do.
        """
        ex = self.executor
        if not ex.no_urgent_loads.is_set():
            return False
        view = await self.store.view()
        if view.revision == self._upgrades_clear_at:
            return False
        live = {s for s, r in view.servers.items()
                if r.state is ServerState.UP and self.agents.connected(s)}
        candidates = upgrade_candidates(view.apps.values(), live, self.families)
        decision = None
        if candidates:
            async with ex.locks.plan, ex.locks.apps(candidates):
                # The snapshot from the shared read-only records, as a failover builds it:
                # its part cache is keyed by those objects, and a snapshot of private copies
                # would rebuild every app's part here and again at the next failover.
                now = await self.store.view()
                snapshot = build_snapshot(self.families, now.servers, now.apps,
                                          failed=set(now.servers) - live)
                apps = {a: r for a in candidates if (r := await self.store.get_app(a))}
                decision = decide_upgrades(apps, snapshot, self.families)
                if decision is not None:
                    await ex.commit(decision)
        if decision is None:
            self._upgrades_clear_at = view.revision
            return False
        for note in decision.notes:
            self.metrics.repairs.labels("upgrade").inc()
            logger.warning("reconciler: %s", note)
        ex.spawn(ex.act(decision), "upgrades of degraded apps")
        return True
