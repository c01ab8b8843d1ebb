"""The data model every policy reads: families, variants, apps, servers, sites, placements.

All values are frozen and validated on construction. A ``ClusterSnapshot`` is the one input
of every policy; it checks that its parts agree with each other (no dangling ids, no
over-committed server) and precomputes the indexes the policies need.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from types import MappingProxyType
from typing import TypeVar

from policies.errors import (
    CapacityExceededError,
    DuplicateIdError,
    InvalidInputError,
    UnknownFamilyError,
    UnknownReferenceError,
    VariantTooLargeError,
)
from policies.resources import COMPUTE, MEMORY_MB, Resources

T = TypeVar("T")

REFERENCE_SERVER_TYPE = "reference"
"""Key of a variant's latency measured (or estimated) on the reference GPU."""

_LATENCY_SLACK_MS = 1e-9
"""Latencies are sums of floats read from profiles; compare them with this slack."""

_DEMAND_MEMO_SIZE = 1024
"""Rates whose demand a variant remembers (an app's max rate is one; apps often share it)."""


class Role(StrEnum):
    """What a loaded (or stored) replica is for."""

    PRIMARY = "primary"
    WARM = "warm"
    COLD = "cold"
    INTERIM = "interim"
    UPGRADE = "upgrade"
    INSTANCE = "instance"
    """One more instance of the app's variant, serving beside the primary (load balanced)."""
    PARITY = "parity"
    """A parity model of the app's instances (ParM; ``policies.protection``)."""


