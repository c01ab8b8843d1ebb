"""Run one policy over many failure scenarios of one cluster: the decisions, then the timeline.

The decisions are exactly what the controller gets from the same policy on the same snapshot
(``sim.decisions``); the simulator only adds the clock (``sim.engine``).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.actions import FailoverPlan, WarmPlan
from policies.baselines import FullSizeCold, FullSizeWarm, FullSizeWarmK
from policies.config import ProgressiveConfig, WarmPlanConfig
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot
from policies.policy import FailoverPolicy
from sim.decisions import decide_failover, decide_warm
from sim.engine import AppOutcome, simulate_failover
from sim.timing import Timing

UNDERSTUDY = "understudy"
UNDERSTUDY_NO_PREEMPT = "understudy-no-preempt"
FULL_SIZE_WARM = "full-size-warm"
FULL_SIZE_COLD = "full-size-cold"
FULL_SIZE_WARM_K = "full-size-warm-k"
POLICIES = (UNDERSTUDY, FULL_SIZE_WARM, FULL_SIZE_COLD, FULL_SIZE_WARM_K)
"""The four policies of FailLite §5.1 (Split-Model, §5.7, is out of scope)."""

ILP_BUDGET_S = 10.0
"""Time budget of the warm step's ILP; larger instances use the heuristic."""

ILP_SIZE_PER_S = 40_000
"""(apps in K) x (live servers) the decomposed ILP handles per second on a 2-core machine
(measured: 1964 x 100 in 3.4 s, 320 x 100 in 0.5 s); ``ILP_BUDGET_S`` x this is the size
limit of ``WarmPlanConfig(method="auto")``."""


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """How an experiment configures every policy (FailLite §5.1 defaults)."""

    alpha: float = 0.1
    site_independent: bool = False
    ilp_budget_s: float = ILP_BUDGET_S
    time_limit_s: float = 60.0

    def warm_config(self) -> WarmPlanConfig:
        size = int(self.ilp_budget_s * ILP_SIZE_PER_S)
        return WarmPlanConfig(alpha=self.alpha, site_independent=self.site_independent,
                              method="auto", auto_ilp_max_size=size,
                              time_limit_s=self.time_limit_s)


def make_policy(name: str, settings: PolicySettings, seed: int) -> FailoverPolicy:
    """The policy called ``name``, configured as ``settings`` say.

    ``understudy`` preempts healthy apps' warm backups when a failure leaves apps
    unrecoverable (``policies.preemption``); ``understudy-no-preempt`` is the paper's policy
    without that. ``seed`` fixes the random cold-load order of the full-size baselines.
    """
    warm = settings.warm_config()
    if name == UNDERSTUDY:
        return UnderstudyPolicy(warm=warm, progressive=ProgressiveConfig(preempt_warm=True))
    if name == UNDERSTUDY_NO_PREEMPT:
        return UnderstudyPolicy(warm=warm)
    if name == FULL_SIZE_WARM:
        return FullSizeWarm(warm=warm)
    if name == FULL_SIZE_COLD:
        return FullSizeCold(seed=seed)
    if name == FULL_SIZE_WARM_K:
        return FullSizeWarmK(warm=warm, seed=seed)
    raise ValueError(f"unknown policy {name!r}")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One failure: the servers that fail at the same instant."""

    name: str
    failed: tuple[str, ...]


def each_server(snapshot: ClusterSnapshot, limit: int | None = None,
                seed: int = 0) -> tuple[Scenario, ...]:
    """One scenario per server holding a primary (§5.2: a failure "on one of our ... servers").

    With ``limit``, a seeded sample of that many servers, in server order.
    """
    busy = sorted({p.server_id for p in snapshot.primary_by_app.values()})
    if limit is not None and limit < len(busy):
        busy = sorted(random.Random(seed).sample(busy, limit))
    return tuple(Scenario(server, (server,)) for server in busy)


def site_failures(snapshot: ClusterSnapshot, failed_sites: int, count: int,
                  seed: int) -> tuple[Scenario, ...]:
    """``count`` distinct seeded sets of ``failed_sites`` whole sites (§5.6), all if fewer."""
    sites = sorted(s.site_id for s in snapshot.sites)
    if math.comb(len(sites), failed_sites) <= count:
        combos = list(itertools.combinations(sites, failed_sites))
    else:
        rng = random.Random(seed * 1009 + failed_sites)
        chosen: set[tuple[str, ...]] = set()
        while len(chosen) < count:
            chosen.add(tuple(sorted(rng.sample(sites, failed_sites))))
        combos = sorted(chosen)
    out = []
    for combo in combos:
        failed = tuple(s.server_id for s in snapshot.servers if s.site_id in combo)
        out.append(Scenario("+".join(combo), failed))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One failure under one policy: the plan it made and what the timeline gave."""

    scenario: Scenario
    plan: FailoverPlan
    outcomes: tuple[AppOutcome, ...]
    plan_wall_s: float


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """A policy on one cluster: its warm plan, the state it failed from, every scenario."""

    policy: str
    warm: WarmPlan
    state: ClusterSnapshot
    results: tuple[ScenarioResult, ...]

    @property
    def warm_method(self) -> str:
        """Which warm step ran: the ILP ("decomposed"/"full"), "heuristic", "greedy", "none"."""
        return self.warm.stats.method


def scenario_rng(seed: int, index: int) -> random.Random:
    """The detection-delay stream of scenario ``index``: the same for every policy."""
    return random.Random(seed * 1_000_003 + index)


def run_policy(name: str, snapshot: ClusterSnapshot, scenarios: Sequence[Scenario],
               settings: PolicySettings, timing: Timing, seed: int,
               tick: Callable[[], None] | None = None) -> PolicyRun:
    """Plan warm backups on ``snapshot``, then fail and recover each scenario in turn.

    Scenarios are independent: each starts from the same state (primaries + warm backups).
    ``tick`` is called after each scenario (progress bars).
    """
    policy = make_policy(name, settings, seed)
    warm, state = decide_warm(policy, snapshot)
    results = []
    for index, scenario in enumerate(scenarios):
        started = time.perf_counter()
        plan = decide_failover(policy, state, scenario.failed)
        wall = time.perf_counter() - started
        outcomes = simulate_failover(state, plan, timing, scenario_rng(seed, index))
        results.append(ScenarioResult(scenario, plan, outcomes, wall))
        if tick is not None:
            tick()
    return PolicyRun(name, warm, state, tuple(results))
