"""Drain a server for maintenance: every app moves off it without an outage.

Three decisions, each applied before the next is made: the apps' targets load elsewhere (or
their warm backups take over) and become their homes; then whatever is left on the server
unloads; then the server is marked drained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.decide.decision import Decision, accuracy_of
from controller.records import AppRecord, Replica, ServerRecord, ServerState
from policies.actions import Action, LoadVariant, PromoteReplica, Stage, UnloadVariant
from policies.model import Family, Role
from understudy.wire.protocol import ModelState


def decide_drain_moves(apps: Mapping[str, AppRecord], plan_recoveries: Iterable[
        tuple[str, str, str]], plan_switches: Iterable[tuple[str, str, str]],
        families: Mapping[str, Family]) -> Decision:
    """Drain, first step: each app's target loads elsewhere, or its warm backup takes over.

    ``plan_recoveries`` and ``plan_switches`` are (app, server, variant) from the failover plan
    of the drained server. The new places become the apps' homes.
    """
    changed: dict[str, AppRecord] = {}
    loads: list[LoadVariant] = []
    promotes: list[PromoteReplica] = []
    for app_id, server_id, variant in plan_recoveries:
        record = apps[app_id]
        record.put_replica(Replica(
            server_id=server_id, variant=variant, role=Role.UPGRADE,
            accuracy=accuracy_of(families, record.spec.family, variant)))
        record.home = (server_id, variant)
        changed[app_id] = record
        loads.append(LoadVariant(server_id, app_id, variant, Role.UPGRADE))
    for app_id, server_id, variant in plan_switches:
        record = apps[app_id]
        replica = record.replica(server_id, variant)
        if replica is not None:
            replica.role = Role.UPGRADE  # the state machine makes it serve at once
            record.home = replica.key
            changed[app_id] = record
            promotes.append(PromoteReplica(app_id, server_id, variant))
    return Decision(apps=tuple(changed[a] for a in sorted(changed)),
                    stages=(Stage("move", tuple(loads)),
                            Stage("switch", tuple(promotes), after=("move",))))


def decide_drain_leftovers(apps: Mapping[str, AppRecord], server_id: str) -> Decision:
    """Drain, second step: whatever is left on the server (backups, apps that found no room)."""
    changed: list[AppRecord] = []
    chain: list[Action] = []
    for record in apps.values():
        mine = [r for r in record.replicas if r.server_id == server_id]
        if not mine:
            continue
        for replica in mine:
            replica.state = ModelState.UNLOADING
            if record.serving == replica.key:
                record.serving = None
            chain.append(UnloadVariant(server_id, record.app_id, replica.variant))
        if record.home and record.home[0] == server_id:
            record.home = None
        elsewhere = next((r for r in record.replicas if r.server_id != server_id
                          and r.state is ModelState.READY
                          and r.role in (Role.PRIMARY, Role.UPGRADE)), None)
        if elsewhere is not None:
            chain.append(PromoteReplica(record.app_id, *elsewhere.key))
        changed.append(record)
    return Decision(apps=tuple(changed), stages=(Stage("leftovers", tuple(chain)),))


def server_drained(server: ServerRecord) -> Decision:
    """Drain, last step: the server is marked drained."""
    server.state = ServerState.DRAINED
    return Decision(servers=(server,), serving_moved=True)
