"""Apps: registration, primary placement, deletion, and the convergence safety net.

Every decision here is made in ``controller.decide.apps`` on records read under the locks and
applied by the executor; this module reads, locks and hands over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set

from controller.decide.apps import decide_delete, decide_place_many, needs_placement
from controller.decide.decision import Decision, event_for
from controller.decide.failover import decide_outage_recovery
from controller.errors import (
    ConflictError,
    InvalidBatchError,
    InvalidRequestError,
    NotFoundError,
)
from controller.executor import Executor
from controller.interfaces import Clock, RecordStore
from controller.records import AppRecord, AppSpec, RuntimeConfig, ServerRecord
from controller.snapshot import build_snapshot
from parity.artifacts import parity_name
from policies.baselines import FullSizeWarmK
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot, Family, Variant
from policies.resources import Resources

logger = logging.getLogger(__name__)

HeldVariants = Callable[[], Awaitable[Set[str] | None]]
"""The variants the controller's artifact store holds (``ArtifactCatalog.variants``); ``None``
when it serves no store (the agents have their own source: nothing to check)."""


async def _no_store() -> None:
    return None


def policy_for(config: RuntimeConfig) -> UnderstudyPolicy | FullSizeWarmK:
    """The failover policy a runtime configuration names."""
    site_independent = None if config.site_independent == "auto" else config.site_independent
    warm = WarmPlanConfig(alpha=config.alpha, replicas=config.warm_replicas,
                          site_independent=site_independent, solver=config.solver,
                          time_limit_s=config.time_limit_s, mip_rel_gap=config.mip_rel_gap,
                          method=config.warm_method)
    if config.policy == "full-size-warm-k":
        return FullSizeWarmK(warm=warm)
    return UnderstudyPolicy(warm=warm,
                            progressive=ProgressiveConfig(preempt_warm=config.preempt_warm))


class Orchestrator:
    """Apps and their primaries."""

    def __init__(self, executor: Executor, store: RecordStore, families: Mapping[str, Family],
                 config: RuntimeConfig, clock: Clock,
                 on_registered: Callable[[], None] = lambda: None,
                 held_variants: HeldVariants = _no_store) -> None:
        self.executor = executor
        self.store = store
        self.families = families
        self.config = config
        self.clock = clock
        self.on_registered = on_registered
        """Called once an app is recorded (its family's interim is prefetched everywhere)."""
        self.held_variants = held_variants

    def policy(self) -> UnderstudyPolicy | FullSizeWarmK:
        """The configured failover policy."""
        return policy_for(self.config)

    async def snapshot(self) -> tuple[ClusterSnapshot, Mapping[str, AppRecord],
                                      Mapping[str, ServerRecord]]:
        """The snapshot of the current records, and those records.

        The records are read-only (shared with the store's cache): a caller that decides on
        one reads its own copy with ``store.get_app``.
        """
        view = await self.store.view()
        return build_snapshot(self.families, view.servers, view.apps), view.apps, view.servers

    def validate_spec(self, spec: AppSpec, servers: Mapping[str, ServerRecord],
                      held: Set[str] | None = None) -> None:
        """Reject what no snapshot could accept, with a message naming the problem.

        ``held``: the variants the artifact store holds (None: not checked). The app's primary
        variant, the one its placement loads, must be one of them, or the app would be
        recorded (201) and never serve; unless the app says its artifacts are provided.
        """
        family = self.families.get(spec.family)
        if family is None:
            raise InvalidRequestError(f"unknown family {spec.family!r}; known: "
                                      f"{', '.join(sorted(self.families))}")
        if spec.variant is not None and spec.variant not in {v.name for v in family.variants}:
            raise InvalidRequestError(f"family {spec.family!r} has no variant {spec.variant!r}")
        if spec.pinned_server is not None and spec.pinned_server not in servers:
            raise InvalidRequestError(f"pinned server {spec.pinned_server!r} is unknown")
        if spec.pinned_site is not None and \
                all(s.site_id != spec.pinned_site for s in servers.values()):
            raise InvalidRequestError(f"pinned site {spec.pinned_site!r} is unknown")
        variant = family.variant(spec.variant) if spec.variant else family.most_accurate
        if held is not None and not spec.artifacts_provided and variant.name not in held:
            raise InvalidRequestError(_not_in_store(family, variant, held))
        k = spec.parity_k
        if k is not None and held is not None and not spec.artifacts_provided:
            parity = parity_name(variant.name, k, spec.parity_encoder)
            if parity not in held:
                raise InvalidRequestError(
                    f"parity:{k} needs the parity model {parity} in the artifact store, which "
                    f"does not hold it: understudy parity train --family {family.name} "
                    f"--variant {variant.name} --k {k} --encoder {spec.parity_encoder} "
                    f"--store STORE")
        demand = variant.demand(spec.max_rate_rps)
        if servers and not any(demand.fits_within(Resources(s.capacity))
                               for s in servers.values()):
            raise InvalidRequestError(
                f"{variant.name} at {spec.max_rate_rps:g} req/s needs {demand}, more than any "
                f"server's whole capacity; lower max_rate_rps or choose a smaller variant")

    async def register(self, spec: AppSpec, wait: bool = False) -> AppRecord:
        """Register an app: record it, place its primary, load it (awaited with ``wait``)."""
        self.validate_spec(spec, (await self.store.view()).servers, await self.held_variants())
        if not await self.store.add_app(AppRecord(spec=spec)):
            raise ConflictError(f"app {spec.app_id!r} is already registered")
        self.executor.locks.registered(spec.app_id)
        self.on_registered()
        decision = await self.place([spec.app_id])
        if decision is not None and wait:
            await self.executor.act(decision)
        elif decision is not None:
            self.executor.spawn(self.executor.act(decision), f"placing {spec.app_id}")
        return await self.get(spec.app_id)

    async def register_many(self, specs: Sequence[AppSpec]) -> list[bool]:
        """Register a batch of apps: validated, recorded, placed together.

        The records go to Redis in one transaction, the primaries are placed on one snapshot
        and their loads start in the background.

        All or nothing for bad input: an invalid spec or an id given twice raises
        :class:`InvalidBatchError` naming every entry at fault, and nothing is recorded.
        Returns, for each spec, whether it was created (False: the id was registered).
        """
        servers = (await self.store.view()).servers
        held = await self.held_variants()
        problems: list[dict[str, str]] = []
        first: dict[str, int] = {}
        for index, spec in enumerate(specs):
            where = f"body.apps.{index}"
            if spec.app_id in first:
                problems.append({"field": where, "message": f"app {spec.app_id!r} is also "
                                                            f"entry {first[spec.app_id]}"})
                continue
            first[spec.app_id] = index
            try:
                self.validate_spec(spec, servers, held)
            except InvalidRequestError as exc:
                problems.append({"field": where, "message": str(exc)})
        if problems:
            raise InvalidBatchError(f"{len(problems)} of {len(specs)} apps are invalid; "
                                    f"none was registered", problems)
        created = await self.store.add_apps([AppRecord(spec=spec) for spec in specs])
        new = [spec.app_id for spec, ok in zip(specs, created, strict=True) if ok]
        for app_id in new:
            self.executor.locks.registered(app_id)
        if new:
            self.on_registered()
            decision = await self.place(new)
            if decision is not None:
                self.executor.spawn(self.executor.act(decision), f"placing {len(new)} apps")
        logger.info("batch registration: %d apps created, %d already registered", len(new),
                    len(specs) - len(new))
        return created

    async def place(self, app_ids: Sequence[str]) -> Decision | None:
        """Decide and write where the apps' primaries go (one snapshot for all of them).

        Returns the decision to act on (None when there is no load to start).
        """
        ex = self.executor
        async with ex.locks.plan, contextlib.AsyncExitStack() as stack:
            for app_id in sorted(set(app_ids)):
                await stack.enter_async_context(ex.locks.app(app_id))
            snapshot, _, _ = await self.snapshot()
            records = [r for r in [await self.store.get_app(a) for a in app_ids]
                       if r is not None]
            decision = decide_place_many(records, snapshot, self.families, self.clock.time())
            if decision is None:
                return None
            await ex.commit(decision)
        return decision if decision.stages else None

    async def place_unplaced(self) -> None:
        """Place every app left with nothing serving and nothing loading, in one round.

        An app that never served gets its primary variant (:meth:`place`); one in an outage
        (it served before) is recovered as a failover recovers it (:meth:`recover`): the
        smallest variant that fits at once, warm backups of healthy apps preempted if that
        lets it serve, its own variant once there is room.
        """
        view = await self.store.view()
        todo = [a for a, record in view.apps.items() if needs_placement(record)]
        outages = [a for a in todo if view.apps[a].home is not None]
        new = [a for a in todo if view.apps[a].home is None]
        for app_ids, step, what in ((new, self.place, "placing"),
                                    (outages, self.recover, "recovering")):
            if not app_ids:
                continue
            decision = await step(app_ids)
            if decision is not None:
                self.executor.spawn(self.executor.act(decision),
                                    f"{what} {len(app_ids)} apps")

    async def recover(self, app_ids: Sequence[str]) -> Decision | None:
        """Decide and write the policy's recovery of apps in an outage (``plan_recovery``).

        Planned under the planning lock on one snapshot, then committed under the locks of
        the apps it touches (theirs and those of the warm backups it preempts), as a
        failover's cold round is. When one of the apps got something serving or loading
        meanwhile, nothing is written: that write changed the records, so the next pass plans
        again. Returns the decision to act on (None when there is no load or unload).
        """
        ex = self.executor
        async with ex.locks.plan:
            snapshot, records, _ = await self.snapshot()
            wanted = [a for a in app_ids if a in snapshot.app_by_id and a in records
                      and needs_placement(records[a])]
            if not wanted:
                return None
            plan = self.policy().plan_recovery(snapshot, wanted)
            touched = set(wanted) | {p.app_id for p in plan.preempted}
            async with ex.locks.apps(touched):
                apps = {a: r for a in sorted(touched)
                        if (r := await self.store.get_app(a)) is not None}
                still = {a for a in wanted if a in apps and needs_placement(apps[a])}
                if still != set(wanted):  # changed while planned: plan again next pass
                    return None
                decision = decide_outage_recovery(apps, plan, self.families,
                                                  self.clock.time())
                if decision is None:
                    return None
                await ex.commit(decision)
        return decision if decision.stages else None

    async def get(self, app_id: str) -> AppRecord:
        """One app record; NotFoundError when unknown."""
        record = await self.store.get_app(app_id)
        if record is None:
            raise NotFoundError(f"app {app_id!r} is not registered")
        return record

    async def delete(self, app_id: str) -> None:
        """Unload every replica of the app and forget it."""
        ex = self.executor
        async with ex.locks.app(app_id):
            record = await self.get(app_id)
            decision = decide_delete(record)
            await ex.commit(decision)
        await ex.run(decision.stages)
        await self.store.delete_app(app_id)
        ex.locks.forgotten(app_id)
        ex.recoveries.pop(app_id, None)
        await ex.commit(Decision(events=(event_for(record, "deleted", None, "deleted by request",
                                                   {}, None, self.clock.time()),)))
        ex.on_serving_moved()

    async def converge_forever(self, interval_s: float = 1.0) -> None:
        """Periodically place apps left with nothing serving and nothing loading.

        Event-driven paths handle the normal cases; this catches the rest (an app whose
        loading primary was on a server that failed, capacity freed by a deletion, an app
        that found no room when it registered), so the cluster always converges. A pass
        runs only when the records changed since the last one that succeeded (placement
        depends on nothing else): an idle controller costs one revision check a second.
        """
        converged_at: int | None = None
        while True:
            await asyncio.sleep(interval_s)
            try:
                converged_at = await self.converge_pass(converged_at)
            except Exception:  # noqa: BLE001 - keep the loop alive (Redis restarting ...)
                logger.exception("convergence pass failed")

    async def converge_pass(self, converged_at: int | None) -> int:
        """Place what needs it unless the records are still at revision ``converged_at``.

        Returns the revision this pass converged (the next pass's ``converged_at``).
        """
        revision = await self.store.revision()
        if revision != converged_at:
            await self.place_unplaced()
        return revision


def _not_in_store(family: Family, variant: Variant, held: Set[str]) -> str:
    """Why an app whose primary variant is not in the artifact store is refused."""
    in_store = [v.name for v in family.variants if v.name in held]
    where = (f"it holds {', '.join(in_store)} of this family: choose one as the variant"
             if in_store else f"it holds no variant of family {family.name!r}")
    return (f"the artifact store does not hold {variant.name}, the variant this app would "
            f"load, so it would never serve; {where}, build it (understudy models build), or "
            f"set artifacts_provided if the agents get it elsewhere")
