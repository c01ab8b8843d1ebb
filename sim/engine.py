"""SimPy model of one failure: detection, then the ``FailoverPlan`` a policy returned, executed.

Timeline (all delays from ``sim.timing.Timing``):

1. At t = 0 the failed servers stop. Each one's deadline passes after its own detection delay;
   the failure *event* is declared when the last of them is detected (servers of one site
   fail together, and the controller plans the event once: ``policy.plan_failover``). The
   planning itself is not timed here (a decision is a pure function; the runner measures
   its wall time separately so the simulated outcome stays deterministic).
2. Each preempted warm backup (``FailoverPlan.preempted``) is unloaded by its agent after
   one command delay; recoveries on that server wait for the unloads. A deferred preemption
   (``FailoverPlan.deferred_preemptions``: the interims fit beside it) is unloaded once that
   server's interims serve, and only the upgrades there wait for it.
3. **Warm switch**: promote command to the agent, then the clients are notified.
4. **Progressive recovery**: load command; the agent loads the interim variant on one of its
   load threads (FIFO; plan order); the clients are notified: the app is recovered. If the
   target differs, the upgrade waits for the server's upgrade slot (one upgrade at a time per
   server, the transient-safety rule of ``policies.progressive``) and a load thread, loads the
   target and notifies the switch; the interim is then unloaded. A full-size cold recovery
   (the baselines) is the case interim == target: a single load.

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
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from policies.actions import FailoverPlan, ProgressiveRecovery, WarmSwitch
from policies.model import ClusterSnapshot, accuracy_reduction
from sim.timing import Timing

WARM, PROGRESSIVE, COLD, LOST = "warm", "progressive", "cold", "lost"
"""How an affected app came back: warm switch, interim then upgrade, one load, or not at all."""

Proc = Generator[simpy.Event, Any, None]


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


@dataclass(slots=True)
class _Agent:
    """One live server's agent: its load threads and its one-at-a-time upgrade slot."""

    loads: simpy.Resource
    upgrades: simpy.Resource
    unloaded: simpy.Event | None = None
    """The preempted backups the interims need gone are unloaded."""
    interims: list[simpy.Event] = field(default_factory=list)
    """Where a preemption is deferred: one event per interim loading here, triggered when it
    serves (the deferred unload waits for all of them)."""
    unloaded_later: simpy.Event | None = None
    """The deferred preemptions are unloaded (the upgrades wait for it)."""


