"""Edge clusters as FailLite's large-scale simulation builds them (§5.1, §5.3, §5.5, §5.6).

* **Servers** are the paper's testbed node: one NVIDIA A2 with 16 GB of GPU memory (§5.1:
  "an NVIDIA A2 GPU with 1280 CUDA cores and 16 GB of GPU memory"), i.e.
  ``memory_mb = 16384`` and ``compute = 100`` (the profiles' compute unit is percent of one
  A2). ``servers`` of them are spread evenly over ``sites`` sites (§5.6: "100 servers ...
  ten sites of size 10").
* **Applications** draw a family uniformly from a *mix* (every family, the five families of
  the real testbed, or one of §5.5's classes), a maximum request rate log-uniform in
  2-20 req/s (capped so the primary needs at most 20 % of one GPU; these choices are
  calibrated, see ``MixKnobs`` and ``sim.calibrate``) and a latency SLO of 3x the
  primary's reference latency (at least 20 ms). Either a fixed number of apps (§5.3: 640)
  or as many as fill the cluster to a target utilisation of its binding resource (§5.5:
  "the total number of applications changes across scenarios").
* **Criticality (K)**: every app gets a seeded random priority rank; the top ``K`` share are
  critical. Sweeping K (§5.4, "Top-K") therefore grows one nested set.
* **Primaries** are placed by memory worst-fit (§5.1) on the whole physical capacity.
* **Headroom** (§5.1: "the headroom (usable space to load backups)"; §5.3 fixes the apps and
  varies it from 50 % to 10 %) is applied afterwards by ``with_headroom``: each server keeps
  what its primaries use plus ``headroom`` x its physical capacity (never more than the
  physical capacity). Backups, warm or cold, can only use that share.

Every random choice comes from one ``random.Random(seed)``: same arguments, same cluster.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from policies.model import Application, ClusterSnapshot, Family, Server, Site
from policies.primary import place_primaries
from policies.resources import COMPUTE, MEMORY_MB, Resources
from sim.generator import SLO_FACTOR, SLO_FLOOR_MS

A2_MEMORY_MB = 16384.0
"""GPU memory of one testbed server (NVIDIA A2, 16 GB; FailLite §5.1)."""

A2_COMPUTE = 100.0
"""Compute of one testbed server: 100 % of one reference GPU (the A2 itself)."""

A2_CAPACITY = Resources({MEMORY_MB: A2_MEMORY_MB, COMPUTE: A2_COMPUTE})
"""Physical capacity of every simulated server."""

# The application mix's free choices, calibrated on the paper's Fig. 7 and Fig. 8 baseline
# recovery rates under the targets (``python -m sim.calibrate --seeds 3``: 72-setting
# coarse grid, then a fine grid around its winner; among the settings that meet every target
# of the issue on seeds 0-2 and again on seeds 3-5, the lowest RMS distance to the 9 paper
# numbers: 29.2 points; the best fit with no constraint, ``FIG78_FIT``, scores 13.7 and misses
# the five-site target). README "Calibration" and sim/calibration.md have the tables.
DEFAULT_MAX_PRIMARY_COMPUTE_PCT = 20.0
"""An app's request rate is capped so its primary needs at most this share of one A2."""

DEFAULT_RATE_RPS = (2.0, 20.0)
"""An app's maximum request rate is drawn from this range (before the cap)..."""

DEFAULT_RATE_DISTRIBUTION = "log-uniform"
"""...uniformly in log rate (more small apps, a longer tail)."""

RATE_DISTRIBUTIONS = ("uniform", "log-uniform")

LARGE_SCALE_MIX = "testbed"
"""The mix of the 640-app cluster of Fig. 8, 9 and 11 (§5.3: "the same mixture of DNN models
as the real experiments", i.e. the testbed's five families)."""

PAPER_TESTBED_FAMILIES = ("convnext", "efficientnet", "mobilenet_v3", "regnet_y",
                          "shufflenet_v2")
"""FailLite §5.1: "Mobilenet, Shufflenet, Convnext, Efficientnet, and Regnet"."""

SMALL_MAX_DIFF_MB = 50.0
"""§5.5 classes by max demand difference (largest minus smallest variant memory): below this
a family is *Small* (paper: Mobilenet, 12 MB; ours: mobilenet_v3 11.3 MB)..."""

LARGE_MIN_DIFF_MB = 500.0
"""...at or above this it is *Large* (paper: ConvNext, 648 MB; ours: 660.4 MB); between the
two, *Medium*. Single-variant families (difference 0) have no trade-off to exploit and are in
no class."""

FamilyClass = Literal["small", "medium", "large"]
MIXES = ("all", "testbed", "small", "medium", "large")
"""Application mixes: every family, the paper's five testbed families, or one §5.5 class."""


