"""Small builders for hand-made policy inputs: families, servers, apps, snapshots.

Keep them generic: every policy's unit tests may use them. Defaults are the simplest valid
values (one reference server type, compute 100 % of a GPU, no SLO, no exclusions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from policies.model import (
    REFERENCE_SERVER_TYPE,
    Application,
    ClusterSnapshot,
    Family,
    Placement,
    Role,
    Server,
    Site,
    Variant,
)
from policies.resources import COMPUTE, MEMORY_MB, Resources

VariantSpec = tuple[str, float, float]
"""(variant name, memory_mb, normalised accuracy)."""


def make_family(name: str, specs: Sequence[VariantSpec], *,
                compute_per_rps: float | Sequence[float] = 0.0,
                latency_ms: Sequence[Mapping[str, float] | float] | None = None,
                base_compute: float = 0.0) -> Family:
    """A family from ``(variant, memory_mb, accuracy)`` triples.

    ``compute_per_rps`` is one figure for every variant or one per spec; ``latency_ms`` holds
    per spec either a reference latency or a full ``{server type: ms}`` mapping.
    """
    count = len(specs)
    rates = ([float(compute_per_rps)] * count if isinstance(compute_per_rps, (int, float))
             else [float(c) for c in compute_per_rps])
    latencies: list[Mapping[str, float]] = []
    for value in latency_ms if latency_ms is not None else [0.0] * count:
        latencies.append({REFERENCE_SERVER_TYPE: float(value)}
                         if isinstance(value, (int, float)) else dict(value))
    if len(rates) != count or len(latencies) != count:
        raise ValueError("compute_per_rps and latency_ms need one entry per variant")
    variants = tuple(
        Variant(name=variant, family=name, accuracy=accuracy,
                base_demand=Resources({MEMORY_MB: memory_mb, COMPUTE: base_compute}),
                compute_per_rps=rate, latency_ms=latency)
        for (variant, memory_mb, accuracy), rate, latency in zip(specs, rates, latencies,
                                                                  strict=True))
    return Family(name, variants)


def make_server(server_id: str, memory_mb: float, *, site: str = "site-a", compute: float = 100.0,
                server_type: str = REFERENCE_SERVER_TYPE, speed: float = 1.0,
                **extra: float) -> Server:
    """A server with ``memory_mb`` of GPU memory, ``compute`` percent and ``extra`` resources."""
    capacity = Resources({MEMORY_MB: memory_mb, COMPUTE: compute, **extra})
    return Server(server_id, site, capacity, server_type=server_type, speed=speed)


def make_servers(memory_mb: Mapping[str, float], **kwargs: Any) -> list[Server]:
    """One ``make_server`` per ``{server_id: memory_mb}`` entry, sharing ``kwargs``."""
    return [make_server(server_id, memory, **kwargs) for server_id, memory in memory_mb.items()]


def make_app(app_id: str, family: str | Family, **kwargs: Any) -> Application:
    """An application; ``kwargs`` are ``Application`` fields (critical, latency_slo_ms, ...)."""
    family_name = family.name if isinstance(family, Family) else family
    for key in ("excluded_servers", "excluded_sites", "allowed_backup_sites"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = frozenset(kwargs[key])
    return Application(app_id, family_name, **kwargs)


def make_snapshot(families: Iterable[Family], servers: Iterable[Server],
                  apps: Iterable[Application], *, placements: Iterable[Placement] = (),
                  failed: Iterable[str] = ()) -> ClusterSnapshot:
    """A snapshot whose sites are those the servers name."""
    server_list = tuple(servers)
    sites = tuple(Site(s) for s in sorted({server.site_id for server in server_list}))
    return ClusterSnapshot(families={f.name: f for f in families}, sites=sites,
                           servers=server_list, apps=tuple(apps),
                           placements=tuple(placements), failed_servers=frozenset(failed))


def placement(app_id: str, server_id: str, variant: str, role: Role = Role.PRIMARY) -> Placement:
    """A replica of ``variant`` of ``app_id`` on ``server_id`` (a primary by default)."""
    return Placement(app_id, server_id, variant, role)


def primary_placements(families: Iterable[Family], apps: Iterable[Application],
                       where: Mapping[str, str]) -> list[Placement]:
    """A PRIMARY placement of each app's primary variant on the server ``where[app_id]`` names."""
    by_name = {f.name: f for f in families}
    by_id = {a.app_id: a for a in apps}
    out = []
    for app_id, server_id in where.items():
        app = by_id[app_id]
        family = by_name[app.family]
        variant = (family.variant(app.primary_variant) if app.primary_variant is not None
                   else family.most_accurate)
        out.append(Placement(app_id, server_id, variant.name, Role.PRIMARY))
    return out
