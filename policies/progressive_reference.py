"""A direct, slow reference implementation of FailLite Algorithm 1, for tests and the bench.

Same semantics as ``policies.progressive.plan_progressive`` (ordering, tie-breaks, transient
reserve, larger variants as a last resort, upgrade pass, apps given up tried again after it)
written the obvious way: every placement attempt scans *all* live servers in id order (only
skipping the feasibility test of a server whose free memory cannot beat the best one found so
far), the upgrade pass re-runs full rounds until nothing changes and recomputes each server's
load from scratch, and apps given up are tried again after every upgrade pass; no heaps, no
latency classes, no caches. It shares no planning code with the fast implementation (only the
rules of ``policies/replica_rules.py``), so agreement between the two is evidence.

The tests (``tests/unit/test_progressive*.py``) and ``bench/heuristic_scale.py`` both compare
the fast implementation against it, so it lives here rather than under ``tests/``. It is never
used to plan a real failover. Unrecoverable reasons are not part of the contract shared with
the fast implementation, so this module only says "no feasible placement".

Float results agree exactly when demands are dyadic (integers for memory, multiples of a
power of two for compute), which is what the tests and the bench generate: the fast code
updates loads incrementally, this one sums them from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.actions import ProgressivePlan, ProgressiveRecovery, Unrecoverable
from policies.config import ProgressiveConfig
from policies.errors import InvalidInputError, UnknownReferenceError
from policies.model import Application, ClusterSnapshot, Server, Variant
from policies.replica_rules import may_use_variant, scoped
from policies.resources import MEMORY_MB

EPS = 1e-9
Load = dict[str, float]


@dataclass
class Slot:
    """One recovered app on a server: its variants' demands, interim and target."""

    app: Application
    pos: int
    variants: tuple[Variant, ...]
    demands: list[Load]
    top: int
    interim: int
    target: int


def steady_and_transient(slot: Slot, target: int) -> tuple[Load, Load]:
    """max(interim, target) always loaded; min(interim, target) while the upgrade runs."""
    tgt = slot.demands[target]
    if target == slot.interim:
        return tgt, {}
    itm = slot.demands[slot.interim]
    names = tgt.keys() | itm.keys()
    return ({r: max(tgt.get(r, 0.0), itm.get(r, 0.0)) for r in names},
            {r: min(tgt.get(r, 0.0), itm.get(r, 0.0)) for r in names})


def server_load(slots: Sequence[Slot]) -> tuple[Load, Load]:
    """(Σ steady demand, max transient demand) of the slots on one server, from scratch."""
    used: Load = {}
    reserve: Load = {}
    for slot in slots:
        steady, transient = steady_and_transient(slot, slot.target)
        for r, v in steady.items():
            used[r] = used.get(r, 0.0) + v
        for r, v in transient.items():
            reserve[r] = max(reserve.get(r, 0.0), v)
    return used, reserve


def fits(free: Load, used: Load, reserve: Load, steady: Load, transient: Load) -> bool:
    names = set(steady) | set(transient) | set(used) | set(reserve)
    return all(used.get(r, 0.0) + steady.get(r, 0.0)
               + max(reserve.get(r, 0.0), transient.get(r, 0.0)) <= free.get(r, 0.0) + EPS
               for r in names)


def meets_slo(app: Application, variant: Variant, server: Server) -> bool:
    return app.latency_slo_ms is None or variant.latency_on(server) <= app.latency_slo_ms


def reference_plan_progressive(snapshot: ClusterSnapshot, app_ids: Sequence[str],
                               config: ProgressiveConfig = ProgressiveConfig()  # noqa: B008
                               ) -> ProgressivePlan:
    apps = resolve(snapshot, app_ids)
    live = sorted((snapshot.server_by_id[s] for s in snapshot.free), key=lambda s: s.server_id)
    free = {s.server_id: dict(snapshot.free[s.server_id]) for s in live}

    # Lines 2-6: available capacity, max demand, demand ratio δ, match.
    delta = demand_ratio(snapshot, apps, free) if apps else 0.0
    matched = {app.app_id: match(snapshot, app, delta) for app in apps}
    if config.order == "priority":
        apps.sort(key=lambda a: (not a.critical,
                                 -snapshot.families[a.family].variants[matched[a.app_id][1]]
                                 .memory_mb, a.app_id))

    # Lines 7-12: worst-fit placement, matched variant down to the smallest.
    state = {s.server_id: ServerState(s, free[s.server_id]) for s in live}
    placed: list[tuple[Slot, str]] = []
    lost: list[tuple[int, Application]] = []
    for pos, app in enumerate(apps):
        where = place_one(snapshot, app, pos, matched[app.app_id], list(state.values()))
        if where is None:
            lost.append((pos, app))
        else:
            placed.append(where)

    # Lines 13-14: upgrade_model, best gain per MB first, until nothing improves; then the
    # apps given up again, and so on while that recovers any.
    if config.upgrade:
        while True:
            while upgrade_round(snapshot, placed, state):
                pass
            retried = []
            for pos, app in lost:
                where = place_one(snapshot, app, pos, matched[app.app_id], list(state.values()))
                if where is None:
                    retried.append((pos, app))
                else:
                    placed.append(where)
            if len(retried) == len(lost):
                break
            lost = retried

    recoveries = tuple(ProgressiveRecovery(slot.app.app_id, server_id,
                                           slot.variants[slot.interim].name,
                                           slot.variants[slot.target].name)
                       for slot, server_id in sorted(placed, key=lambda p: p[0].pos))
    return ProgressivePlan(recoveries=recoveries,
                           unrecoverable=tuple(Unrecoverable(a.app_id, "no feasible placement")
                                               for _, a in lost),
                           demand_ratio=delta)