def demand_difference_mb(family: Family) -> float:
    """§5.5's classifier: memory of the largest minus the smallest variant."""
    return family.largest.memory_mb - family.smallest.memory_mb


def family_class(family: Family) -> FamilyClass | None:
    """Small, medium or large by ``demand_difference_mb`` (None: a single variant)."""
    if len(family.variants) < 2:
        return None
    diff = demand_difference_mb(family)
    if diff < SMALL_MAX_DIFF_MB:
        return "small"
    return "large" if diff >= LARGE_MIN_DIFF_MB else "medium"


def mix_families(families: Mapping[str, Family], mix: str) -> tuple[str, ...]:
    """Family names of an application mix (sorted)."""
    if mix == "all":
        names = sorted(families)
    elif mix == "testbed":
        names = [n for n in PAPER_TESTBED_FAMILIES if n in families]
    elif mix in ("small", "medium", "large"):
        names = sorted(n for n, f in families.items() if family_class(f) == mix)
    else:
        raise ValueError(f"unknown mix {mix!r}; choose one of {', '.join(MIXES)}")
    if not names:
        raise ValueError(f"mix {mix!r} selects no family")
    return tuple(names)


@dataclass(frozen=True, slots=True)
class MixKnobs:
    """The generator's free choices that the paper does not state (``sim.calibrate`` fits them).

    ``large_scale_mix`` is the mix of the 100-server experiments (Fig. 8, 9, 11); Fig. 7
    always uses the testbed's five families, Fig. 10 one class.
    """

    max_primary_compute_pct: float = DEFAULT_MAX_PRIMARY_COMPUTE_PCT
    rate_rps: tuple[float, float] = DEFAULT_RATE_RPS
    rate_distribution: str = DEFAULT_RATE_DISTRIBUTION
    large_scale_mix: str = LARGE_SCALE_MIX

    def label(self) -> str:
        """A short name for tables: cap, rate range and distribution, mix."""
        low, high = self.rate_rps
        dist = "log" if self.rate_distribution == "log-uniform" else "unif"
        return (f"cap {self.max_primary_compute_pct:g} %, {dist} {low:g}-{high:g} rps, "
                f"mix {self.large_scale_mix}")


CALIBRATED = MixKnobs()
"""The defaults every experiment uses."""

FIG78_FIT = MixKnobs(40.0, (1.0, 5.0), "log-uniform", "testbed")
"""The best fit to the paper's Fig. 7/8 baseline numbers alone (``python -m sim.calibrate
--unconstrained``; RMS 13.7 points): the default until the issue's targets became constraints
of the calibration. It misses the five-site target (about +22 points, not +39)."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to generate. Exactly one of ``apps`` and ``target_utilisation`` is set."""

    servers: int = 100
    sites: int = 10
    apps: int | None = 640
    target_utilisation: float | None = None
    mix: str = "all"
    critical_fraction: float = 0.5
    rate_rps: tuple[float, float] = DEFAULT_RATE_RPS
    rate_distribution: str = DEFAULT_RATE_DISTRIBUTION
    max_primary_compute_pct: float = DEFAULT_MAX_PRIMARY_COMPUTE_PCT
    seed: int = 0

    def __post_init__(self) -> None:
        if self.servers < 1 or not 1 <= self.sites <= self.servers:
            raise ValueError(f"need 1 <= sites <= servers, got {self.sites}, {self.servers}")
        if (self.apps is None) == (self.target_utilisation is None):
            raise ValueError("set exactly one of apps and target_utilisation")
        if self.target_utilisation is not None and not 0.0 < self.target_utilisation < 1.0:
            raise ValueError("target_utilisation must be in (0, 1)")
        if not 0.0 <= self.critical_fraction <= 1.0:
            raise ValueError("critical_fraction must be in [0, 1]")
        if not 0.0 < self.rate_rps[0] <= self.rate_rps[1]:
            raise ValueError(f"need 0 < low <= high request rate, got {self.rate_rps}")
        if self.rate_distribution not in RATE_DISTRIBUTIONS:
            raise ValueError(f"rate_distribution must be one of {RATE_DISTRIBUTIONS}")
        if not 0.0 < self.max_primary_compute_pct <= A2_COMPUTE:
            raise ValueError("max_primary_compute_pct must be in (0, 100]")

    def with_knobs(self, knobs: MixKnobs) -> ClusterSpec:
        """The same spec with ``knobs``' request rates and cap (the mix stays as set)."""
        return replace(self, rate_rps=knobs.rate_rps, rate_distribution=knobs.rate_distribution,
                       max_primary_compute_pct=knobs.max_primary_compute_pct)


