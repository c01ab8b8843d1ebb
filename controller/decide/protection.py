"""An app's extra instances and parity models: what to load, unload and forget, on its record.

An app asks for ``instances`` instances of its variant (``AppSpec.instance_count``; its serving
replica is one) and, with ``parity:k``, one parity model per k of them
(``AppSpec.parity_count``). :func:`decide_protection` compares the app's record with that and
returns the decision that converges it, placing what is missing with
``policies.protection.place_protection`` (each instance on its own server; each parity model
on a server holding nothing of the app: independence). It is the parity models' failover too:
one lost with its server (``forget_replicas_on`` drops it) is missing at the next look and is
placed again elsewhere; one that the app's own failover put next to an instance (its primary
recovered onto the parity model's server) is moved away.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.decide.decision import Decision, accuracy_of, event_for
from controller.records import AppRecord, Event, Replica, ServerRecord
from parity.artifacts import parity_name
from policies.actions import LoadVariant, Stage, UnloadVariant
from policies.errors import PolicyError
from policies.model import ClusterSnapshot, Family, Role
from policies.protection import ProtectionNeed, place_protection
from understudy.wire.protocol import ModelState

_ACTIVE = (ModelState.LOADING, ModelState.READY)
REMOVED_EVENTS = {Role.INSTANCE: "instance_removed", Role.PARITY: "parity_removed"}


def wants_protection(record: AppRecord) -> bool:
    """Whether the app asks for extra instances or parity models (or still holds some)."""
    spec = record.spec
    return spec.instance_count > 1 or spec.parity_k is not None or any(
        r.role in REMOVED_EVENTS for r in record.replicas)


def deployed_variant(record: AppRecord, families: Mapping[str, Family]) -> str | None:
    """The variant the app's instances run (its primary variant); None: unknown family."""
    family = families.get(record.spec.family)
    if family is None:
        return None
    try:
        return (family.variant(record.spec.variant) if record.spec.variant
                else family.most_accurate).name
    except PolicyError:
        return None


def parity_variant_of(record: AppRecord, variant: str) -> str | None:
    """The parity model the app's protection names for ``variant`` (None: no parity)."""
    k = record.spec.parity_k
    return None if k is None else parity_name(variant, k, record.spec.parity_encoder)


def decide_protection(record: AppRecord, snapshot: ClusterSnapshot,
                      servers: Mapping[str, ServerRecord], families: Mapping[str, Family],
                      now: float) -> tuple[Decision | None, tuple[str, ...]]:
    """The decision converging the app's instances and parity models, and what found no room.

    None when nothing changes.
    """
    variant = deployed_variant(record, families)
    if variant is None or record.app_id not in snapshot.app_by_id:
        return None, ()
    spec = record.spec
    live = {s.server_id for s in snapshot.live_servers()}
    changed = False
    events: list[Event] = []
    unloads: list[UnloadVariant] = []

    def drop(replica: Replica, reason: str, unload: bool) -> None:
        nonlocal changed
        changed = True
        events.append(event_for(record, REMOVED_EVENTS[replica.role], replica, reason, servers,
                                None, now))
        if unload:
            replica.state = ModelState.UNLOADING
            unloads.append(UnloadVariant(replica.server_id, record.app_id, replica.variant))
        else:
            record.replicas = [r for r in record.replicas if r is not replica]

    for replica in [r for r in record.replicas if r.role in REMOVED_EVENTS]:
        if replica.state is ModelState.FAILED or (replica.server_id not in live
                                                  and replica.state is not ModelState.UNLOADING):
            drop(replica, f"server {replica.server_id} is not up", unload=False)
    parity_variant = parity_variant_of(record, variant)
    serving_servers = {r.server_id for r in record.replicas
                       if r.state in _ACTIVE and r.role not in REMOVED_EVENTS}
    instances = sorted((r for r in record.replicas
                        if r.role is Role.INSTANCE and r.state in _ACTIVE),
                       key=lambda r: r.server_id)
    parity = sorted((r for r in record.replicas if r.role is Role.PARITY and r.state in _ACTIVE),
                    key=lambda r: r.server_id)
    kept_instances: list[Replica] = []
    for replica in instances:
        if replica.variant != variant or replica.server_id in serving_servers \
                or len(kept_instances) >= spec.instance_count - 1:
            drop(replica, "not wanted there any more", unload=True)
        else:
            kept_instances.append(replica)
    instance_servers = serving_servers | {r.server_id for r in kept_instances}
    kept_parity: list[Replica] = []
    for replica in parity:
        if replica.variant != parity_variant or replica.server_id in instance_servers \
                or len(kept_parity) >= spec.parity_count:
            drop(replica, "not independent of the app's instances, or not wanted",
                 unload=True)
        else:
            kept_parity.append(replica)
    need = ProtectionNeed(
        record.app_id, variant, instances=spec.instance_count - 1 - len(kept_instances),
        parity=spec.parity_count - len(kept_parity) if parity_variant else 0,
        parity_variant=parity_variant or "",
        instance_servers=frozenset(r.server_id for r in record.replicas
                                   if r.state in _ACTIVE or r.state is ModelState.UNLOADING),
        parity_servers=frozenset(r.server_id for r in kept_parity))
    plan = place_protection(snapshot, need) if need.instances > 0 or need.parity > 0 \
        else None
    loads: list[LoadVariant] = []
    for placement in plan.placements if plan is not None else ():
        accuracy = (accuracy_of(families, spec.family, placement.variant)
                    if placement.role is Role.INSTANCE else 0.0)
        record.put_replica(Replica(server_id=placement.server_id, variant=placement.variant,
                                   role=placement.role, accuracy=accuracy))
        loads.append(LoadVariant(placement.server_id, record.app_id, placement.variant,
                                 placement.role))
        changed = True
    if not changed:
        return None, plan.unplaced if plan is not None else ()
    record.updated_at = now
    stages = (Stage("protection", tuple(unloads) + tuple(loads)),) if loads or unloads else ()
    notes = tuple(f"{record.app_id}: {a.role.value} {a.variant} on {a.server_id}"
                  for a in loads)
    return (Decision(apps=(record,), events=tuple(events), stages=stages, notes=notes),
            plan.unplaced if plan is not None else ())
