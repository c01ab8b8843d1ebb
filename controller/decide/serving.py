"""Which replica serves an app: the state machine every finished load and switch goes through.

An app's progress depends only on its replicas' stored states: a ready UPGRADE (or a new
PRIMARY) replica takes over from whatever serves, unless it ranks below it (not the app's home
and less accurate: it is retired instead); a ready INTERIM serves an app that has nothing
serving, and one whose load completes after a target took over is retired. A controller
restarted mid-failover therefore resumes by re-issuing the loads still marked LOADING and
deciding again.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.decide.decision import Decision, Recovery, event_for, status_of
from controller.records import (
    AppRecord,
    AppStatus,
    Replica,
    ServerRecord,
    ServerState,
)
from policies.actions import Stage, UnloadVariant
from policies.model import Role
from understudy.wire.protocol import ModelState

READY_EVENTS = {Role.WARM: "backup_ready", Role.INSTANCE: "instance_ready",
                Role.PARITY: "parity_ready"}
"""The event told when a replica that serves beside the app's serving one becomes ready."""


def decide_advance(record: AppRecord, servers: Mapping[str, ServerRecord], now: float,
                   recovery: Recovery | None,
                   loaded: tuple[str, str, float | None] | None = None) -> Decision | None:
    """Move an app forward from its replicas' states.

    ``loaded`` = (server, variant, load seconds) of a replica whose load just succeeded: it
    is marked READY in the same decision. None comes back when that replica is no longer
    wanted (deleted or re-planned while it loaded): the caller unloads it.
    """
    if loaded is not None:
        replica = record.replica(loaded[0], loaded[1])
        if replica is None or replica.state is not ModelState.LOADING:
            return None
        replica.state, replica.since, replica.load_s = ModelState.READY, now, loaded[2]
    live = {r.server_id for r in record.replicas
            if (server := servers.get(r.server_id)) is not None
            and server.state is not ServerState.FAILED}
    kind, current, retired = next_serving(record, live)
    if loaded is not None:
        late = _late_interim(record, current, loaded[:2])
        if late is not None:
            retired.append(late)
    for old in retired:
        old.state = ModelState.UNLOADING
    loading = any(r.state is ModelState.LOADING for r in record.replicas)
    record.status = status_of(record, current, loading)
    if record.status is AppStatus.SERVING:
        record.reason = ""
    events = (event_for(record, kind, current, "", servers, recovery, now),) if kind else ()
    if loaded is not None and not kind:
        backup = record.replica(loaded[0], loaded[1])
        ready_kind = None if backup is None else READY_EVENTS.get(backup.role)
        if backup is not None and ready_kind is not None:
            events = (event_for(record, ready_kind, backup, "", servers, recovery, now),)
    unloads = tuple(UnloadVariant(old.server_id, record.app_id, old.variant) for old in retired)
    return Decision(apps=(record,), events=events,
                    stages=(Stage("retire", unloads),) if unloads else (),
                    serving_moved=bool(kind))


def next_serving(record: AppRecord, live: set[str]
                 ) -> tuple[str, Replica | None, list[Replica]]:
    """Switch ``record`` to its best ready replica (in place).

    Returns the event kind ("" when serving does not move), the replica now serving and the
    replicas to retire.
    """
    ready = [r for r in record.replicas if r.state is ModelState.READY and r.server_id in live]
    current = record.serving_replica()
    if current is not None and (current.server_id not in live
                                or current.state is not ModelState.READY):
        current = None
    upgrades = [r for r in ready if r.role in (Role.UPGRADE, Role.PRIMARY)
                and r.key != (current.key if current else None)]
    upgrade = max(upgrades, key=lambda r: _rank(record, r), default=None)
    interim = next((r for r in ready if r.role is Role.INTERIM), None)
    retired: list[Replica] = []
    kind = ""
    if upgrade is not None and upgrade.role is Role.UPGRADE and current is not None \
            and current.role is not Role.INTERIM \
            and _rank(record, upgrade) < _rank(record, current):
        # An upgrade that would leave the app worse off (a smaller model than what serves,
        # not its home): never promoted; retired.
        retired.append(upgrade)
        upgrade = None
    if upgrade is not None and (current is None or current.role is not Role.PRIMARY
                                or upgrade.role is Role.UPGRADE):
        if current is not None and current.role is not Role.WARM:
            retired.append(current)
        if interim is not None and interim is not current:
            retired.append(interim)
        kind = "failback" if upgrade.key == record.home and current else (
            "upgraded" if current is not None else "serving")
        upgrade.role = Role.PRIMARY
        record.serving, current = upgrade.key, upgrade
    elif current is None and interim is not None:
        record.serving, current = interim.key, interim
        kind = "interim_serving"
    return kind, current, retired


def _rank(record: AppRecord, replica: Replica) -> tuple[bool, float]:
    """Which of two replicas the app would rather serve from: its home, then accuracy."""
    return (record.home == replica.key, replica.accuracy)


def _late_interim(record: AppRecord, current: Replica | None,
                  loaded: tuple[str, str]) -> Replica | None:
    """The interim just loaded when something other than an interim serves: not needed."""
    replica = record.replica(*loaded)
    if replica is None or replica.role is not Role.INTERIM or current is None \
            or current is replica or current.role is Role.INTERIM \
            or replica.state is not ModelState.READY:
        return None
    return replica


def drop_replica(record: AppRecord, server_id: str, variant: str, reason: str) -> None:
    """Forget a replica whose load failed for good (in place)."""
    record.replicas = [r for r in record.replicas if r.key != (server_id, variant)]
    if record.serving == (server_id, variant):
        record.serving = None
    record.reason = reason
