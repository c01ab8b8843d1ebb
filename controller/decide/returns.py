"""A server comes back: take-back of what it still holds, reconcile, fail-back, fail-forward.

Each function decides from records read by the caller under the planning lock; the executor
writes the decision and then runs its stages.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from controller.decide.decision import Decision, accuracy_of
from controller.decide.takeback import take_back
from controller.records import AppRecord, Replica, ServerRecord
from policies.actions import (
    LoadVariant,
    PromoteReplica,
    RemoveStray,
    Stage,
    UnloadVariant,
)
from policies.model import Application, ClusterSnapshot, Family, Role, Server, Variant
from policies.replica_rules import allowed_variants, may_hold_replica
from policies.resources import Resources
from understudy.wire.protocol import InventoryItem, ModelState

_ACTIVE = (ModelState.LOADING, ModelState.READY)
_SLACK = 1e-9


def decide_take_back(apps: Mapping[str, AppRecord], server_id: str,
                     inventory: Iterable[InventoryItem], families: Mapping[str, Family],
                     revived: ServerRecord | None = None) -> Decision:
    """Switch apps back to models a returned server still holds (``decide.takeback``).

    ``revived``: the server's record, already marked up, written in the same transaction.
    """
    result = take_back(server_id, inventory, dict(apps),
                       lambda family, variant: accuracy_of(families, family, variant))
    changed = sorted({a for a, _ in result.adopted + result.backups + result.loading})
    adopt = tuple(PromoteReplica(a, server_id, v) for a, v in result.adopted)
    retire = tuple(UnloadVariant(s, a, v) for a, s, v in result.retired)
    notes: tuple[str, ...] = ()
    if changed:
        notes = (f"server {server_id} returned holding models: {len(result.adopted)} serve "
                 "again without a load (" + ", ".join(f"{a}/{v}" for a, v in result.adopted)
                 + f"), {len(result.loading)} kept loading ("
                 + ", ".join(f"{a}/{v}" for a, v in result.loading)
                 + f"), {len(result.backups)} kept as warm backups",)
    return Decision(apps=tuple(apps[a] for a in changed),
                    servers=(revived,) if revived is not None else (),
                    stages=(Stage("adopt", adopt), Stage("retire", retire)), notes=notes)


def decide_fail_back(apps: Mapping[str, AppRecord], snapshot: ClusterSnapshot,
                     app_id: str, families: Mapping[str, Family]) -> Decision | None:
    """Load the app's home primary again (the serving state machine switches to it).

    A primary outranks warm backups: backups on the home server are reclaimed if the primary
    needs their room (the warm re-plan that follows puts them elsewhere), and the load waits
    for their unloads. None when the home server has no room or nothing is to be done.
    """
    record = apps.get(app_id)
    if record is None or record.home is None:
        return None
    server_id, variant = record.home
    app = snapshot.app_by_id.get(app_id)
    if app is None or server_id not in snapshot.free or \
            record.replica(server_id, variant) is not None:
        return None
    demand = snapshot.families[app.family].variant(variant).demand(app.max_rate_rps)
    free = snapshot.free[server_id]
    evict: list[tuple[AppRecord, Replica]] = []
    for other in apps.values():
        for replica in other.replicas:
            if demand.fits_within(free):
                break
            if replica.server_id == server_id and replica.role is Role.WARM \
                    and replica.state is ModelState.READY:
                spec = snapshot.app_by_id.get(other.app_id)
                if spec is None:
                    continue
                free = free + snapshot.families[spec.family].variant(
                    replica.variant).demand(spec.max_rate_rps)
                evict.append((other, replica))
    if not demand.fits_within(free):
        return None
    for _, replica in evict:
        replica.state = ModelState.UNLOADING
    record.put_replica(Replica(server_id=server_id, variant=variant,
                                   role=Role.UPGRADE,
                                   accuracy=accuracy_of(families, app.family, variant)))
    changed = {other.app_id: other for other, _ in evict} | {app_id: record}
    reclaim = tuple(UnloadVariant(r.server_id, other.app_id, r.variant) for other, r in evict)
    return Decision(
        apps=tuple(changed[a] for a in sorted(changed)),
        stages=(Stage("reclaim", reclaim),
                Stage("failback", (LoadVariant(server_id, app_id, variant, Role.UPGRADE),),
                      after=("reclaim",))))


def decide_reconcile(apps: Mapping[str, AppRecord], server_id: str,
                     inventory: Iterable[InventoryItem]) -> Decision:
    """Converge one agent to the records: re-issue loads and unloads, remove strays.

    A replica the agent lacks (or that is still LOADING) is loaded again, urgently when
    nothing else serves its app (an outage); an UNLOADING one is unloaded; a model no record
    wants is a stray.
    """
    loaded = {(i.app_id, i.variant) for i in inventory}
    wanted: set[tuple[str, str]] = set()
    changed: dict[str, AppRecord] = {}
    urgent: list[LoadVariant] = []
    routine: list[LoadVariant] = []
    unloads: list[UnloadVariant] = []
    for record in apps.values():
        for replica in record.replicas:
            if replica.server_id != server_id:
                continue
            key = (record.app_id, replica.variant)
            wanted.add(key)  # an UNLOADING one is the unload's business, not a stray
            if replica.state is ModelState.UNLOADING:
                unloads.append(UnloadVariant(server_id, record.app_id, replica.variant))
                continue
            if replica.state is ModelState.LOADING or key not in loaded:
                replica.state = ModelState.LOADING
                changed[record.app_id] = record
                load, outage = reload_of(record, replica)
                (urgent if outage else routine).append(load)
    strays = tuple(RemoveStray(server_id, a, v) for a, v in sorted(loaded - wanted))
    return Decision(apps=tuple(changed[a] for a in sorted(changed)),
                    stages=(Stage("unload", tuple(unloads)), Stage("strays", strays),
                            Stage("reload-urgent", tuple(urgent), urgent=True),
                            Stage("reload", tuple(routine))),
                    notes=tuple(f"server {server_id} holds stray model {a}__{v}; unloading it"
                                for a, v in sorted(loaded - wanted)))


def reload_of(record: AppRecord, replica: Replica) -> tuple[LoadVariant, bool]:
    """The load that brings ``replica`` back, and whether it ends an outage (urgent).

    An outage: nothing else serves the app, or this replica was what served it.
    """
    load = LoadVariant(replica.server_id, record.app_id, replica.variant, replica.role)
    return load, record.serving is None or record.serving == replica.key


def stranded_below_home(record: AppRecord, server_id: str, live: Collection[str],
                        families: Mapping[str, Family]) -> Replica | None:
    """The app's best replica, when it is on ``server_id`` and below the home variant.

    "Best": the most accurate replica that serves or is loading or ready to (warm backups
    aside) on a ``live`` server. None when the app's home server is live (fail-back brings it
    home), when the best is elsewhere, or when it is as accurate as the home variant.
    """
    if record.home is None or record.home[0] in live:
        return None
    active = [r for r in record.replicas if r.role not in (Role.WARM, Role.PARITY)
              and r.state in _ACTIVE and r.server_id in live]
    serving = record.serving_replica()
    if serving is not None and serving.state is ModelState.READY and serving not in active:
        active.append(serving)
    best = max(active, key=lambda r: r.accuracy, default=None)
    if best is None or best.server_id != server_id:
        return None
    home_accuracy = accuracy_of(families, record.spec.family, record.home[1])
    return best if best.accuracy < home_accuracy - _SLACK else None


def decide_fail_forward(apps: Mapping[str, AppRecord], snapshot: ClusterSnapshot,
                        server_id: str, families: Mapping[str, Family]) -> Decision | None:
    """Apps taken back below their home variant, their home down: a target loads there.

    A server declared failed while it recovered an app loses the app's target from the
    records (``forget_replicas_on``); taken back, it may hold only the interim, and nothing
    would ever load the target. For each app of ``apps`` whose best replica is on the server
    and below its home variant (:func:`stranded_below_home`), the most accurate variant the
    replica rules allow (never above the app's choice, pins honoured) that is more accurate
    than that replica, no more than the home variant, meets the app's SLO there and fits the
    server's free room loads as its target (``UPGRADE``); the serving state machine switches
    to it and retires the smaller one. A smaller replica still loading becomes an interim
    (it serves only while nothing else does). None when no app gets a target.
    """
    server = snapshot.server_by_id.get(server_id)
    if server is None or server_id not in snapshot.free:
        return None
    live = set(snapshot.free)
    free = snapshot.free[server_id]
    changed: list[AppRecord] = []
    loads: list[LoadVariant] = []
    notes: list[str] = []
    for app_id in sorted(apps):
        record = apps[app_id]
        app = snapshot.app_by_id.get(app_id)
        best = stranded_below_home(record, server_id, live, families)
        if app is None or best is None or record.home is None:
            continue
        ceiling = accuracy_of(families, record.spec.family, record.home[1]) + _SLACK
        choices = better_variants(snapshot, app, record, server, free, best.accuracy, ceiling)
        if not choices:
            continue
        target = max(choices, key=lambda v: (v.accuracy, v.memory_mb))
        free = free - target.demand(app.max_rate_rps)
        for replica in record.replicas:
            if replica.state is ModelState.LOADING and replica.accuracy < target.accuracy \
                    and replica.role in (Role.PRIMARY, Role.UPGRADE):
                replica.role = Role.INTERIM
        record.put_replica(Replica(server_id=server_id, variant=target.name, role=Role.UPGRADE,
                                   accuracy=target.accuracy))
        changed.append(record)
        loads.append(LoadVariant(server_id, app_id, target.name, Role.UPGRADE))
        notes.append(f"{app_id}: left on {best.variant} on {server_id}, its home "
                     f"{record.home[0]} down; loading {target.name} there")
    if not changed:
        return None
    return Decision(apps=tuple(changed), stages=(Stage("fail-forward", tuple(loads)),),
                    notes=tuple(notes))


def better_variants(snapshot: ClusterSnapshot, app: Application, record: AppRecord,
                    server: Server, free: Resources, floor: float,
                    ceiling: float) -> list[Variant]:
    """The variants a target of ``app`` on ``server`` may be: more accurate than ``floor``.

    Those the replica rules allow there (pins, never above the app's choice) with accuracy
    above ``floor`` and at most ``ceiling``, not already a replica there, meeting the app's
    SLO on the server and fitting ``free``. Fail-forward and the reconciler's upgrades of
    degraded apps choose among them.
    """
    if not may_hold_replica(snapshot, app, server):
        return []
    return [v for v in allowed_variants(snapshot, app)
            if floor + _SLACK < v.accuracy <= ceiling
            and record.replica(server.server_id, v.name) is None
            and app.meets_slo(v, server)
            and v.demand(app.max_rate_rps).fits_within(free)]