def _require_id(value: str, what: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-empty string, got {value!r}")


def _require_positive(value: float, what: str) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{what} must be a positive finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class Variant:
    """One model of a family with its profiled cost and normalised accuracy.

    ``base_demand`` holds the rate-independent resources (GPU memory at least);
    compute grows with the request rate: ``compute_per_rps`` percent of a reference GPU per
    request/s. ``latency_ms`` maps a server type to batch-1 inference latency; the
    ``reference`` entry is required and is scaled by a server's ``speed`` for unlisted types.
    """

    name: str
    family: str
    accuracy: float
    base_demand: Resources
    compute_per_rps: float = 0.0
    latency_ms: Mapping[str, float] = field(default_factory=lambda: {REFERENCE_SERVER_TYPE: 0.0})
    load_time_s: float | None = None
    top1_pct: float | None = None
    size_mb: float | None = None
    _demand_memo: dict[float, Resources] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require_id(self.name, "variant name")
        _require_id(self.family, f"family of variant {self.name!r}")
        if not 0.0 < self.accuracy <= 1.0:
            raise InvalidInputError(
                f"variant {self.name!r}: normalised accuracy must be in (0, 1], "
                f"got {self.accuracy}")
        base = Resources.non_negative(self.base_demand, what=f"variant {self.name!r} demand")
        if base[MEMORY_MB] <= 0:
            raise InvalidInputError(f"variant {self.name!r}: memory demand must be positive")
        object.__setattr__(self, "base_demand", base)
        if not math.isfinite(self.compute_per_rps) or self.compute_per_rps < 0:
            raise InvalidInputError(f"variant {self.name!r}: compute_per_rps must be >= 0")
        if REFERENCE_SERVER_TYPE not in self.latency_ms:
            raise InvalidInputError(f"variant {self.name!r}: latency_ms needs a 'reference' entry")
        if any(not math.isfinite(v) or v < 0 for v in self.latency_ms.values()):
            raise InvalidInputError(f"variant {self.name!r}: latencies must be >= 0")
        object.__setattr__(self, "latency_ms", MappingProxyType(dict(self.latency_ms)))

    @property
    def memory_mb(self) -> float:
        """GPU memory this variant occupies once loaded."""
        return self.base_demand[MEMORY_MB]

    def demand(self, rate_rps: float) -> Resources:
        """Resources one replica needs to serve ``rate_rps`` requests per second.

        Remembered per rate (the variant is immutable): every snapshot build asks again.
        """
        if type(rate_rps) not in (float, int) or not rate_rps > 0:
            return self.base_demand.plus(COMPUTE, self.compute_per_rps * rate_rps)
        memo = self._demand_memo
        found = memo.get(rate_rps)
        if found is None:
            found = self.base_demand.plus(COMPUTE, self.compute_per_rps * rate_rps)
            if len(memo) >= _DEMAND_MEMO_SIZE:
                memo.clear()  # bounded; clear() rather than evict one, safe across threads
            memo[rate_rps] = found
        return found

    def latency_on(self, server: Server) -> float:
        """Batch-1 latency on ``server``: its type's figure, else reference / speed."""
        return latency_for(self, server.server_type, server.speed)


@dataclass(frozen=True, slots=True)
class Family:
    """Variants of one architecture ordered from smallest to largest GPU memory."""

    name: str
    variants: tuple[Variant, ...]

    def __post_init__(self) -> None:
        _require_id(self.name, "family name")
        if not self.variants:
            raise InvalidInputError(f"family {self.name!r} has no variants")
        ordered = tuple(sorted(self.variants, key=lambda v: (v.memory_mb, v.name)))
        names = [v.name for v in ordered]
        if len(set(names)) != len(names):
            raise DuplicateIdError(f"family {self.name!r} lists a variant twice: {names}")
        stray = [v.name for v in ordered if v.family != self.name]
        if stray:
            raise InvalidInputError(f"variants {stray} do not belong to family {self.name!r}")
        object.__setattr__(self, "variants", ordered)

    @property
    def smallest(self) -> Variant:
        return self.variants[0]

    @property
    def largest(self) -> Variant:
        return self.variants[-1]

    @property
    def most_accurate(self) -> Variant:
        """The best variant; ties go to the larger one (the full-size model)."""
        return max(self.variants, key=lambda v: (v.accuracy, v.memory_mb))

    def variant(self, name: str) -> Variant:
        for candidate in self.variants:
            if candidate.name == name:
                return candidate
        raise UnknownReferenceError(f"family {self.name!r} has no variant {name!r}")

    def index(self, name: str) -> int:
        """Position of ``name`` in size order (0 = smallest)."""
        return self.variants.index(self.variant(name))


@dataclass(frozen=True, slots=True)
class Site:
    """An edge site: servers in one site fail together in a site-wide outage."""

    site_id: str

    def __post_init__(self) -> None:
        _require_id(self.site_id, "site id")


@dataclass(frozen=True, slots=True)
class Server:
    """A GPU server with a capacity per resource type."""

    server_id: str
    site_id: str
    capacity: Resources
    server_type: str = REFERENCE_SERVER_TYPE
    speed: float = 1.0

    def __post_init__(self) -> None:
        _require_id(self.server_id, "server id")
        _require_id(self.site_id, f"site of server {self.server_id!r}")
        capacity = Resources.non_negative(self.capacity, what=f"server {self.server_id!r} capacity")
        object.__setattr__(self, "capacity", capacity)
        _require_positive(self.speed, f"server {self.server_id!r} speed")


@dataclass(frozen=True, slots=True)
class Application:
    """A registered inference service and the user's constraints on where it may run.

    ``critical`` puts the app in K (it must get a warm backup). ``warm_replicas`` overrides
    the configured number R of warm backups for this app. Backups never go to
    ``excluded_servers`` or ``excluded_sites``; when ``allowed_backup_sites`` is set they go
    only to those sites (FailLite §3.4's exclusion list). Pins and ``allow_larger_backups``
    (a backup or failover variant may be above the primary): ``policies/replica_rules.py``.
    """

    app_id: str
    family: str
    critical: bool = False
    max_rate_rps: float = 1.0
    latency_slo_ms: float | None = None
    primary_variant: str | None = None
    pinned_server: str | None = None
    pinned_site: str | None = None
    excluded_servers: frozenset[str] = frozenset()
    excluded_sites: frozenset[str] = frozenset()
    allowed_backup_sites: frozenset[str] | None = None
    warm_replicas: int | None = None
    allow_larger_backups: bool = False

    def __post_init__(self) -> None:
        _require_id(self.app_id, "app id")
        _require_id(self.family, f"family of app {self.app_id!r}")
        _require_positive(self.max_rate_rps, f"app {self.app_id!r} max_rate_rps")
        if self.latency_slo_ms is not None:
            _require_positive(self.latency_slo_ms, f"app {self.app_id!r} latency_slo_ms")
        if self.warm_replicas is not None and (
                not isinstance(self.warm_replicas, int) or self.warm_replicas < 0):
            raise InvalidInputError(f"app {self.app_id!r}: warm_replicas must be an integer >= 0")
        object.__setattr__(self, "excluded_servers", frozenset(self.excluded_servers))
        object.__setattr__(self, "excluded_sites", frozenset(self.excluded_sites))
        if self.allowed_backup_sites is not None:
            object.__setattr__(self, "allowed_backup_sites", frozenset(self.allowed_backup_sites))

    def backups_wanted(self, default: int) -> int:
        """Warm backups this app asks for: its own ``warm_replicas``, else ``default`` (R)."""
        return default if self.warm_replicas is None else self.warm_replicas

    def meets_slo(self, variant: Variant, server: Server) -> bool:
        """True when ``variant`` on ``server`` answers within the app's latency SLO (if any)."""
        return (self.latency_slo_ms is None
                or variant.latency_on(server) <= self.latency_slo_ms + _LATENCY_SLACK_MS)

    def may_back_up_on(self, server: Server) -> bool:
        """True unless the user's exclusion list forbids a backup on ``server``."""
        if server.server_id in self.excluded_servers or server.site_id in self.excluded_sites:
            return False
        return self.allowed_backup_sites is None or server.site_id in self.allowed_backup_sites


@dataclass(frozen=True, slots=True)
class Placement:
    """A replica of ``variant`` of ``app_id`` on ``server_id`` in a given role."""

    app_id: str
    server_id: str
    variant: str
    role: Role

    def __post_init__(self) -> None:
        _require_id(self.app_id, "placement app id")
        _require_id(self.server_id, "placement server id")
        _require_id(self.variant, "placement variant")
        object.__setattr__(self, "role", Role(self.role))


def _index_unique(items: Sequence[T], key: str, what: str) -> dict[str, T]:
    ident = attrgetter(key)
    index = {ident(item): item for item in items}
    if len(index) < len(items):
        index = {}
        for item in items:  # name the first repeat in input order
            if ident(item) in index:
                raise DuplicateIdError(f"duplicate {what} id {ident(item)!r}")
            index[ident(item)] = item
    return index


class _Variants(dict[tuple[str, str | None], Variant]):
    """Variants by (family, name), ``None`` naming the most accurate; a cache for one build."""

    __slots__ = ("families",)

    def __init__(self, families: Mapping[str, Family]) -> None:
        super().__init__()
        self.families = families

    def __missing__(self, key: tuple[str, str | None]) -> Variant:
        family, name = self.families[key[0]], key[1]
        found = self[key] = family.most_accurate if name is None else family.variant(name)
        return found


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at, frozen at one instant.

    ``failed_servers`` are known dead: their capacity is unusable and their replicas are lost.
    ``free`` is each live server's capacity minus what its placements use.
    """

    families: Mapping[str, Family]
    sites: tuple[Site, ...]
    servers: tuple[Server, ...]
    apps: tuple[Application, ...]
    placements: tuple[Placement, ...] = ()
    failed_servers: frozenset[str] = frozenset()

    site_by_id: Mapping[str, Site] = field(init=False, repr=False, compare=False)
    server_by_id: Mapping[str, Server] = field(init=False, repr=False, compare=False)
    app_by_id: Mapping[str, Application] = field(init=False, repr=False, compare=False)
    used: Mapping[str, Resources] = field(init=False, repr=False, compare=False)
    free: Mapping[str, Resources] = field(init=False, repr=False, compare=False)
    primary_by_app: Mapping[str, Placement] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "families", MappingProxyType(dict(self.families)))
        set_(self, "sites", tuple(self.sites))
        set_(self, "servers", tuple(self.servers))
        set_(self, "apps", tuple(self.apps))
        set_(self, "placements", tuple(self.placements))
        set_(self, "failed_servers", frozenset(self.failed_servers))
        for name, family in self.families.items():
            if name != family.name:
                raise InvalidInputError(f"family registered as {name!r} is named {family.name!r}")
        set_(self, "site_by_id", MappingProxyType(_index_unique(self.sites, "site_id", "site")))
        set_(self, "server_by_id",
             MappingProxyType(_index_unique(self.servers, "server_id", "server")))
        set_(self, "app_by_id", MappingProxyType(_index_unique(self.apps, "app_id", "app")))
        self._check_references()
        variants = _Variants(self.families)
        self._check_apps_fit(variants)
        self._index_placements(variants)

    # --- validation -------------------------------------------------------------------------

    def _check_references(self) -> None:
        for server in self.servers:
            if server.site_id not in self.site_by_id:
                raise UnknownReferenceError(
                    f"server {server.server_id!r} is in unknown site {server.site_id!r}")
        self._check_failed(self.failed_servers)
        for app in self.apps:
            family = self.families.get(app.family)
            if family is None:
                raise UnknownFamilyError(
                    f"app {app.app_id!r} uses unknown family {app.family!r}; "
                    f"known: {sorted(self.families)}")
            if app.primary_variant is not None:
                family.variant(app.primary_variant)
            if app.pinned_server is not None:
                pinned = self.server_by_id.get(app.pinned_server)
                if pinned is None:
                    raise UnknownReferenceError(
                        f"app {app.app_id!r} is pinned to unknown server {app.pinned_server!r}")
                if app.pinned_site is not None and pinned.site_id != app.pinned_site:
                    raise InvalidInputError(
                        f"app {app.app_id!r} is pinned to server {app.pinned_server!r} "
                        f"outside its pinned site {app.pinned_site!r}")
            if app.pinned_site is not None and app.pinned_site not in self.site_by_id:
                raise UnknownReferenceError(
                    f"app {app.app_id!r} is pinned to unknown site {app.pinned_site!r}")

    def _check_failed(self, failed: frozenset[str]) -> None:
        unknown_failed = failed - self.server_by_id.keys()
        if unknown_failed:
            raise UnknownReferenceError(f"failed servers {sorted(unknown_failed)} are unknown")

    def _check_apps_fit(self, variants: _Variants) -> None:
        if not self.servers:
            return
        # Servers with equal capacities answer alike: test each distinct capacity once.
        capacities = list({tuple(s.capacity.items()): s.capacity for s in self.servers}.values())
        for app in self.apps:
            variant = variants[app.family, app.primary_variant]
            demand = variant.demand(app.max_rate_rps)
            for capacity in capacities:  # a plain loop: any() over a generator costs more
                if demand.fits_within(capacity):
                    break
            else:
                raise VariantTooLargeError(
                    f"app {app.app_id!r}: variant {variant.name!r} needs {demand} at "
                    f"{app.max_rate_rps:g} req/s, more than any server's whole capacity")

    def _index_placements(self, variants: _Variants) -> None:
        usage: dict[str, dict[str, float]] = {s.server_id: {} for s in self.servers}
        primaries: dict[str, Placement] = {}
        seen: set[tuple[str, str, str]] = set()
        # Bound once: the loop runs per placement, and an enum member lookup is not free.
        app_of, sums_of, mark = self.app_by_id.get, usage.get, seen.add
        primary, cold = Role.PRIMARY, Role.COLD
        for placement in self.placements:
            app_id, server_id, name = placement.app_id, placement.server_id, placement.variant
            app = app_of(app_id)
            if app is None:
                raise UnknownReferenceError(f"placement names unknown app {app_id!r}")
            sums = sums_of(server_id)
            if sums is None:
                raise UnknownReferenceError(
                    f"placement of {app_id!r} names unknown server {server_id!r}")
            variant = variants[app.family, name]
            key = (app_id, server_id, name)
            if key in seen:
                raise DuplicateIdError(
                    f"variant {name!r} of {app_id!r} placed twice on {server_id!r}")
            mark(key)
            role = placement.role
            if role is primary:
                if app_id in primaries:
                    raise DuplicateIdError(f"app {app_id!r} has two primaries")
                primaries[app_id] = placement
            if role is not cold:
                # Summed in placement order from zero, exactly as ``total`` would.
                for resource, amount in variant.demand(app.max_rate_rps).items():
                    sums[resource] = sums.get(resource, 0.0) + amount
        used = {server_id: Resources(sums) for server_id, sums in usage.items()}
        for server in self.servers:
            if not used[server.server_id].fits_within(server.capacity):
                raise CapacityExceededError(
                    f"server {server.server_id!r}: placements use {used[server.server_id]}, "
                    f"capacity is {server.capacity}")
        free = {s.server_id: s.capacity - used[s.server_id]
                for s in self.servers if s.server_id not in self.failed_servers}
        object.__setattr__(self, "used", MappingProxyType(used))
        object.__setattr__(self, "free", MappingProxyType(free))
        object.__setattr__(self, "primary_by_app", MappingProxyType(primaries))

    def _derive(self, **changes: object) -> ClusterSnapshot:
        """A copy with ``changes`` set as they are: the caller keeps the copy consistent."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    # --- queries ------------------------------------------------------------------------------

    def family_of(self, app: Application) -> Family:
        return self.families[app.family]

    def primary_variant(self, app: Application) -> Variant:
        """The variant the app serves with when healthy (default: the family's best)."""
        family = self.families[app.family]
        if app.primary_variant is not None:
            return family.variant(app.primary_variant)
        return family.most_accurate

    def variant_of(self, placement: Placement) -> Variant:
        app = self.app_by_id[placement.app_id]
        return self.families[app.family].variant(placement.variant)

    def live_servers(self) -> tuple[Server, ...]:
        return tuple(s for s in self.servers if s.server_id not in self.failed_servers)

    def site_of(self, server_id: str) -> str:
        return self.server_by_id[server_id].site_id

    def placements_of(self, app_id: str, role: Role | None = None) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements
                     if p.app_id == app_id and (role is None or p.role is role))

    def with_placements(self, placements: Iterable[Placement]) -> ClusterSnapshot:
        """A copy with ``placements`` replacing the current ones (re-validated).

        Only the placements are checked and indexed again (nothing else changed), with the
        errors a full build would raise.
        """
        copy = self._derive(placements=tuple(placements))
        copy._index_placements(_Variants(self.families))
        return copy

    def with_failed(self, server_ids: Iterable[str]) -> ClusterSnapshot:
        """A copy in which ``server_ids`` are failed too (unknown ids: UnknownReferenceError).

        Placements are unchanged, so ``used`` and the indexes carry over; failed servers
        only leave ``free``.
        """
        failed = self.failed_servers | frozenset(server_ids)
        self._check_failed(failed)
        free = {k: v for k, v in self.free.items() if k not in failed}
        return self._derive(failed_servers=failed, free=MappingProxyType(free))


def latency_for(variant: Variant, server_type: str, speed: float) -> float:
    """Latency of ``variant`` on a server of ``server_type`` and ``speed``.

    A figure measured on that server type wins; otherwise the reference figure is scaled
    by the server's speed (the reference server has speed 1).
    """
    if server_type != REFERENCE_SERVER_TYPE:
        measured = variant.latency_ms.get(server_type)
        if measured is not None:
            return measured
    return variant.latency_ms[REFERENCE_SERVER_TYPE] / speed


def accuracy_reduction(primary: Variant, backup: Variant) -> float:
    """Relative accuracy lost when ``backup`` serves instead of ``primary`` (0.0 .. 1.0)."""
    return max(0.0, 1.0 - backup.accuracy / primary.accuracy)
