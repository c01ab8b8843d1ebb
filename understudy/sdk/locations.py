"""Where an app is served, and which controller events move it (one rule for SDK and gateway).

A :class:`Location` names the Triton endpoint and model of an app's serving replica. The
controller says where an app is served in its app views (``GET /v1/apps/{id}``: ``serving``)
and in placement events (``/v1/events/ws``); the functions here read both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Location:
    """Where the app is served: Triton endpoint, model name, and what that model is."""

    http: str
    grpc: str
    model_name: str
    server_id: str
    variant: str
    accuracy: float
    seq: int = 0


NOWHERE_KINDS = frozenset({"unrecoverable", "deleted", "unplaced"})
"""Event kinds after which the app is served nowhere."""
REPLICA_KINDS = frozenset({"backup_ready", "instance_ready", "parity_ready"})
"""Event kinds naming a replica that became ready beside the serving one (a warm backup, one
more instance of the app, a parity model): the app does not move."""


def location_of_serving(serving: Mapping[str, Any] | None, seq: int = 0) -> Location | None:
    """The location in an app view's ``serving`` (``GET /v1/apps/{id}``); None without one."""
    if not serving or not serving.get("endpoint"):
        return None
    endpoint = serving["endpoint"]
    return Location(http=endpoint["http"], grpc=endpoint.get("grpc", ""),
                    model_name=serving["model_name"], server_id=serving["server_id"],
                    variant=serving["variant"], accuracy=serving["accuracy"], seq=seq)


def location_of_event(event: Mapping[str, Any]) -> tuple[bool, Location | None]:
    """What a placement event says of where its app is served: ``(moves, location)``.

    ``moves`` is False when the event leaves the serving location as it was (a warm backup,
    an instance or a parity model became ready, or an event without an endpoint); otherwise
    ``location`` is the new one, None when the app is served nowhere (unrecoverable,
    unplaced, deleted).
    """
    kind = event.get("kind")
    if kind in NOWHERE_KINDS:
        return True, None
    endpoint = event.get("endpoint")
    if not endpoint or kind in REPLICA_KINDS:
        return False, None
    return True, location_of_replica(event)


def location_of_replica(event: Mapping[str, Any]) -> Location:
    """The replica an event with an endpoint names (the serving one, or a ready backup)."""
    endpoint = event["endpoint"]
    return Location(http=endpoint["http"], grpc=endpoint.get("grpc", ""),
                    model_name=event["model_name"], server_id=event["server_id"],
                    variant=event["variant"], accuracy=event.get("accuracy") or 0.0,
                    seq=event["seq"])
