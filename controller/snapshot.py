"""Records -> ``ClusterSnapshot``: the immutable view every policy decision is made on."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.records import AppRecord, ServerRecord, ServerState
from parity.naming import parse_parity_name
from policies.errors import CapacityExceededError, PolicyError
from policies.model import (
    Application,
    ClusterSnapshot,
    Family,
    Placement,
    Role,
    Server,
    Site,
)
from policies.resources import MEMORY_MB, Resources
from understudy.wire.protocol import ModelState

logger = logging.getLogger(__name__)

_ACTIVE = (ModelState.LOADING, ModelState.READY)
_DEMOTION_STAGES: tuple[frozenset[Role], ...] = (
    frozenset(), frozenset({Role.INTERIM}), frozenset({Role.INTERIM, Role.UPGRADE}),
    frozenset({Role.INTERIM, Role.UPGRADE, Role.WARM}))
_RANK = {Role.PRIMARY: 0, Role.UPGRADE: 1, Role.INTERIM: 2, Role.WARM: 3, Role.INSTANCE: 4,
         Role.PARITY: 5}


def resource_variant(variant: str, role: Role) -> str:
    """The variant whose demand a replica reserves: its own, or a parity model's deployed one.

    A parity model is not a variant of the app's family; it has its deployed variant's
    architecture (ParM §4.3), so it takes what that variant takes.
    """
    if role is Role.PARITY:
        parsed = parse_parity_name(variant)
        if parsed is not None:
            return parsed[0]
    return variant


def application(record: AppRecord) -> Application:
    """The policy view of one registered app."""
    spec = record.spec
    return Application(
        app_id=spec.app_id, family=spec.family, critical=spec.critical and spec.warm_protected,
        max_rate_rps=spec.max_rate_rps, latency_slo_ms=spec.latency_slo_ms,
        primary_variant=spec.variant, pinned_server=spec.pinned_server,
        pinned_site=spec.pinned_site, excluded_servers=frozenset(spec.excluded_servers),
        excluded_sites=frozenset(spec.excluded_sites), warm_replicas=spec.warm_replicas,
        allow_larger_backups=spec.allow_larger_backups)


def _fits_somewhere(record: AppRecord, families: Mapping[str, Family],
                    capacities: list[Resources]) -> bool:
    """Whether the app's primary fits some server whole; apps that cannot are left out.

    Registration rejects them, but a server that shrinks (a new capacity in its hello) can
    make an old app impossible; one such app must not make every snapshot invalid.
    ``capacities``: the servers' distinct capacities.
    """
    family = families.get(record.spec.family)
    if family is None:
        return False
    try:
        variant = family.variant(record.spec.variant) if record.spec.variant else \
            family.most_accurate
    except PolicyError:
        return False
    demand = variant.demand(record.spec.max_rate_rps)
    if not capacities or any(demand.fits_within(c) for c in capacities):
        return True
    logger.warning("app %s: %s at %g req/s fits no server; left out of planning",
                   record.app_id, variant.name, record.spec.max_rate_rps)
    return False


def warm_backups(apps: Mapping[str, AppRecord],
                 servers: Iterable[str]) -> set[tuple[str, str, str]]:
    """Every warm backup loaded or loading on ``servers``, as (app, server, variant).

    A backup that now serves its app is not one. Read from the records, not from a snapshot:
    a snapshot over capacity does not count warm backups (``_DEMOTION_STAGES``), and a re-plan
    that diffed against it would never unload the surplus backups that put the server over.
    """
    known = set(servers)
    return {(app_id, r.server_id, r.variant) for app_id, record in apps.items()
            for r in record.replicas
            if r.role is Role.WARM and r.state in _ACTIVE and record.serving != r.key
            and r.server_id in known}


def free_memory_mb(server: ServerRecord, records: Iterable[AppRecord],
                   families: Mapping[str, Family]) -> float:
    """The server's memory left after the replicas ``records`` hold there (loaded or loading).

    What one server's ``ClusterSnapshot.free`` says, from the records of the apps on it only
    (``RecordStore.apps_on``), for decisions that must not wait for a whole snapshot.
    """
    used = 0.0
    for record in records:
        family = families.get(record.spec.family)
        if family is None:
            continue
        seen: set[tuple[str, str]] = set()
        for replica in record.replicas:
            if replica.server_id != server.server_id or replica.state not in _ACTIVE or \
                    replica.key in seen:
                continue
            seen.add(replica.key)
            try:
                used += family.variant(resource_variant(replica.variant, replica.role)).demand(
                    record.spec.max_rate_rps)[MEMORY_MB]
            except PolicyError:
                continue
    return server.capacity.get(MEMORY_MB, 0.0) - used


@dataclass(frozen=True, slots=True)
class _AppPart:
    """One app's share of a snapshot, worked out from one record."""

    record: AppRecord
    application: Application | None
    """None: the app is left out (unknown family, or its primary fits no server)."""
    placements: tuple[Placement, ...]


