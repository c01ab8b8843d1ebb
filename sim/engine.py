"""SimPy model of one failure: detection, then the plan's stages, executed by simulated agents.

The simulator runs exactly what the controller runs: ``FailoverPlan.stages()``
(``policies.actions``), interpreted by :func:`execute` as a generic list of
:class:`~policies.actions.Stage` values. Nothing here reads the plan's recovery fields to decide
what happens when; the plan is read only to draw the detection delays (``failed_servers``) and
to report the apps it could not recover (``unrecoverable``).

Timeline (all delays from ``sim.timing.Timing``):

1. At t = 0 the failed servers stop. Each one's deadline passes after its own detection delay;
   the failure *event* is declared (t0) when the last of them is detected (servers of one site
   fail together, and the controller plans the event once: ``policy.plan_failover``). The
   planning itself is not timed here (a decision is a pure function; the runner measures its
   wall time separately so the simulated outcome stays deterministic).
2. From t0 the stages run under ``Stage``'s one rule, shared with the controller: a stage
   starts once every stage named in its ``after`` has finished (an empty stage finishes at
   once); inside a stage each app's actions run one after the other, in list order, and
   different apps' actions run at the same time.
3. Each action takes, on the simulated agent of its server:

   * ``LoadVariant``: the controller sends every load command with the decision, so the agent
     has them ``command_ms`` after t0. A load starts once it has its command and its
     prerequisites are done (its stage started, the app's earlier actions in the stage
     finished), then takes one of the server's ``load_threads`` (FIFO, in request order) for
     ``Timing.load_ms(variant)``. A load for ``Role.UPGRADE`` first takes the server's upgrade
     slot (one upgrade at a time per server, the transient-safety rule of
     ``policies.progressive``) and holds it until the app's next promotion has completed.
   * ``UnloadVariant``: done ``command_ms`` after its prerequisites (the command is sent then).
   * ``PromoteReplica``: the clients are notified (``notification_ms``). When no earlier action
     of the app in the decision is a load (a warm switch), the promote command goes first:
     ``command_ms + notification_ms``.

   ``Stage.urgent`` changes nothing here: an agent runs urgent loads before routine ones, and
   in a failover plan the two never wait for the same thread (the upgrades start after every
   interim serves).
4. An app is *served* when its first promotion completes and *settled* when its last does.

For a failover plan this gives: warm switches in ``command_ms + notification_ms``; the
preempted backups unloaded one command after t0; each interim loaded as soon as its command
arrives and those unloads are done, then promoted; the deferred preemptions unloaded once every
interim serves; then each upgrade loaded (upgrade slot, then a thread), promoted, and its
interim unloaded. A full-size cold recovery (the baselines) is a single load and promotion.

How an app came back is read from its actions: no load (warm switch), one load (cold), more
(progressive: the first promotion is the interim, the last the target it ends on).

Metrics per app, as FailLite §5.1 defines them: the app is *recovered* when a replica serves
and the clients know; **MTTR** is "the duration between the failure detection and notifying
the client of the new application location, which includes model loading time for cold
backups" (``mttr_ms``; we also give ``e2e_ms``, from the failure itself); the **accuracy
reduction** is that "of backup compared to primary" for the variant the app ends on. Apps not
recovered have no MTTR and no accuracy reduction (§5.1: "we only consider applications that
were recovered").
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import simpy
from simpy.resources.resource import Request

from policies.actions import (
    Action,
    FailoverPlan,
    LoadVariant,
    PromoteReplica,
    Stage,
    UnloadVariant,
    flatten,
)
from policies.model import ClusterSnapshot, Role, accuracy_reduction
from sim.timing import Timing

WARM, PROGRESSIVE, COLD, LOST = "warm", "progressive", "cold", "lost"
"""How an affected app came back: warm switch, interim then upgrade, one load, or not at all."""

Proc = Generator[simpy.Event, Any, None]
LoadTime = Callable[[LoadVariant], float]
"""Milliseconds a load takes on its agent."""


@dataclass(frozen=True, slots=True)
class AppOutcome:
    """What happened to one affected app (times in ms; None when not recovered)."""

    app_id: str
    critical: bool
    how: str
    server_id: str | None
    variant: str | None
    interim: str | None
    detection_ms: float
    mttr_ms: float | None
    e2e_ms: float | None
    settled_ms: float | None
    accuracy_reduction: float | None
    interim_accuracy_reduction: float | None

    @property
    def recovered(self) -> bool:
        return self.how != LOST


@dataclass(frozen=True, slots=True)
class Execution:
    """When the actions of one run of stages completed, in ms since the failure."""

    declared_ms: float
    action_ms: tuple[float, ...]
    """When each action completed, in the order of ``policies.actions.flatten(stages)``."""
    stage_ms: Mapping[str, float]
    """When each stage finished."""
    served_ms: Mapping[str, float]
    """Per promoted app: when its first promotion completed."""
    settled_ms: Mapping[str, float]
    """Per promoted app: when its last promotion completed."""


@dataclass(frozen=True, slots=True)
class _Agent:
    """One live server's agent: its load threads and its one-at-a-time upgrade slot."""

    loads: simpy.Resource
    upgrades: simpy.Resource


