"""An app's own decisions: where its primary goes, its warm backups, its removal."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.decide.decision import Decision, accuracy_of, event_for
from controller.records import (
    AppRecord,
    AppStatus,
    Event,
    Replica,
)
from policies.actions import LoadVariant, Stage, UnloadVariant
from policies.errors import PolicyError, UnknownReferenceError
from policies.model import ClusterSnapshot, Family, Placement, Role
from policies.primary import place_primaries
from understudy.wire.protocol import ModelState

BESIDE_ROLES = frozenset({Role.INSTANCE, Role.PARITY})
"""Replicas that serve beside the app's serving one and never become it."""


def needs_placement(record: AppRecord) -> bool:
    """Nothing serves the app and nothing that could serve it is loading or ready.

    Its extra instances and parity models (``controller.protection``) cannot be promoted: an
    app left with only those still needs its primary placed.
    """
    return record.serving is None and not any(
        r.state in (ModelState.LOADING, ModelState.READY) and r.role not in BESIDE_ROLES
        for r in record.replicas)


def decide_place(record: AppRecord, snapshot: ClusterSnapshot,
                 families: Mapping[str, Family], now: float) -> Decision | None:
    """Choose the primary's server (worst-fit or pinned) and load it there.

    None when the app needs no placement (or nothing changes: still no room, same reason).
    """
    return decide_place_many([record], snapshot, families, now)


def decide_place_many(records: Sequence[AppRecord], snapshot: ClusterSnapshot,
                      families: Mapping[str, Family], now: float) -> Decision | None:
    """Place the primaries of ``records`` on one snapshot, in order, as if one by one.

    Each app that needs a placement goes where :func:`place_primaries` puts it, given the
    ones placed before it (a registration burst costs one snapshot, not one per app); one
    that finds no room is recorded unavailable with the reason. Loads that end an outage
    (an app that served before or found no room) form the urgent stage ``place``, new apps'
    the routine ``place-new``. None when no record changes.
    """
    todo = [r for r in records if needs_placement(r)]
    if not todo:
        return None
    placed, unplaced = _primaries(snapshot, [r.app_id for r in todo])
    changed: list[AppRecord] = []
    events: list[Event] = []
    loads: dict[bool, list[LoadVariant]] = {True: [], False: []}
    notes: list[str] = []
    for record in todo:
        placement = placed.get(record.app_id)
        if placement is None:
            why = unplaced[record.app_id]
            if record.status is AppStatus.UNAVAILABLE and record.reason == why:
                continue
            record.status, record.reason = AppStatus.UNAVAILABLE, why
            changed.append(record)
            events.append(event_for(record, "unplaced", None, why, {}, None, now))
            continue
        replica = Replica(server_id=placement.server_id, variant=placement.variant,
                          role=Role.PRIMARY,
                          accuracy=accuracy_of(families, record.spec.family, placement.variant))
        # An app that served before (or found no room) is in an outage; a new one is not.
        urgent = record.home is not None or record.status is AppStatus.UNAVAILABLE
        record.put_replica(replica)
        record.home = replica.key
        record.status = AppStatus.PENDING
        record.reason = ""
        changed.append(record)
        loads[urgent].append(LoadVariant(replica.server_id, record.app_id, replica.variant,
                                         Role.PRIMARY))
        notes.append(f"{record.app_id}: primary {replica.variant} on {replica.server_id}")
    if not changed:
        return None
    stages = tuple(Stage(name, tuple(loads[urgent]), urgent=urgent)
                   for name, urgent in (("place", True), ("place-new", False)) if loads[urgent])
    return Decision(apps=tuple(changed), events=tuple(events), stages=stages,
                    notes=tuple(notes))


def _primaries(snapshot: ClusterSnapshot, app_ids: list[str]
               ) -> tuple[dict[str, Placement], dict[str, str]]:
    """The policy's primary placements by app, and why each other app found no room."""
    known = [a for a in app_ids if a in snapshot.app_by_id]
    # An app the snapshot leaves out (it fits no server any more) is the policy's error.
    unplaced = {a: str(UnknownReferenceError(f"unknown apps {[a]}"))
                for a in app_ids if a not in snapshot.app_by_id}
    try:
        result = place_primaries(snapshot, known, largest_first=False)
    except PolicyError as exc:
        return {}, {**unplaced, **dict.fromkeys(known, str(exc))}
    unplaced |= {u.app_id: u.reason for u in result.unplaced}
    return {p.app_id: p for p in result.placements}, unplaced


def decide_delete(record: AppRecord) -> Decision:
    """Every replica of the app unloads (the caller forgets the app once they are gone)."""
    for replica in record.replicas:
        replica.state = ModelState.UNLOADING
    return Decision(apps=(record,), stages=(Stage("delete", tuple(
        UnloadVariant(r.server_id, record.app_id, r.variant) for r in record.replicas)),))


Key = tuple[str, str, str]
"""(app, server, variant) of a warm backup."""


def decide_warm_backups(record: AppRecord, to_load: Iterable[Key], to_unload: Iterable[Key],
                        families: Mapping[str, Family]) -> Decision:
    """One app's part of a warm re-plan: its new backups load, its dropped ones unload.

    Works on the app's record read again after the solve (a load that ended meanwhile wrote
    a newer one): a planned backup whose model has another use now is skipped, and a dropped
    one promoted since (a warm switch) stays.
    """
    loads: list[LoadVariant] = []
    unloads: list[UnloadVariant] = []
    for _, server_id, variant in to_load:
        key = (server_id, variant)
        existing = record.replica(server_id, variant)
        if record.serving == key or (
                existing is not None and existing.role is not Role.WARM
                and existing.state in (ModelState.LOADING, ModelState.READY)):
            continue
        # Never two replicas of one (server, variant): one being unloaded is reused.
        record.put_replica(Replica(server_id=server_id, variant=variant,
                                       role=Role.WARM,
                                       accuracy=accuracy_of(families, record.spec.family,
                                                            variant)))
        loads.append(LoadVariant(server_id, record.app_id, variant, Role.WARM))
    for _, server_id, variant in to_unload:
        replica = record.replica(server_id, variant)
        if replica is None or replica.role is not Role.WARM \
                or record.serving == replica.key:
            continue
        replica.state = ModelState.UNLOADING
        unloads.append(UnloadVariant(server_id, record.app_id, variant))
    return Decision(apps=(record,), stages=(Stage("warm", tuple(loads) + tuple(unloads)),))
