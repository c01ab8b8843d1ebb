"""The paper's simulated experiments, each a sweep of one parameter (FailLite §5.2-5.6, §5.8).

=======  =====================  =========================================================
name     paper                  what varies (everything else at the §5.1 defaults)
=======  =====================  =========================================================
fig7     §5.2 Fig. 7 (testbed)  nothing: 6 A2 servers in 3 sites, the 5 testbed families
                                filled to 50 % utilisation, each server failed in turn
fig8     §5.3 Fig. 8            headroom 10-50 %; 100 servers, 10 sites, 640 apps of the
                                5 testbed families, each server failed in turn
fig9     §5.4 Fig. 9            K from 0 to 100 % (Understudy only), fig8's cluster at 20 %
fig10    §5.5 Fig. 10           the family class (small / medium / large), apps of that
                                class only, filled to 40 % utilisation (see below)
fig11    §5.6 Fig. 11           1-7 of the 10 sites fail at once; warm backups are site
                                independent; fig8's cluster at 20 %
fig13    §5.8 Fig. 13           apps, servers or variants per family (``sim.scale``)
=======  =====================  =========================================================

Defaults (§5.1): K = 50 %, α = 0.1, headroom 20 %. Fig. 10's 40 % utilisation was the binding
(compute) utilisation of the 640-app cluster of Fig. 8 before the application mix was
calibrated (``sim.calibrate``; now about 60 %). It is kept: Fig. 10 is no calibration target,
and at 40 % the Small class has about 2200 apps (paper: 3264; Large 228, paper 402).

A *unit* is one (experiment, seed, parameter value): it builds the cluster, then runs every
policy over every failure scenario. Units are independent and deterministic, so they can run
in parallel processes and still give the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from policies.model import ClusterSnapshot, Family
from sim.cluster import (
    A2_CAPACITY,
    CALIBRATED,
    ClusterSpec,
    MixKnobs,
    build_cluster,
    priority_order,
    utilisation,
    with_critical,
    with_headroom,
)
from sim.engine import AppOutcome
from sim.runner import (
    POLICIES,
    UNDERSTUDY,
    UNDERSTUDY_NO_PREEMPT,
    PolicySettings,
    Scenario,
    each_server,
    run_policy,
    site_failures,
)
from sim.scale import ScalePoint, sweep, time_point
from sim.timing import Timing

ParamValue = str | float | int
"""A value of an experiment's swept parameter."""

DEFAULT_HEADROOM = 0.2
DEFAULT_K = 0.5
CLASS_UTILISATION = 0.4
QUICK_SERVER_SAMPLE = 20
"""--quick fails a seeded sample of this many servers instead of every server."""
SITE_COMBOS, QUICK_SITE_COMBOS = 10, 3
"""Random sets of failed sites per count (all of them when there are fewer)."""


@dataclass(frozen=True, slots=True)
class Experiment:
    """One figure: the swept parameter, its values, the policies and the paper's setup."""

    name: str
    title: str
    source: str
    param: str
    values: tuple[ParamValue, ...]
    quick_values: tuple[ParamValue, ...]
    policies: tuple[str, ...]
    setup: str


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("fig7", "Recovery rate and MTTR on the testbed setup", "§5.2, Fig. 7",
               "setup", ("testbed",), ("testbed",), POLICIES,
               "6 A2 servers in 3 sites; the 5 testbed families filled to 50 % utilisation; "
               "K 50 %, headroom 20 %, alpha 0.1; each server fails in turn"),
    Experiment("fig8", "Impact of resource constraints (headroom)", "§5.3, Fig. 8",
               "headroom", (0.1, 0.2, 0.3, 0.4, 0.5), (0.1, 0.2, 0.3, 0.4, 0.5), POLICIES,
               "100 A2 servers in 10 sites; 640 apps of the 5 testbed families; K 50 %, "
               "alpha 0.1; each server fails in turn"),
    Experiment("fig9", "Impact of applications' criticality (K)", "§5.4, Fig. 9",
               "K", tuple(round(0.1 * i, 1) for i in range(11)), (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
               (UNDERSTUDY,),
               "fig8's cluster at headroom 20 %, alpha 0.1; K grows as one nested set (seeded "
               "priority order); each server fails in turn"),
    Experiment("fig10", "Impact of model family class", "§5.5, Fig. 10",
               "class", ("small", "medium", "large"), ("small", "medium", "large"), POLICIES,
               "100 A2 servers in 10 sites; apps from one class only, filled to 40 % "
               "utilisation; K 50 %, headroom 20 %, alpha 0.1; each server fails in turn"),
    Experiment("fig11", "Impact of edge site failures", "§5.6, Fig. 11",
               "failed_sites", (1, 2, 3, 4, 5, 6, 7), (1, 3, 5, 7),
               (*POLICIES, UNDERSTUDY_NO_PREEMPT),
               "fig8's cluster at headroom 20 %, alpha 0.1, site-independent warm backups "
               "(every policy's, as §5.6 adds the constraint to the experiment); random sets "
               "of failed sites (10 per count, all if fewer)"),
    Experiment("fig13", "Scalability of the progressive heuristic", "§5.8, Fig. 13",
               "axis", ("apps", "servers", "variants"), ("apps", "servers", "variants"),
               ("heuristic",),
               "synthetic families; fixed point 1000 apps, 500 servers, 4 variants; live "
               "servers 70 % loaded; Algorithm 1 timed (median of 3 runs, 1 with --quick)"),
)}
ORDER = ("fig7", "fig8", "fig9", "fig10", "fig11", "fig13")


