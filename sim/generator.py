"""Seeded generator of edge clusters with apps and worst-fit primaries, as in FailLite §5.1/§5.3.

The paper fixes the applications and controls the spare capacity with a *headroom*
parameter. We do the same: every server gets the same capacity, sized so that after the
primaries are placed a ``headroom`` share of the cluster's memory and compute stays free.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from policies.model import Application, ClusterSnapshot, Family, Server, Site
from policies.primary import place_primaries
from policies.resources import COMPUTE, MEMORY_MB, Resources

MAX_PRIMARY_COMPUTE_PCT = 20.0
"""An app's request rate is capped so its primary needs at most this share of one GPU.

This generator makes the small live testbeds' workloads (``deploy.workload``); the
simulator's paper-sized clusters come from ``sim.cluster``, whose cap and rates are
calibrated (``sim.cluster.MixKnobs``)."""

SLO_FACTOR = 3.0
"""A generated app's latency SLO is this multiple of its primary's reference latency..."""

SLO_FLOOR_MS = 20.0
"""...but never below this floor, so small models keep a realistic budget."""


def generate_cluster(families: Mapping[str, Family], *, servers: int = 6, sites: int = 3,
                     apps: int = 24, headroom: float = 0.2, critical_fraction: float = 0.5,
                     seed: int = 0, family_names: Sequence[str] | None = None,
                     rate_rps: tuple[float, float] = (1.0, 10.0)) -> ClusterSnapshot:
    """A cluster of ``servers`` identical servers in ``sites`` sites with ``apps`` placed apps.

    A server is never smaller than the largest variant of any app's family at that app's rate
    (memory and compute apart), so with few apps per server the free share can exceed
    ``headroom``.

    Families are drawn uniformly from ``family_names`` (default: every family). A random
    ``critical_fraction`` of the apps is in K. Deterministic for a given ``seed``.
    """
    if servers < 1 or sites < 1 or sites > servers:
        raise ValueError(f"need 1 <= sites <= servers, got sites={sites}, servers={servers}")
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if not 0.0 <= critical_fraction <= 1.0:
        raise ValueError(f"critical_fraction must be in [0, 1], got {critical_fraction}")
    names = sorted(family_names or families)
    unknown = [n for n in names if n not in families]
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {sorted(families)}")

    rng = random.Random(seed)
    app_list = _generate_apps(families, names, apps, critical_fraction, rate_rps, rng)
    site_list = tuple(Site(f"site-{i:02d}") for i in range(sites))
    per_site = math.ceil(servers / sites)
    demands = [families[a.family].most_accurate.demand(a.max_rate_rps) for a in app_list]
    needed = {r: sum(d[r] for d in demands) / (servers * (1.0 - headroom))
              for r in (MEMORY_MB, COMPUTE)}
    # Any variant an app may run (a backup, a degraded replica) fits an empty server: a
    # measured family's smaller variant can need more compute than its primary (jitter read
    # as compute), and servers sized to the primaries alone could then hold none of its
    # backups (a one-app cluster got a compute capacity of 0).
    variant_demands = [v.demand(a.max_rate_rps) for a in app_list
                       for v in families[a.family].variants]
    biggest = {r: max((d[r] for d in variant_demands), default=0.0) for r in (MEMORY_MB, COMPUTE)}

    # Worst-fit can leave a little fragmentation; grow capacity by 1 % steps until all fit.
    # Memory worst-fit places the largest models first: apps whose compute is large for their
    # memory (a measured CPU family beside GPU-estimated ones) can need more than +50 %.
    for attempt in range(200):
        grow = 1.0 + 0.01 * attempt
        capacity = Resources({r: max(needed[r] * grow, biggest[r]) for r in needed})
        server_list = tuple(
            Server(f"srv-{k:03d}", site_list[min(k // per_site, sites - 1)].site_id, capacity)
            for k in range(servers))
        snapshot = ClusterSnapshot(families, site_list, server_list, app_list)
        result = place_primaries(snapshot)
        if not result.unplaced:
            return snapshot.with_placements(result.placements)
    raise RuntimeError("could not place every primary; lower apps or raise headroom")


def _generate_apps(families: Mapping[str, Family], names: Sequence[str], count: int,
                   critical_fraction: float, rate_rps: tuple[float, float],
                   rng: random.Random) -> tuple[Application, ...]:
    critical = set(rng.sample(range(count), round(critical_fraction * count)))
    apps = []
    for index in range(count):
        family = families[rng.choice(names)]
        primary = family.most_accurate
        rate = rng.uniform(*rate_rps)
        if primary.compute_per_rps > 0:
            rate = min(rate, MAX_PRIMARY_COMPUTE_PCT / primary.compute_per_rps)
        slo = max(SLO_FACTOR * primary.latency_ms["reference"], SLO_FLOOR_MS)
        apps.append(Application(
            app_id=f"app-{index:04d}", family=family.name, critical=index in critical,
            max_rate_rps=round(rate, 3), latency_slo_ms=round(slo, 3)))
    return tuple(apps)