@dataclass
class _PartCache:
    """Apps' shares of the last snapshots, valid for one set of servers and capacities."""

    servers_key: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
    parts: dict[str, _AppPart]


_cache = _PartCache((), {})
"""The cache's records are the store's shared read-only ones, new objects after every write,
so an app's share is reused exactly while its record is unchanged: a snapshot of 10,000
apps then costs what the few changed ones and the snapshot's own checks cost. (Replaced, never
changed in place, when the servers change: snapshots are built in threads too.)"""


def _app_part(record: AppRecord, families: Mapping[str, Family],
              servers: Mapping[str, ServerRecord], capacities: list[Resources]) -> _AppPart:
    if not _fits_somewhere(record, families, capacities) or \
            record.spec.family not in families:
        return _AppPart(record, None, ())
    placements: list[Placement] = []
    seen: set[tuple[str, str]] = set()
    replicas = sorted((r for r in record.replicas if r.state in _ACTIVE
                       and r.server_id in servers),
                      key=lambda r: (record.serving != r.key, _RANK[r.role]))
    names = {v.name for v in families[record.spec.family].variants}
    for replica in replicas:
        key = (replica.server_id, resource_variant(replica.variant, replica.role))
        if key in seen or key[1] not in names:  # one placement per (server, variant)
            continue
        seen.add(key)
        role = replica.role
        if record.serving == replica.key:
            role = Role.PRIMARY
        elif role is Role.PRIMARY and record.serving is not None:
            role = Role.UPGRADE  # a primary-to-be while another replica serves
        placements.append(Placement(record.app_id, replica.server_id, key[1], role))
    return _AppPart(record, application(record), tuple(placements))


def build_snapshot(families: Mapping[str, Family], servers: Mapping[str, ServerRecord],
                   apps: Mapping[str, AppRecord], failed: Iterable[str] = ()) -> ClusterSnapshot:
    """The cluster as the controller believes it is.

    The replica clients use is the app's PRIMARY placement (whatever role it was loaded as),
    so an app whose interim is on a server that fails is "affected" like any other. Servers
    that are failed, draining or drained, plus ``failed``, are failed in the snapshot: no new
    replica goes there. Replicas being loaded count as placed (their memory is reserved).
    """
    global _cache  # noqa: PLW0603 - replaced whole, see _cache
    servers_key = tuple((s, tuple(sorted(r.capacity.items()))) for s, r in servers.items())
    cache = _cache
    if cache.servers_key != servers_key:
        cache = _cache = _PartCache(servers_key, {})
    capacities = list({key: Resources(dict(key)) for _, key in servers_key}.values())
    parts = []
    for app_id, record in apps.items():
        part = cache.parts.get(app_id)
        if part is None or part.record is not record or part.application is None and \
                record.spec.family in families:
            part = _app_part(record, families, servers, capacities)
            cache.parts[app_id] = part
        parts.append(part)
    if len(cache.parts) > 2 * len(apps) + 100:  # deleted apps
        cache.parts = {a: p for a, p in cache.parts.items() if a in apps}
    down = {s.server_id for s in servers.values() if s.state is not ServerState.UP}
    down |= set(failed)
    placements = [p for part in parts if part.application is not None for p in part.placements]
    site_ids = sorted({s.site_id for s in servers.values()})
    common: dict[str, Any] = {
        "families": families, "sites": tuple(Site(s) for s in site_ids),
        "servers": tuple(Server(s.server_id, s.site_id, Resources(s.capacity), s.server_type)
                         for s in servers.values()),
        "apps": tuple(part.application for part in parts if part.application is not None),
        "failed_servers": frozenset(down & servers.keys())}
    error: CapacityExceededError | None = None
    for demoted in _DEMOTION_STAGES:
        try:
            return ClusterSnapshot(placements=tuple(
                Placement(p.app_id, p.server_id, p.variant, Role.COLD) if p.role in demoted
                else p for p in placements), **common)
        except CapacityExceededError as exc:
            error = exc
            # Transient replicas (an interim next to its target, a backup next to an
            # upgrade) can briefly exceed a server on paper; policies must still get a view.
            logger.warning("snapshot over capacity (%s); not counting %s replicas", exc,
                           "/".join(sorted(r.value for r in demoted)) or "no")
    assert error is not None  # noqa: S101 - every stage failed, so one was caught
    raise error
