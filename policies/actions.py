"""Decisions as typed values: the plans policies return and the actions they imply.

Policies never act. A plan's ``stages()`` are what gets executed, by the controller's executor
against real agents and by the simulator against its simulated cluster, under one rule
(:class:`Stage`); ``actions()`` is the same list flattened, for reading and for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.model import Placement, Role

# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadVariant:
    """Load ``variant`` of ``app_id`` on ``server_id`` for ``role``."""

    server_id: str
    app_id: str
    variant: str
    role: Role


@dataclass(frozen=True, slots=True)
class UnloadVariant:
    """Unload ``variant`` of ``app_id`` from ``server_id``."""

    server_id: str
    app_id: str
    variant: str


@dataclass(frozen=True, slots=True)
class PromoteReplica:
    """Make the loaded replica on ``server_id`` the app's serving replica and notify clients."""

    app_id: str
    server_id: str
    variant: str


@dataclass(frozen=True, slots=True)
class RemoveStray:
    """Unload a model ``server_id`` holds that no record wants.

    Found when reconciling an agent; the controller's alone: a simulated cluster holds none.
    """

    server_id: str
    app_id: str
    variant: str


Action = LoadVariant | UnloadVariant | PromoteReplica | RemoveStray


@dataclass(frozen=True, slots=True)
class Stage:
    """A named group of actions, executed under one rule everywhere.

    A stage starts once every stage named in ``after`` (earlier in the same list) has
    finished. Inside it, each app's actions run one after the other, in list order; different
    apps' actions run at the same time. ``urgent`` marks loads that end an outage (the app has
    nothing serving): an agent runs them before its routine loads.
    """

    name: str
    actions: tuple[Action, ...]
    after: tuple[str, ...] = ()
    urgent: bool = False


def flatten(stages: tuple[Stage, ...]) -> tuple[Action, ...]:
    """Every action of ``stages``, in order."""
    return tuple(action for stage in stages for action in stage.actions)


# --- warm-backup plan ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WarmAssignment:
    """One warm backup: ``variant`` of ``app_id`` loaded on ``server_id``."""

    app_id: str
    server_id: str
    variant: str
    accuracy: float


@dataclass(frozen=True, slots=True)
class UncoveredApp:
    """An app in K that got fewer warm backups than it asked for, and why."""

    app_id: str
    wanted: int
    placed: int
    reason: str


@dataclass(frozen=True, slots=True)
class SolveStats:
    """How a plan was computed: solver outcome, objective, bound and timings."""

    method: str
    solver: str
    status: str
    objective: float
    bound: float | None = None
    gap: float | None = None
    variables: int = 0
    constraints: int = 0
    build_s: float = 0.0
    solve_s: float = 0.0
    total_s: float = 0.0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """The chosen warm backups for the apps in K, and the apps left without enough of them."""

    assignments: tuple[WarmAssignment, ...]
    uncovered: tuple[UncoveredApp, ...]
    stats: SolveStats

    def for_app(self, app_id: str) -> tuple[WarmAssignment, ...]:
        return tuple(a for a in self.assignments if a.app_id == app_id)

    def placements(self) -> tuple[Placement, ...]:
        """The planned backups as WARM placements, to add to a snapshot once loaded."""
        return tuple(Placement(a.app_id, a.server_id, a.variant, Role.WARM)
                     for a in self.assignments)

    def actions(self, current_warm: tuple[tuple[str, str, str], ...] = ()) -> tuple[Action, ...]:
        """Loads for new backups, then unloads of ``current_warm`` (app, server, variant) dropped.

        Loads come first so an app never has fewer backups than before while the plan applies.
        """
        return flatten(self.stages(current_warm))

    def stages(self, current_warm: tuple[tuple[str, str, str], ...] = ()) -> tuple[Stage, ...]:
        """One stage: each app's new backups load before its dropped ones unload."""
        wanted = {(a.app_id, a.server_id, a.variant) for a in self.assignments}
        current = set(current_warm)
        loads = tuple(LoadVariant(a.server_id, a.app_id, a.variant, Role.WARM)
                      for a in self.assignments
                      if (a.app_id, a.server_id, a.variant) not in current)
        unloads = tuple(UnloadVariant(server, app, variant)
                        for app, server, variant in sorted(current - wanted))
        return (Stage("warm", loads + unloads),)


