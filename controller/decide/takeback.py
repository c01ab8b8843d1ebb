"""Taking back a server declared failed that is still holding its models (a false alarm).

A failover forgets the replicas of the failed server
(``controller.decide.failover.forget_replicas_on``): for a dead server they are gone. But a
server can be declared failed and be alive: its heartbeats came late (a CPU burst on a small
machine), or its agent reconnected at once. Its Triton still holds every model it held, loaded
and ready, while its apps have been moved to warm backups (smaller variants) or onto interim
loads. Reconciling it as a fresh server would unload those models as strays and fail-back
would load the primaries again: seconds of loads, and until they finish the apps serve
degraded.

Taking back re-adopts, per app, one model the returned server still holds: to serve again when
it is the app's home (its planned primary) and at least as accurate as what the app serves now,
or more accurate than that; ``controller.decide.serving`` then switches the clients back to it at
once (a ``failback`` event, no load). What the failover started for that app and no longer
needs is retired: its interim and target loads (a load still in flight is unloaded when it
completes: its replica is no longer LOADING), and a promoted warm backup becomes a warm backup
again. A held model that does not serve again (a warm backup the server held, say) is re-adopted
as a warm backup, and the warm re-plan that follows keeps or drops it like any other. Everything
here is in memory on records the caller then writes; the caller holds the planning lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.records import AppRecord, Replica
from policies.model import Role
from understudy.wire.protocol import InventoryItem, ModelState

_RECOVERY_ROLES = (Role.PRIMARY, Role.UPGRADE, Role.INTERIM)


@dataclass(frozen=True)
class TakeBack:
    """What taking a server back changed."""

    adopted: tuple[tuple[str, str], ...]
    """(app, variant) re-adopted to serve on the returned server; each app must be advanced."""
    backups: tuple[tuple[str, str], ...]
    """(app, variant) re-adopted as warm backups (the next warm re-plan keeps or drops them)."""
    retired: tuple[tuple[str, str, str], ...]
    """(app, server, variant) of ready replicas no longer needed; each must be unloaded."""


def take_back(server_id: str, inventory: Iterable[InventoryItem],
              apps: dict[str, AppRecord], accuracy: Callable[[str, str], float]) -> TakeBack:
    """Re-adopt the returned server's ready models, one per app (the rest are strays).

    A model serves again where it is the app's home or beats what the app serves now, and is
    a warm backup otherwise.
    """
    best: dict[str, tuple[tuple[bool, float], str]] = {}
    for item in inventory:
        record = apps.get(item.app_id)
        if item.state is not ModelState.READY or record is None or any(
                r.server_id == server_id for r in record.replicas):
            continue  # unknown app, still loading, or the records already place it here
        score = accuracy(record.spec.family, item.variant)
        rank = (record.home == (server_id, item.variant), score)  # home first, then accuracy
        if item.app_id not in best or rank > best[item.app_id][0]:
            best[item.app_id] = (rank, item.variant)
    adopted: list[tuple[str, str]] = []
    backups: list[tuple[str, str]] = []
    retired: list[tuple[str, str, str]] = []
    for app_id, ((is_home, score), variant) in sorted(best.items()):
        record = apps[app_id]
        if _serve_again(record, is_home, score):
            retired += _retire_recovery(record)
            adopted.append((app_id, variant))
            role = Role.UPGRADE
        else:
            backups.append((app_id, variant))
            role = Role.WARM
        record.put_replica(Replica(server_id=server_id, variant=variant, role=role,
                                       state=ModelState.READY, accuracy=score))
    return TakeBack(adopted=tuple(adopted), backups=tuple(backups), retired=tuple(retired))


def _serve_again(record: AppRecord, is_home: bool, score: float) -> bool:
    """Whether the held model should serve the app again (nothing better is on its way)."""
    current = record.serving_replica()
    if current is not None and not (score > current.accuracy
                                     or (is_home and score >= current.accuracy)):
        return False
    return not any(r.accuracy > score for r in _recovery_replicas(record))


def _recovery_replicas(record: AppRecord) -> list[Replica]:
    current = record.serving_replica()
    return [r for r in record.replicas if r is not current and r.role in _RECOVERY_ROLES
            and r.state in (ModelState.LOADING, ModelState.READY)]


def _retire_recovery(record: AppRecord) -> list[tuple[str, str, str]]:
    """Retire what the failover started for the app; a promoted backup is a backup again."""
    retired = []
    for replica in _recovery_replicas(record):
        if replica.state is ModelState.READY:
            retired.append((record.app_id, replica.server_id, replica.variant))
        replica.state = ModelState.UNLOADING
    current = record.serving_replica()
    if current is not None and current.role is Role.PRIMARY:
        current.role = Role.WARM
    return retired