Chain = list[tuple[int, Action]]
"""One app's actions in one stage, with their indexes in the flattened list."""


class _Interpreter:
    """Mutable state of one run of stages."""

    def __init__(self, stages: tuple[Stage, ...], timing: Timing, load_ms: LoadTime,
                 declared_ms: float) -> None:
        _check(stages)
        self.env = simpy.Environment()
        self.stages, self.timing, self.load_ms = stages, timing, load_ms
        self.declared_ms = declared_ms
        self.commands = self.env.event()
        """The agents have the decision's load commands (a timeout set at t0)."""
        actions = flatten(stages)
        loaded: set[str] = set()
        self.warm: list[bool] = []
        """Per action: a promotion with no load of its app before it (a warm switch)."""
        for action in actions:
            self.warm.append(isinstance(action, PromoteReplica) and action.app_id not in loaded)
            if isinstance(action, LoadVariant):
                loaded.add(action.app_id)
        self.action_ms: list[float] = [float("nan")] * len(actions)
        self.stage_ms: dict[str, float] = {}
        self.served: dict[str, float] = {}
        self.settled: dict[str, float] = {}
        self.agents: dict[str, _Agent] = {}

    def agent(self, server_id: str) -> _Agent:
        agent = self.agents.get(server_id)
        if agent is None:
            agent = self.agents[server_id] = _Agent(
                simpy.Resource(self.env, self.timing.load_threads), simpy.Resource(self.env, 1))
        return agent

    def result(self) -> Execution:
        return Execution(self.declared_ms, tuple(self.action_ms), dict(self.stage_ms),
                         dict(self.served), dict(self.settled))

    # --- processes --------------------------------------------------------------------------

    def controller(self) -> Proc:
        """Declare the failure, send the decision, start every stage in list order."""
        env = self.env
        yield env.timeout(self.declared_ms)
        self.commands = env.timeout(self.timing.command_ms)
        finished: dict[str, simpy.Process] = {}
        start = 0
        for stage in self.stages:
            chains: dict[str, Chain] = {}
            for offset, action in enumerate(stage.actions):
                chains.setdefault(action.app_id, []).append((start + offset, action))
            start += len(stage.actions)
            after = [finished[name] for name in stage.after]
            finished[stage.name] = env.process(self.stage(stage.name, list(chains.values()),
                                                          after))

    def stage(self, name: str, chains: Sequence[Chain], after: Sequence[simpy.Event]) -> Proc:
        """Wait for the ``after`` stages, then run each app's chain at the same time."""
        if after:
            yield self.env.all_of(after)
        running = [self.env.process(self.chain(chain)) for chain in chains]
        if running:
            yield self.env.all_of(running)
        self.stage_ms[name] = self.env.now

    def chain(self, chain: Chain) -> Proc:
        """One app's actions of one stage, one after the other."""
        env, timing = self.env, self.timing
        slot: Request | None = None
        for index, action in chain:
            if isinstance(action, LoadVariant):
                agent = self.agent(action.server_id)
                yield self.commands
                if action.role is Role.UPGRADE:
                    _release(slot)
                    slot = agent.upgrades.request()
                    yield slot
                with agent.loads.request() as thread:
                    yield thread
                    yield env.timeout(self.load_ms(action))
            elif isinstance(action, UnloadVariant):
                yield env.timeout(timing.command_ms)
            else:
                yield env.timeout(timing.command_ms + timing.notification_ms
                                  if self.warm[index] else timing.notification_ms)
                self.served.setdefault(action.app_id, env.now)
                self.settled[action.app_id] = env.now
                _release(slot)
                slot = None
            self.action_ms[index] = env.now
        _release(slot)