@dataclass(frozen=True, slots=True)
class ScenarioRecord:
    """One failure under one policy, reduced to what the CSVs and summaries need."""

    name: str
    failed_servers: int
    outcomes: tuple[AppOutcome, ...]
    preempted: int
    plan_wall_s: float


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One policy on one unit's cluster."""

    policy: str
    warm_method: str
    warm_backups: int
    warm_uncovered: int
    warm_total_s: float
    scenarios: tuple[ScenarioRecord, ...]


@dataclass(frozen=True, slots=True)
class UnitResult:
    """Everything one (experiment, seed, value) produced."""

    experiment: str
    seed: int
    value: ParamValue
    apps: int
    servers: int
    critical: int
    memory_utilisation: float
    compute_utilisation: float
    policies: tuple[PolicyResult, ...] = ()
    scale: tuple[ScalePoint, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Unit:
    """The work of one (experiment, seed, value)."""

    experiment: str
    seed: int
    value: ParamValue
    quick: bool


def units(names: Sequence[str], seeds: int, quick: bool) -> list[Unit]:
    """Every unit of ``names`` (in paper order), seeds 0..seeds-1."""
    out: list[Unit] = []
    for name in names:
        experiment = EXPERIMENTS[name]
        values = experiment.quick_values if quick else experiment.values
        out.extend(Unit(name, seed, value, quick) for seed in range(seeds) for value in values)
    return out


# --- clusters and scenarios ------------------------------------------------------------------


def _cluster(unit: Unit, families: Mapping[str, Family],
             knobs: MixKnobs = CALIBRATED) -> tuple[ClusterSnapshot, PolicySettings,
                                                    tuple[Scenario, ...]]:
    """The cluster (headroom applied), the policy settings and the scenarios of ``unit``.

    ``knobs`` are the application mix's free choices (default: the calibrated ones).
    """
    name, seed, value = unit.experiment, unit.seed, unit.value
    settings = PolicySettings()
    if name == "fig7":
        spec = ClusterSpec(servers=6, sites=3, apps=None, target_utilisation=0.5,
                           mix="testbed", critical_fraction=DEFAULT_K, seed=seed)
        snapshot = with_headroom(build_cluster(families, spec.with_knobs(knobs)),
                                 DEFAULT_HEADROOM)
        return snapshot, settings, each_server(snapshot)
    if name == "fig10":
        spec = ClusterSpec(apps=None, target_utilisation=CLASS_UTILISATION, mix=str(value),
                           critical_fraction=DEFAULT_K, seed=seed)
    else:
        spec = ClusterSpec(critical_fraction=DEFAULT_K, mix=knobs.large_scale_mix, seed=seed)
    base = build_cluster(families, spec.with_knobs(knobs))
    headroom = float(value) if name == "fig8" else DEFAULT_HEADROOM
    snapshot = with_headroom(base, headroom)
    if name == "fig9":
        snapshot = with_critical(snapshot, priority_order(snapshot, seed), float(value))
    if name == "fig11":
        count = QUICK_SITE_COMBOS if unit.quick else SITE_COMBOS
        settings = PolicySettings(site_independent=True)
        return snapshot, settings, site_failures(snapshot, int(value), count, seed)
    limit = QUICK_SERVER_SAMPLE if unit.quick else None
    return snapshot, settings, each_server(snapshot, limit, seed)


def run_unit(unit: Unit, families: Mapping[str, Family], timing: Timing,
             tick: Callable[[], None] | None = None, knobs: MixKnobs = CALIBRATED,
             policies: Sequence[str] | None = None) -> UnitResult:
    """Build the unit's cluster and run every policy of its experiment on every scenario.

    ``policies`` runs a subset of the experiment's (calibration runs the baselines only).
    """
    experiment = EXPERIMENTS[unit.experiment]
    if unit.experiment == "fig13":
        points = tuple(time_point(axis, apps, servers, variants, unit.seed,
                                  repeats=1 if unit.quick else 3)
                       for axis, apps, servers, variants in sweep(unit.quick)
                       if axis == unit.value)
        if tick is not None:
            tick()
        return UnitResult(unit.experiment, unit.seed, unit.value, 0, 0, 0, 0.0, 0.0,
                          scale=points)
    snapshot, settings, scenarios = _cluster(unit, families, knobs)
    used = utilisation(snapshot_without_headroom(snapshot))
    results = []
    for policy in experiment.policies if policies is None else policies:
        run = run_policy(policy, snapshot, scenarios, settings, timing, unit.seed)
        records = tuple(
            ScenarioRecord(r.scenario.name, len(r.scenario.failed), r.outcomes,
                           len(r.plan.preempted), r.plan_wall_s) for r in run.results)
        results.append(PolicyResult(policy, run.warm_method, len(run.warm.assignments),
                                    len(run.warm.uncovered), run.warm.stats.total_s, records))
        if tick is not None:
            tick()
    return UnitResult(unit.experiment, unit.seed, unit.value, len(snapshot.apps),
                      len(snapshot.servers), sum(a.critical for a in snapshot.apps),
                      used["memory_mb"], used["compute"], tuple(results))


def snapshot_without_headroom(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The same placements on physical A2 servers (to report the primaries' utilisation)."""
    return replace(snapshot, servers=tuple(replace(s, capacity=A2_CAPACITY)
                                           for s in snapshot.servers))


def ticks(unit: Unit) -> int:
    """How many times ``run_unit`` calls ``tick`` (one per policy)."""
    return 1 if unit.experiment == "fig13" else len(EXPERIMENTS[unit.experiment].policies)
