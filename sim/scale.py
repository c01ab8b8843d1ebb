"""FailLite Fig. 13 (§5.8): runtime of the progressive heuristic as the instance grows.

"We fix the number of servers as 500, applications as 1000, and model variants as 4, and show
the effect of changing each." An instance has ``servers`` live A2 servers in 10 sites, each
with a background primary using 70 % of its memory and compute, and ``apps`` affected apps
whose primaries sat on servers that have just failed. Families are synthetic (seeded) so that
every one has exactly ``variants`` variants: memory log-spaced from 20-120 MB to 300-3000 MB,
normalised accuracy rising to 1.0, compute and latency growing with size.

We time Algorithm 1 (``policies.progressive.plan_progressive``, the paper's "heuristic model
selection and placement") and the whole ``UnderstudyPolicy.plan_failover`` call around it
(marking servers failed, sorting warm and cold apps, then Algorithm 1); the median of
``repeats`` runs. Wall times depend on the machine and its load: unlike every other experiment
these numbers are not reproducible to the byte.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass

from policies.failover import UnderstudyPolicy, split_affected
from policies.model import (
    Application,
    ClusterSnapshot,
    Family,
    Placement,
    Role,
    Server,
    Site,
    Variant,
)
from policies.primary import worst_fit
from policies.progressive import plan_progressive
from policies.resources import MEMORY_MB, Resources
from sim.cluster import A2_CAPACITY

SITES = 10
FAMILIES = 40
BACKGROUND_SHARE = 0.7

DEFAULT_APPS, DEFAULT_SERVERS, DEFAULT_VARIANTS = 1000, 500, 4
"""The fixed point of Fig. 13."""


@dataclass(frozen=True, slots=True)
class ScalePoint:
    """One timed instance."""

    axis: str
    apps: int
    servers: int
    variants: int
    seed: int
    heuristic_ms: float
    plan_failover_ms: float
    recovered: int
    demand_ratio: float


def synthetic_families(variants: int, rng: random.Random) -> list[Family]:
    """``FAMILIES`` families of exactly ``variants`` variants each."""
    out = []
    for f in range(FAMILIES):
        name = f"fam-{f:02d}"
        low, high = rng.uniform(20.0, 120.0), rng.uniform(300.0, 3000.0)
        sizes = [low * (high / low) ** (j / max(1, variants - 1)) for j in range(variants)]
        top = rng.uniform(0.75, 0.95)
        accuracy = [top + (1.0 - top) * math.sqrt(j / max(1, variants - 1))
                    for j in range(variants)]
        out.append(Family(name, tuple(
            Variant(f"{name}-v{j}", name, round(min(1.0, accuracy[j]), 6),
                    Resources({MEMORY_MB: round(m, 1)}), compute_per_rps=round(m / 800.0, 4),
                    latency_ms={"reference": round(1.0 + m / 50.0, 3)})
            for j, m in enumerate(sizes))))
    return out


def _background() -> Family:
    demand = A2_CAPACITY.scaled(BACKGROUND_SHARE)
    return Family("background", (Variant("background", "background", 1.0, demand),))


def build_instance(apps: int, servers: int, variants: int,
                   seed: int) -> tuple[ClusterSnapshot, tuple[str, ...]]:
    """The snapshot before the failure and the servers that fail (all hosting affected apps)."""
    rng = random.Random(seed)
    families = synthetic_families(variants, rng)
    sites = tuple(Site(f"site-{s:02d}") for s in range(SITES))
    live = [Server(f"live-{k:04d}", sites[k % SITES].site_id, A2_CAPACITY)
            for k in range(servers)]
    app_list = [Application(f"bg-{k:04d}", "background") for k in range(servers)]
    placements = [Placement(a.app_id, s.server_id, "background", Role.PRIMARY)
                  for a, s in zip(app_list, live, strict=True)]
    failed: list[Server] = []
    free: dict[str, Resources] = {}
    for index in range(apps):
        family = rng.choice(families)
        primary = family.most_accurate
        rate = min(rng.uniform(1.0, 10.0), 20.0 / primary.compute_per_rps)
        app = Application(f"app-{index:05d}", family.name, critical=rng.random() < 0.5,
                          max_rate_rps=round(rate, 3))
        demand = primary.demand(app.max_rate_rps)
        server = worst_fit(failed, demand, free)
        if server is None:
            server = Server(f"failed-{len(failed):04d}", sites[len(failed) % SITES].site_id,
                            A2_CAPACITY)
            failed.append(server)
            free[server.server_id] = server.capacity
        free[server.server_id] = free[server.server_id] - demand
        app_list.append(app)
        placements.append(Placement(app.app_id, server.server_id, primary.name, Role.PRIMARY))
    catalogue = {f.name: f for f in [*families, _background()]}
    snapshot = ClusterSnapshot(catalogue, sites, tuple(live + failed), tuple(app_list),
                               tuple(placements))
    return snapshot, tuple(s.server_id for s in failed)


def time_point(axis: str, apps: int, servers: int, variants: int, seed: int,
               repeats: int) -> ScalePoint:
    """Build one instance and time the heuristic on it (median of ``repeats``)."""
    snapshot, failed = build_instance(apps, servers, variants, seed)
    after, _, cold = split_affected(snapshot, failed)
    heuristic, whole = [], []
    plan = None
    policy = UnderstudyPolicy()
    for _ in range(repeats):
        started = time.perf_counter()
        plan = plan_progressive(after, cold)
        heuristic.append(time.perf_counter() - started)
        started = time.perf_counter()
        policy.plan_failover(snapshot, failed)
        whole.append(time.perf_counter() - started)
    assert plan is not None
    return ScalePoint(axis, apps, servers, variants, seed,
                      heuristic_ms=1000.0 * statistics.median(heuristic),
                      plan_failover_ms=1000.0 * statistics.median(whole),
                      recovered=len(plan.recoveries), demand_ratio=plan.demand_ratio)


def sweep(quick: bool) -> list[tuple[str, int, int, int]]:
    """(axis, apps, servers, variants) of every point of Fig. 13."""
    apps = (500, 1500, 3000) if quick else (500, 1000, 1500, 2000, 2500, 3000)
    servers = (100, 500, 1000) if quick else (100, 250, 500, 750, 1000)
    variants = (2, 4, 8) if quick else (2, 3, 4, 5, 6, 7, 8)
    points = [("apps", n, DEFAULT_SERVERS, DEFAULT_VARIANTS) for n in apps]
    points += [("servers", DEFAULT_APPS, n, DEFAULT_VARIANTS) for n in servers]
    points += [("variants", DEFAULT_APPS, DEFAULT_SERVERS, n) for n in variants]
    return points


def axis_value(point: ScalePoint) -> int:
    """The swept quantity of ``point``."""
    return {"apps": point.apps, "servers": point.servers, "variants": point.variants}[point.axis]