def _release(slot: Request | None) -> None:
    if slot is not None:
        slot.resource.release(slot)


def _check(stages: Sequence[Stage]) -> None:
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise ValueError(f"two stages are called {stage.name!r}")
        missing = [name for name in stage.after if name not in seen]
        if missing:
            raise ValueError(f"stage {stage.name!r} runs after {missing}, not earlier stages")
        seen.add(stage.name)


def execute(stages: tuple[Stage, ...], timing: Timing, load_ms: LoadTime,
            declared_ms: float = 0.0) -> Execution:
    """Run ``stages`` on simulated agents from ``declared_ms`` on (the module's rules)."""
    run = _Interpreter(stages, timing, load_ms, declared_ms)
    run.env.process(run.controller())
    run.env.run()
    return run.result()


def simulate_failover(state: ClusterSnapshot, plan: FailoverPlan, timing: Timing,
                      rng: random.Random) -> tuple[AppOutcome, ...]:
    """Run ``plan`` for the failure of ``plan.failed_servers`` on ``state``; one outcome per app.

    ``state`` is the snapshot the plan was made from (primaries and warm backups loaded).
    ``rng`` draws the detection delays only. Outcomes are sorted by app id.
    """
    detections = [timing.detection_ms(rng) for _ in sorted(plan.failed_servers)]
    declared = max(detections, default=0.0)

    def load_ms(load: LoadVariant) -> float:
        app = state.app_by_id[load.app_id]
        return timing.load_ms(state.family_of(app).variant(load.variant))

    stages = plan.stages()
    run = execute(stages, timing, load_ms, declared)
    out = _recovered(state, flatten(stages), run)
    for u in plan.unrecoverable:
        app = state.app_by_id[u.app_id]
        out.append(AppOutcome(u.app_id, app.critical, LOST, None, None, None,
                              declared, None, None, None, None, None))
    return tuple(sorted(out, key=lambda o: o.app_id))


def _recovered(state: ClusterSnapshot, actions: Sequence[Action],
               run: Execution) -> list[AppOutcome]:
    """One outcome per promoted app, its kind and variants read from its actions."""
    loads = Counter(a.app_id for a in actions if isinstance(a, LoadVariant))
    promotions: dict[str, list[PromoteReplica]] = {}
    for action in actions:
        if isinstance(action, PromoteReplica):
            promotions.setdefault(action.app_id, []).append(action)
    out = []
    for app_id, promoted in promotions.items():
        app = state.app_by_id[app_id]
        family, primary = state.family_of(app), state.primary_variant(app)
        interim, final = promoted[0], promoted[-1]
        how = WARM if not loads[app_id] else COLD if loads[app_id] == 1 else PROGRESSIVE
        served = run.served_ms[app_id]
        out.append(AppOutcome(
            app_id, app.critical, how, final.server_id, final.variant, interim.variant,
            run.declared_ms, mttr_ms=served - run.declared_ms, e2e_ms=served,
            settled_ms=run.settled_ms[app_id] - run.declared_ms,
            accuracy_reduction=accuracy_reduction(primary, family.variant(final.variant)),
            interim_accuracy_reduction=accuracy_reduction(primary,
                                                          family.variant(interim.variant))))
    return out


def outcome_counts(outcomes: tuple[AppOutcome, ...]) -> Mapping[str, int]:
    """How many apps came back each way (warm, progressive, cold, lost)."""
    counts = {WARM: 0, PROGRESSIVE: 0, COLD: 0, LOST: 0}
    for o in outcomes:
        counts[o.how] += 1
    return counts
