"""Taking back a server declared failed that is still holding its models (a false alarm).

A failover forgets the replicas of the failed server
(``controller.decide.failover.forget_replicas_on``): for a dead server they are gone. But a
server can be declared failed and be alive: its heartbeats came late (a CPU burst on a small
machine), or its agent reconnected at once. Its Triton still holds every model it held, and
may still be loading one (a recovery's target, sent before the declaration), while its apps
have been moved to warm backups or onto new recoveries elsewhere. Reconciling it as a fresh
server would unload those models as strays, and the apps would wait for loads again.

Taking back re-adopts, per app, what the returned server holds (ready or still loading),
ranked with what the records already have for the app: the home model first, then accuracy,
then a ready model before a loading one, then what serves now, then the held model before a
recovery replica still on its way elsewhere. Where a held model ranks first it is the app's
target (``UPGRADE``; a load still in flight is kept and serves when it completes; an
``INTERIM`` when nothing serves the app and it is below the home variant), and what
the failover started for the app is retired: its interim and target loads (a load still in
flight is unloaded when it completes), and a promoted warm backup becomes a warm backup again.
Where something in the records ranks first, the held model is an interim if nothing serves the
app (``INTERIM``: it serves at once, or when it loads, and is retired once the target serves;
it is never promoted over the target), a warm backup otherwise (the warm re-plan that follows
keeps or drops it like any other). Nothing here promotes a smaller model over a target that
is loaded or loading. The other held models are strays. Everything is in memory on records
the caller then writes; the caller holds the planning lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.records import AppRecord, Replica
from policies.model import Role
from understudy.wire.protocol import InventoryItem, ModelState

_RECOVERY_ROLES = (Role.PRIMARY, Role.UPGRADE, Role.INTERIM)
_ACTIVE = (ModelState.LOADING, ModelState.READY)
_CURRENT, _HELD, _ON_ITS_WAY = 2, 1, 0
"""Last tie-break of the rank: what serves, then the held model, then a recovery replica."""

Rank = tuple[bool, float, bool, int]


@dataclass(frozen=True)
class TakeBack:
    """What taking a server back changed."""

    adopted: tuple[tuple[str, str], ...]
    """(app, variant) of ready models re-adopted to serve (as the app's target, or as its
    interim while the target loads); each app must be advanced."""
    backups: tuple[tuple[str, str], ...]
    """(app, variant) re-adopted as warm backups (the next warm re-plan keeps or drops them)."""
    retired: tuple[tuple[str, str, str], ...]
    """(app, server, variant) of ready replicas no longer needed; each must be unloaded."""
    loading: tuple[tuple[str, str], ...] = ()
    """(app, variant) of models still loading, re-adopted as the app's target or interim:
    the load's completion makes them serve (nothing to do now)."""


@dataclass
class _Changes:
    adopted: list[tuple[str, str]] = field(default_factory=list)
    backups: list[tuple[str, str]] = field(default_factory=list)
    retired: list[tuple[str, str, str]] = field(default_factory=list)
    loading: list[tuple[str, str]] = field(default_factory=list)


def take_back(server_id: str, inventory: Iterable[InventoryItem],
              apps: dict[str, AppRecord], accuracy: Callable[[str, str], float]) -> TakeBack:
    """Re-adopt the returned server's models, ready or loading (see the module docstring).

    Apps the records already place on the server are left to the reconcile that follows.
    """
    held: dict[str, dict[str, InventoryItem]] = {}
    for item in inventory:
        record = apps.get(item.app_id)
        if item.state not in _ACTIVE or record is None or any(
                r.server_id == server_id for r in record.replicas):
            continue  # unknown app, being unloaded, or the records already place it here
        held.setdefault(item.app_id, {})[item.variant] = item
    changes = _Changes()
    for app_id in sorted(held):
        _take_back_app(apps[app_id], server_id, list(held[app_id].values()), accuracy,
                       changes)
    return TakeBack(adopted=tuple(changes.adopted), backups=tuple(changes.backups),
                    retired=tuple(changes.retired), loading=tuple(changes.loading))