def resolve(snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> list[Application]:
    if isinstance(app_ids, str):
        raise InvalidInputError("app_ids must be a sequence")
    ids = list(dict.fromkeys(app_ids))
    for app_id in ids:
        if app_id not in snapshot.app_by_id:
            raise UnknownReferenceError(app_id)
    return [scoped(snapshot, snapshot.app_by_id[a]) for a in ids]


def demand_ratio(snapshot: ClusterSnapshot, apps: Sequence[Application],
                 free: dict[str, Load]) -> float:
    demand: Load = {}
    for app in apps:
        for r, v in snapshot.primary_variant(app).demand(app.max_rate_rps).items():
            demand[r] = demand.get(r, 0.0) + v
    return min(sum(f.get(r, 0.0) for f in free.values()) / d for r, d in demand.items() if d > 0)


def match(snapshot: ClusterSnapshot, app: Application, delta: float) -> tuple[int, int]:
    """(index of the primary, index of the matched variant) in size order."""
    family = snapshot.families[app.family]
    top = family.index(snapshot.primary_variant(app).name)
    choice = 0
    for j in range(top + 1):
        if delta >= 1.0 or family.variants[j].memory_mb <= (
                delta * family.variants[top].memory_mb + EPS):
            choice = j
    return top, choice


@dataclass
class ServerState:
    """A live server's free capacity and what the plan put on it so far."""

    server: Server
    free: Load
    used: Load = field(default_factory=dict)
    reserve: Load = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)

    def head(self) -> float:
        return (self.free.get(MEMORY_MB, 0.0) - self.used.get(MEMORY_MB, 0.0)
                - self.reserve.get(MEMORY_MB, 0.0))

    def add(self, slot: Slot) -> None:
        steady, transient = steady_and_transient(slot, slot.target)
        for r, v in steady.items():
            self.used[r] = self.used.get(r, 0.0) + v
        for r, v in transient.items():
            self.reserve[r] = max(self.reserve.get(r, 0.0), v)
        self.slots.append(slot)


def place_one(snapshot: ClusterSnapshot, app: Application, pos: int, top_and_match: tuple[int, int],
              servers: Sequence[ServerState]) -> tuple[Slot, str] | None:
    variants = snapshot.families[app.family].variants
    demands = [dict(v.demand(app.max_rate_rps)) for v in variants]
    top, match = top_and_match
    usable = [may_use_variant(snapshot, app, v) for v in variants]
    for j in [*range(match, -1, -1), *range(match + 1, len(variants))]:
        if not usable[j]:
            continue
        best: ServerState | None = None
        best_slot: Slot | None = None
        best_head = 0.0
        for state in servers:  # sorted by server id
            head = state.head()
            if best is not None and head <= best_head:
                continue  # cannot beat the best so far (ties go to the smaller id)
            server = state.server
            if not app.may_back_up_on(server) or not meets_slo(app, variants[j], server):
                continue
            interim = next(i for i in range(j + 1)
                           if usable[i] and meets_slo(app, variants[i], server))
            slot = Slot(app, pos, variants, demands, top, interim, j)
            steady, transient = steady_and_transient(slot, j)
            if fits(state.free, state.used, state.reserve, steady, transient):
                best, best_slot, best_head = state, slot, head
        if best is not None and best_slot is not None:
            best.add(best_slot)
            return best_slot, best.server.server_id
    return None


def upgrade_round(snapshot: ClusterSnapshot, placed: Sequence[tuple[Slot, str]],
                  state: dict[str, ServerState]) -> bool:
    candidates = []
    for slot, server_id in placed:
        server = snapshot.server_by_id[server_id]
        cur = slot.variants[slot.target]
        for v in range(slot.target + 1, len(slot.variants)):
            variant = slot.variants[v]
            gain = variant.accuracy - cur.accuracy
            if (gain > 0 and may_use_variant(snapshot, slot.app, variant)
                    and meets_slo(slot.app, variant, server)):
                extra = variant.memory_mb - cur.memory_mb
                ratio = gain / extra if extra > 0 else float("inf")
                candidates.append(((-ratio, -gain, slot.pos, v), slot, server_id))
    candidates.sort(key=lambda c: c[0])
    changed = False
    for (_, _, _, v), slot, server_id in candidates:
        if slot.variants[v].accuracy <= slot.variants[slot.target].accuracy:
            continue
        old = slot.target
        slot.target = v
        target = state[server_id]
        used, reserve = server_load(target.slots)
        if all(used.get(r, 0.0) + reserve.get(r, 0.0) <= target.free.get(r, 0.0) + EPS
               for r in used.keys() | reserve.keys()):
            target.used, target.reserve = used, reserve
            changed = True
        else:
            slot.target = old
    return changed
