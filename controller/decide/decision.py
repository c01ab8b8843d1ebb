"""What a decision is: record changes, the actions to take, the events to publish.

Every decision of the controller (a failover, a take-back, a fail-back, a drain, a warm
re-plan, a replica that became ready) is a pure function of records read under a lock, the
time as a value and the triggering event, returning a :class:`Decision`. The executor
(``controller.executor``) applies any decision the same way: records, intent and events in one
Redis transaction (written before any agent is told anything), events pushed to the clients,
then the action stages run in order (``policies.actions.Stage``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.records import (
    AppRecord,
    AppStatus,
    Event,
    Replica,
    ServerRecord,
)
from policies.actions import Stage
from policies.errors import PolicyError
from policies.model import Family, Role
from understudy.wire.protocol import model_name

LOADED_FOR_THE_CHANGE = frozenset({"interim_serving", "serving", "upgraded", "failback"})
"""Event kinds whose replica was loaded for that very change (their events carry its load
time); a warm switch's or take-back's replica was loaded long before."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """An app recovering from a server failure (for the events' failure fields and MTTR)."""

    detected_at: float
    failed_server: str
    notified: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What to write, what to tell the clients, and what the agents must do, in that order.

    ``apps`` and ``servers`` are whole records (the decision's copies); ``intent`` is written
    with them when the decision's stages must survive a controller restart (a failover is
    resumed from its intent). ``recoveries`` start (or replace) an app's recovery bookkeeping;
    ``serving_moved`` asks for a warm re-plan once the decision is applied.
    """

    apps: tuple[AppRecord, ...] = ()
    servers: tuple[ServerRecord, ...] = ()
    events: tuple[Event, ...] = ()
    stages: tuple[Stage, ...] = ()
    intent: Mapping[str, Any] | None = None
    recoveries: Mapping[str, Recovery] = field(default_factory=dict)
    serving_moved: bool = False
    notes: tuple[str, ...] = ()

    @property
    def writes(self) -> bool:
        """Whether anything must be written before acting."""
        return bool(self.apps or self.servers or self.events or self.intent is not None)


def accuracy_of(families: Mapping[str, Family], family: str, variant: str) -> float:
    """Normalised accuracy of a variant (0 when unknown)."""
    try:
        return families[family].variant(variant).accuracy
    except (KeyError, PolicyError):
        return 0.0


def event_for(record: AppRecord, kind: str, replica: Replica | None, reason: str,
              servers: Mapping[str, ServerRecord], recovery: Recovery | None,
              at: float) -> Event:
    """The placement event of an app, not yet numbered (the store numbers it)."""
    endpoint = None
    if replica is not None:
        server = servers.get(replica.server_id)
        if server is not None and server.http:
            endpoint = {"http": server.http, "grpc": server.grpc or ""}
    return Event(
        app_id=record.app_id, kind=kind,
        server_id=replica.server_id if replica else None, endpoint=endpoint,
        model_name=model_name(record.app_id, replica.variant) if replica else None,
        variant=replica.variant if replica else None,
        role=replica.role.value if replica else None,
        accuracy=replica.accuracy if replica else None, reason=reason,
        failed_server=recovery.failed_server if recovery else None,
        failure_at=recovery.detected_at if recovery else None,
        load_s=replica.load_s if replica and kind in LOADED_FOR_THE_CHANGE else None,
        time=at)


def status_of(record: AppRecord, serving: Replica | None, loading: bool) -> AppStatus:
    """An app's status from what serves it (``loading``: a replica of it is loading)."""
    if serving is None:
        return AppStatus.RECOVERING if loading else AppStatus.UNAVAILABLE
    if record.home is not None and serving.variant != record.home[1]:
        return AppStatus.DEGRADED
    if serving.role is Role.INTERIM:
        return AppStatus.DEGRADED
    return AppStatus.SERVING