def _take_back_app(record: AppRecord, server_id: str, items: list[InventoryItem],
                   accuracy: Callable[[str, str], float], changes: _Changes) -> None:
    def held_rank(item: InventoryItem) -> Rank:
        return (record.home == (server_id, item.variant),
                accuracy(record.spec.family, item.variant), item.state is ModelState.READY,
                _HELD)

    def rank(replica: Replica, source: int) -> Rank:
        return (record.home == replica.key, replica.accuracy,
                replica.state is ModelState.READY, source)

    current = _current(record)
    on_its_way = _recovery_replicas(record)
    recorded = [(rank(r, _ON_ITS_WAY), r) for r in on_its_way]
    if current is not None:
        recorded.append((rank(current, _CURRENT), current))
    best = max(items, key=held_rank)
    best_recorded = max(recorded, key=lambda x: x[0], default=None)
    ready = [i for i in items if i.state is ModelState.READY]
    if best_recorded is None or held_rank(best) > best_recorded[0]:
        # The held model is the best the app has: its target, or an interim when nothing
        # serves and it is below the home variant (what loads above it then serves instead).
        home = accuracy(record.spec.family, record.home[1]) if record.home else 0.0
        below_home = not held_rank(best)[0] and held_rank(best)[1] < home
        role = Role.INTERIM if below_home and current is None else Role.UPGRADE
        _adopt(record, server_id, best, role, accuracy, changes)
        meanwhile = None
        if best.state is ModelState.LOADING and current is None:
            meanwhile = max((i for i in ready if i is not best), key=held_rank, default=None)
        if meanwhile is not None:
            _adopt(record, server_id, meanwhile, Role.INTERIM, accuracy, changes)
        if best.state is ModelState.READY or meanwhile is not None or current is not None:
            changes.retired += _retire(record, on_its_way)
        else:
            # Nothing serves until a load completes: whatever is on its way stays, as an
            # interim (it serves until the target does, never over it).
            for replica in on_its_way:
                replica.role = Role.INTERIM
        if current is not None and current.role is Role.PRIMARY:
            current.role = Role.WARM  # a promoted backup is a backup again
        return
    if current is None:
        # A better replica is on its way and nothing serves: the held model serves meanwhile.
        interim = max(ready, key=held_rank, default=best)
        _adopt(record, server_id, interim, Role.INTERIM, accuracy, changes)
        if interim.state is ModelState.READY:
            target = best_recorded[1]
            score = accuracy(record.spec.family, interim.variant)
            changes.retired += _retire(record, [r for r in on_its_way if r is not target
                                                and r.accuracy <= score])
        return
    _adopt(record, server_id, best, Role.WARM, accuracy, changes)


def _adopt(record: AppRecord, server_id: str, item: InventoryItem, role: Role,
           accuracy: Callable[[str, str], float], changes: _Changes) -> None:
    record.put_replica(Replica(server_id=server_id, variant=item.variant, role=role,
                               state=item.state,
                               accuracy=accuracy(record.spec.family, item.variant)))
    key = (record.app_id, item.variant)
    if role is Role.WARM:
        changes.backups.append(key)
    elif item.state is ModelState.READY:
        changes.adopted.append(key)
    else:
        changes.loading.append(key)


def _current(record: AppRecord) -> Replica | None:
    current = record.serving_replica()
    return current if current is not None and current.state is ModelState.READY else None


def _recovery_replicas(record: AppRecord) -> list[Replica]:
    """What a failover started for the app and that is not serving (loading or ready)."""
    current = record.serving_replica()
    return [r for r in record.replicas if r is not current and r.role in _RECOVERY_ROLES
            and r.state in _ACTIVE]


def _retire(record: AppRecord, replicas: list[Replica]) -> list[tuple[str, str, str]]:
    """Mark ``replicas`` unloading; returns the ready ones, which must be unloaded.

    A load still in flight is unloaded when it completes; one not sent yet is never sent.
    """
    retired = []
    for replica in replicas:
        if replica.state is ModelState.READY:
            retired.append((record.app_id, replica.server_id, replica.variant))
        replica.state = ModelState.UNLOADING
    return retired