class _Run:
    """Mutable state of one simulated failure."""

    def __init__(self, state: ClusterSnapshot, plan: FailoverPlan, timing: Timing,
                 rng: random.Random) -> None:
        self.env = simpy.Environment()
        self.state, self.plan, self.timing = state, plan, timing
        detections = [timing.detection_ms(rng) for _ in sorted(plan.failed_servers)]
        self.declared = max(detections, default=0.0)
        self.agents: dict[str, _Agent] = {}
        self.served: dict[str, float] = {}
        self.settled: dict[str, float] = {}

    def agent(self, server_id: str) -> _Agent:
        agent = self.agents.get(server_id)
        if agent is None:
            agent = self.agents[server_id] = _Agent(
                simpy.Resource(self.env, self.timing.load_threads), simpy.Resource(self.env, 1))
        return agent

    def variant(self, app_id: str, name: str) -> Any:
        app = self.state.app_by_id[app_id]
        return self.state.family_of(app).variant(name)

    # --- processes --------------------------------------------------------------------------

    def controller(self) -> Proc:
        yield self.env.timeout(self.declared)
        deferred = set(self.plan.deferred_preemptions)
        for server_id in sorted({p.server_id for p in self.plan.preempted if p not in deferred}):
            self.agent(server_id).unloaded = self.env.process(self.unload())
        later = {p.server_id for p in deferred}
        for recovery in self.plan.recoveries:
            if recovery.server_id in later:
                self.agent(recovery.server_id).interims.append(self.env.event())
        for server_id in sorted(later):
            agent = self.agent(server_id)
            agent.unloaded_later = self.env.process(self.unload(after=agent.interims))
        for switch in self.plan.warm_switches:
            self.env.process(self.warm(switch))
        for recovery in self.plan.recoveries:
            self.env.process(self.progressive(recovery))

    def unload(self, after: Sequence[simpy.Event] = ()) -> Proc:
        """Preempted backups free their memory once the agent has the command.

        The command goes out once every event of ``after`` has happened.
        """
        if after:
            yield self.env.all_of(list(after))
        yield self.env.timeout(self.timing.command_ms)

    def warm(self, switch: WarmSwitch) -> Proc:
        yield self.env.timeout(self.timing.command_ms + self.timing.notification_ms)
        self.served[switch.app_id] = self.settled[switch.app_id] = self.env.now

    def progressive(self, r: ProgressiveRecovery) -> Proc:
        env, timing, agent = self.env, self.timing, self.agent(r.server_id)
        yield env.timeout(timing.command_ms)
        if agent.unloaded is not None:
            yield agent.unloaded
        with agent.loads.request() as thread:
            yield thread
            yield env.timeout(timing.load_ms(self.variant(r.app_id, r.interim_variant)))
        yield env.timeout(timing.notification_ms)
        self.served[r.app_id] = env.now
        if agent.interims:
            next(e for e in agent.interims if not e.triggered).succeed()
        if r.target_variant != r.interim_variant:
            if agent.unloaded_later is not None:
                yield agent.unloaded_later
            with agent.upgrades.request() as slot:
                yield slot
                with agent.loads.request() as thread:
                    yield thread
                    yield env.timeout(timing.load_ms(self.variant(r.app_id, r.target_variant)))
                yield env.timeout(timing.notification_ms)
        self.settled[r.app_id] = env.now

    # --- results ----------------------------------------------------------------------------

    def outcomes(self) -> tuple[AppOutcome, ...]:
        out = []
        for s in self.plan.warm_switches:
            out.append(self._recovered(s.app_id, WARM, s.server_id, s.variant, s.variant))
        for r in self.plan.recoveries:
            how = COLD if r.interim_variant == r.target_variant else PROGRESSIVE
            out.append(self._recovered(r.app_id, how, r.server_id, r.target_variant,
                                       r.interim_variant))
        for u in self.plan.unrecoverable:
            app = self.state.app_by_id[u.app_id]
            out.append(AppOutcome(u.app_id, app.critical, LOST, None, None, None,
                                  self.declared, None, None, None, None, None))
        return tuple(sorted(out, key=lambda o: o.app_id))

    def _recovered(self, app_id: str, how: str, server_id: str, variant: str,
                   interim: str) -> AppOutcome:
        app = self.state.app_by_id[app_id]
        primary = self.state.primary_variant(app)
        served = self.served[app_id]
        return AppOutcome(
            app_id, app.critical, how, server_id, variant, interim, self.declared,
            mttr_ms=served - self.declared, e2e_ms=served,
            settled_ms=self.settled[app_id] - self.declared,
            accuracy_reduction=accuracy_reduction(primary, self.variant(app_id, variant)),
            interim_accuracy_reduction=accuracy_reduction(primary,
                                                          self.variant(app_id, interim)))


def simulate_failover(state: ClusterSnapshot, plan: FailoverPlan, timing: Timing,
                      rng: random.Random) -> tuple[AppOutcome, ...]:
    """Run ``plan`` for the failure of ``plan.failed_servers`` on ``state``; one outcome per app.

    ``state`` is the snapshot the plan was made from (primaries and warm backups loaded).
    ``rng`` draws the detection delays only. Outcomes are sorted by app id.
    """
    run = _Run(state, plan, timing, rng)
    run.env.process(run.controller())
    run.env.run()
    return run.outcomes()


def outcome_counts(outcomes: tuple[AppOutcome, ...]) -> Mapping[str, int]:
    """How many apps came back each way (warm, progressive, cold, lost)."""
    counts = {WARM: 0, PROGRESSIVE: 0, COLD: 0, LOST: 0}
    for o in outcomes:
        counts[o.how] += 1
    return counts