def build_cluster(families: Mapping[str, Family], spec: ClusterSpec) -> ClusterSnapshot:
    """Physical A2 servers, the generated apps, primaries placed by memory worst-fit.

    Raises ``ValueError`` when a fixed number of apps does not fit the cluster.
    """
    rng = random.Random(spec.seed)
    names = mix_families(families, spec.mix)
    sites = tuple(Site(f"site-{i:02d}") for i in range(spec.sites))
    per_site = math.ceil(spec.servers / spec.sites)
    servers = tuple(Server(f"srv-{k:03d}", sites[min(k // per_site, spec.sites - 1)].site_id,
                           A2_CAPACITY) for k in range(spec.servers))
    if spec.apps is not None:
        apps = [_new_app(families[rng.choice(names)], index, spec, rng)
                for index in range(spec.apps)]
    else:
        assert spec.target_utilisation is not None
        apps = _fill(families, names, spec, rng)
    apps = _mark_critical(apps, spec.critical_fraction, rng)
    snapshot = ClusterSnapshot(families, sites, servers, tuple(apps))
    result = place_primaries(snapshot)
    if result.unplaced:
        raise ValueError(f"{len(result.unplaced)} of {len(apps)} primaries do not fit on "
                         f"{spec.servers} servers; lower the number of apps")
    return snapshot.with_placements(result.placements)


def _new_app(family: Family, index: int, spec: ClusterSpec,
             rng: random.Random) -> Application:
    primary = family.most_accurate
    low, high = spec.rate_rps
    if spec.rate_distribution == "log-uniform":
        rate = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        rate = rng.uniform(low, high)
    if primary.compute_per_rps > 0:  # rounded down, so the rounded rate stays under the cap
        cap = math.floor(1000.0 * spec.max_primary_compute_pct / primary.compute_per_rps)
        rate = min(rate, cap / 1000.0)
    slo = max(SLO_FACTOR * primary.latency_ms["reference"], SLO_FLOOR_MS)
    return Application(app_id=f"app-{index:04d}", family=family.name,
                       max_rate_rps=round(rate, 3), latency_slo_ms=round(slo, 3))


def _fill(families: Mapping[str, Family], names: Sequence[str], spec: ClusterSpec,
          rng: random.Random) -> list[Application]:
    """Draw apps until the next one would lift a resource above the target utilisation."""
    assert spec.target_utilisation is not None
    limit = A2_CAPACITY.scaled(spec.servers * spec.target_utilisation)
    used = Resources()
    apps: list[Application] = []
    while True:
        app = _new_app(families[rng.choice(names)], len(apps), spec, rng)
        demand = families[app.family].most_accurate.demand(app.max_rate_rps)
        if not (used + demand).fits_within(limit):
            return apps
        used = used + demand
        apps.append(app)


def _mark_critical(apps: list[Application], fraction: float,
                   rng: random.Random) -> list[Application]:
    """The top ``fraction`` of a seeded random priority order is critical (K)."""
    order = list(range(len(apps)))
    rng.shuffle(order)
    critical = set(order[:round(fraction * len(apps))])
    return [replace(app, critical=index in critical) for index, app in enumerate(apps)]


def priority_order(snapshot: ClusterSnapshot, seed: int) -> tuple[str, ...]:
    """A seeded random priority order of the apps (for K sweeps over one cluster)."""
    order = sorted(a.app_id for a in snapshot.apps)
    random.Random(seed).shuffle(order)
    return tuple(order)


def with_critical(snapshot: ClusterSnapshot, order: Sequence[str],
                  fraction: float) -> ClusterSnapshot:
    """The same cluster with the first ``fraction`` of ``order`` critical, the others not."""
    critical = set(order[:round(fraction * len(order))])
    apps = tuple(replace(a, critical=a.app_id in critical) for a in snapshot.apps)
    return replace(snapshot, apps=apps)


def with_headroom(snapshot: ClusterSnapshot, headroom: float) -> ClusterSnapshot:
    """Each server keeps its primaries' use plus ``headroom`` x its physical capacity.

    ``snapshot`` must hold physical servers and primary placements only; the result is the
    cluster the policies plan backups on (§5.1's usable capacity for backups).
    """
    if not 0.0 < headroom <= 1.0:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    servers = []
    for server in snapshot.servers:
        used = snapshot.used[server.server_id]
        capacity = Resources({r: min(server.capacity[r], used[r] + headroom * server.capacity[r])
                              for r in server.capacity})
        servers.append(replace(server, capacity=capacity))
    return replace(snapshot, servers=tuple(servers))


def utilisation(snapshot: ClusterSnapshot) -> dict[str, float]:
    """Share of the cluster's capacity its placements use, per resource."""
    out = {}
    for r in (MEMORY_MB, COMPUTE):
        capacity = sum(s.capacity[r] for s in snapshot.servers)
        used = sum(snapshot.used[s.server_id][r] for s in snapshot.servers)
        out[r] = used / capacity if capacity else 0.0
    return out