# --- failover plan -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WarmSwitch:
    """A failed app switches at once to its live warm backup."""

    app_id: str
    server_id: str
    variant: str


@dataclass(frozen=True, slots=True)
class ProgressiveRecovery:
    """A failed app is recovered cold on ``server_id``: interim variant first, then target.

    When ``interim_variant == target_variant`` only one load happens.
    """

    app_id: str
    server_id: str
    interim_variant: str
    target_variant: str


@dataclass(frozen=True, slots=True)
class Unrecoverable:
    """A failed app for which no live server has room, even for its smallest variant."""

    app_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ProgressivePlan:
    """Output of the progressive-failover heuristic (FailLite Algorithm 1)."""

    recoveries: tuple[ProgressiveRecovery, ...]
    unrecoverable: tuple[Unrecoverable, ...]
    demand_ratio: float = 0.0


@dataclass(frozen=True, slots=True)
class FailoverPlan:
    """What to do when servers fail: warm switches first, then progressive recoveries."""

    failed_servers: frozenset[str]
    warm_switches: tuple[WarmSwitch, ...]
    recoveries: tuple[ProgressiveRecovery, ...]
    unrecoverable: tuple[Unrecoverable, ...]
    notes: tuple[str, ...] = field(default=())
    preempted: tuple[Placement, ...] = field(default=())
    """Warm backups of healthy apps to unload so that the recoveries fit (policies/preemption)."""
    deferred_preemptions: tuple[Placement, ...] = field(default=())
    """The part of ``preempted`` whose room only the upgrades need: the interims fit beside
    them, so they are unloaded once the interims serve (and before any upgrade loads), not
    on the outage's path. By default every preempted backup goes first."""

    @property
    def affected_apps(self) -> frozenset[str]:
        return frozenset(s.app_id for s in self.warm_switches) | frozenset(
            r.app_id for r in self.recoveries) | frozenset(u.app_id for u in self.unrecoverable)

    def actions(self) -> tuple[Action, ...]:
        """Every action of :meth:`stages`, in order."""
        return flatten(self.stages())

    def stages(self) -> tuple[Stage, ...]:
        """Warm promotions and preemptions, interims, deferred preemptions, then upgrades.

        ``switch``: the warm backups' promotions (no load needed). ``preempt``: the preempted
        backups the interims need gone. ``interim`` (after ``preempt``, urgent): each
        recovery's interim load and its promotion, in ``recoveries`` order. ``release`` (after
        ``interim``): the deferred preemptions. ``upgrade`` (after both): each target's load,
        its promotion and the interim's unload. Every interim serves before any upgrade
        starts: interims end outages, upgrades only restore accuracy, and on a small cluster
        the two compete for the same disks, network and cores.
        """
        deferred = set(self.deferred_preemptions)
        switch = tuple(PromoteReplica(s.app_id, s.server_id, s.variant)
                       for s in self.warm_switches)
        preempt = tuple(UnloadVariant(p.server_id, p.app_id, p.variant)
                        for p in self.preempted if p not in deferred)
        interims: list[Action] = []
        upgrades: list[Action] = []
        for r in self.recoveries:
            interims.append(LoadVariant(r.server_id, r.app_id, r.interim_variant, Role.INTERIM))
            interims.append(PromoteReplica(r.app_id, r.server_id, r.interim_variant))
            if r.target_variant != r.interim_variant:
                upgrades.append(LoadVariant(r.server_id, r.app_id, r.target_variant, Role.UPGRADE))
                upgrades.append(PromoteReplica(r.app_id, r.server_id, r.target_variant))
                upgrades.append(UnloadVariant(r.server_id, r.app_id, r.interim_variant))
        release = tuple(UnloadVariant(p.server_id, p.app_id, p.variant)
                        for p in self.preempted if p in deferred)
        return (Stage("switch", switch),
                Stage("preempt", preempt),
                Stage("interim", tuple(interims), after=("preempt",), urgent=True),
                Stage("release", release, after=("interim",)),
                Stage("upgrade", tuple(upgrades), after=("interim", "release")))
