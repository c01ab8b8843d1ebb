"""Progressive failover: FailLite Algorithm 1 for the affected apps that have no warm backup.

``plan_progressive`` picks each app's variant and live server (FailLite §3.3): ``match`` a
variant to the demand ratio δ = C / D, place it memory worst-fit falling back to smaller
variants, then ``upgrade_model`` with what is left. A recovery loads the *interim* (the
family's smallest variant meeting the SLO on the chosen server) first, then the *target*.
Every variant used obeys ``policies/replica_rules.py``: never above the primary variant
(unless the app allows it), and only in the app's pinned site.

Where we do better than the paper, on purpose:

* **Transient safety.** While a target loads the interim still serves, and the orchestrator
  upgrades one app per server at a time. Per server and resource the plan keeps
  ``Σ max(interim, target) + max over upgrading apps of min(interim, target) <= free``, i.e.
  ``Σ targets + max interim`` when the interim needs no more than its target (always true for
  memory). The second term is the server's *reserve*; placement and upgrades both keep it.
* **Larger variants as a last resort.** When no variant from the matched one down meets the
  SLO on a server with room, the larger ones up to the primary (or beyond, if the app allows
  it) are tried, smallest first: an app is never given up while a variant it may use fits.
* **Upgrade pass.** Candidates (app, larger variant with strictly higher accuracy meeting the
  SLO on the app's server, not above its primary) go best accuracy gain per extra MB first,
  and the pass repeats until nothing improves (see ``_upgrade_pass`` for why that is cheap).
  An upgrade to a variant needing less of a resource can make room for an app given up
  earlier: those are then tried again, and the pass runs again for them.
* **Speed.** Demands are float tuples (memory first) precomputed once per app. Servers sit in
  lists sorted by free memory, most first, per *latency class* (type, speed), so an SLO is
  checked per class, not per server, and per (class, site) for apps whose exclusion list
  names sites. A search walks a list in worst-fit order until a server fits and stops once
  the most free memory left is below the demand; a server that changes moves within its
  lists (bisection). An attempt costs O(1) when memory binds; excluded servers, or compute
  binding on servers that still have memory, make it walk past more servers (O(S) at worst);
  walking past a server changes nothing, so it is cheap.

Ties go to the smaller server id. ``config.order == "priority"`` takes critical apps first,
then larger matched variants, then app id. Repeated ids in ``app_ids`` are ignored.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.actions import ProgressivePlan, ProgressiveRecovery, Unrecoverable
from policies.config import ProgressiveConfig
from policies.errors import InvalidInputError, UnknownReferenceError
from policies.model import Application, ClusterSnapshot, Family, Server, Variant
from policies.progressive_reasons import Reasons
from policies.progressive_state import EPSILON, Entry, PlanApp, PlanCluster, Vec
from policies.replica_rules import scoped, within_choice
from policies.resources import COMPUTE, MEMORY_MB

# A search stops early on free memory alone; a looser slack than EPSILON makes sure
# rounding in "free - used - reserve" can never prune a server that the exact test accepts.
_PRUNE_SLACK = 1e-6

DEFAULT_CONFIG = ProgressiveConfig()
"""The default settings (a frozen model, so one shared instance is safe)."""



def match_variant(family: Family, primary: Variant, delta: float) -> Variant:
    """The largest variant up to ``primary`` with memory <= δ × the primary's, else the smallest."""
    top = family.index(primary.name)
    return family.variants[_match_index([v.memory_mb for v in family.variants], top, delta)]


def _match_index(memory: Sequence[float], top: int, delta: float) -> int:
    if delta >= 1.0:
        return top
    limit = delta * memory[top] + EPSILON
    for index in range(top, -1, -1):
        if memory[index] <= limit:
            return index
    return 0


def plan_progressive(snapshot: ClusterSnapshot, app_ids: Sequence[str],
                     config: ProgressiveConfig = DEFAULT_CONFIG) -> ProgressivePlan:
    """Recover ``app_ids`` cold on the live servers' free capacity (FailLite Algorithm 1).

    ``app_ids`` are the affected apps without a warm backup; repeats are ignored. Returns one
    ``ProgressiveRecovery`` (interim then target variant on one server) or ``Unrecoverable``
    per app, in processing order, and δ (0.0 when there is nothing to recover). Raises
    ``UnknownReferenceError`` for an id the snapshot does not know.
    """
    apps = _resolve_apps(snapshot, app_ids)
    servers = sorted((snapshot.server_by_id[s] for s in snapshot.free), key=lambda s: s.server_id)
    names = _resource_names(snapshot, apps)
    classes, klass = _latency_classes(servers)
    catalog = _Catalog(snapshot, names, classes)
    infos = [catalog.app(app) for app in apps]
    cluster = _new_cluster(snapshot, servers, names, klass, len(classes))
    delta = _demand_ratio(cluster, infos) if infos else 0.0
    for info in infos:
        info.match = _match_index(info.mem, info.top, delta)
    if config.order == "priority":
        infos.sort(key=lambda a: (not a.app.critical, -a.mem[a.match], a.app.app_id))
    for pos, info in enumerate(infos):
        info.pos = pos

    lost = [info for info in infos if not _place(cluster, info)]
    if config.upgrade:
        freed = _upgrade_pass(cluster, [info for info in infos if info.server >= 0])
        while lost and freed:
            # Capacity is otherwise only consumed: a retry can succeed only after a shrink.
            cluster.resort()
            still = [info for info in lost if not _place(cluster, info)]
            if len(still) == len(lost):
                break
            lost = still
            freed = _upgrade_pass(cluster, [info for info in infos if info.server >= 0])
    return _result(snapshot, cluster, infos, lost, delta, names)


# --- input ------------------------------------------------------------------------------------


def _resolve_apps(snapshot: ClusterSnapshot, app_ids: Sequence[str]) -> list[Application]:
    if isinstance(app_ids, str):
        raise InvalidInputError(
            f"app_ids must be a sequence of app ids, not the string {app_ids!r}")
    unique = list(dict.fromkeys(app_ids))  # first occurrence wins, order kept
    unknown = [a for a in unique if a not in snapshot.app_by_id]
    if unknown:
        raise UnknownReferenceError(f"progressive failover for unknown apps {sorted(unknown)}")
    # A pin becomes an allowed site: the site pools and the reasons then honour it.
    return [scoped(snapshot, snapshot.app_by_id[a]) for a in unique]


def _resource_names(snapshot: ClusterSnapshot, apps: Sequence[Application]) -> list[str]:
    """Memory first (worst-fit balances it), then every other resource any variant needs."""
    others = {COMPUTE}
    for family in {app.family for app in apps}:
        for variant in snapshot.families[family].variants:
            others.update(variant.base_demand)
    others.discard(MEMORY_MB)
    return [MEMORY_MB, *sorted(others)]


def _latency_classes(servers: Sequence[Server]) -> tuple[list[Server], list[int]]:
    """Group servers on which every variant has the same latency: same (type, speed)."""
    index: dict[tuple[str, float], int] = {}
    klass = [index.setdefault((s.server_type, s.speed), len(index)) for s in servers]
    return list({c: s for s, c in zip(servers, klass, strict=True)}.values()), klass


@dataclass(frozen=True, slots=True)
class _FamilyTable:
    """A family's numbers, computed once per call and shared by all its apps."""

    base: list[Vec]
    compute_per_rps: list[float]
    acc: list[float]
    latency: list[list[float]]  # per latency class, per variant
    index: dict[str, int]       # variant name -> position in size order
    best: int                   # position of the most accurate variant (default primary)


@dataclass(slots=True)
class _Catalog:
    """Per-call caches, so the cost per app is a few list operations (no Resources objects)."""

    snapshot: ClusterSnapshot
    names: list[str]
    classes: list[Server]
    tables: dict[str, _FamilyTable] = field(default_factory=dict)
    slos: dict[tuple[str, float | None, int, bool], tuple[list[list[bool]], list[int]]] = field(
        default_factory=dict)  # (family, SLO, top, larger allowed) -> per class: ok?, interim

    def table(self, family: str) -> _FamilyTable:
        table = self.tables.get(family)
        if table is None:
            variants = self.snapshot.families[family].variants
            best = self.snapshot.families[family].most_accurate
            table = self.tables[family] = _FamilyTable(
                [tuple(v.base_demand[r] for r in self.names) for v in variants],
                [v.compute_per_rps for v in variants], [v.accuracy for v in variants],
                [[v.latency_on(rep) for v in variants] for rep in self.classes],
                {v.name: j for j, v in enumerate(variants)}, variants.index(best))
        return table

    def app(self, app: Application) -> PlanApp:
        table, compute, slo = self.table(app.family), self.names.index(COMPUTE), app.latency_slo_ms
        top = table.best if app.primary_variant is None else table.index[app.primary_variant]
        key = (app.family, slo, top, app.allow_larger_backups)
        if key not in self.slos:
            allowed = self.allowed(app.family, top, app.allow_larger_backups)
            ok = [[fine and (slo is None or ms <= slo)
                   for ms, fine in zip(row, allowed, strict=True)] for row in table.latency]
            interim = [row.index(True) if True in row else -1 for row in ok]
            self.slos[key] = (ok, interim)
        dem: list[Vec] = []
        for base, per_rps in zip(table.base, table.compute_per_rps, strict=True):
            vector = list(base)
            vector[compute] += per_rps * app.max_rate_rps  # as Variant.demand computes it
            dem.append(tuple(vector))
        ok, interim = self.slos[key]
        restricted = bool(app.excluded_servers or app.excluded_sites
                          or app.allowed_backup_sites is not None)
        return PlanApp(app=app, dem=dem, mem=[d[0] for d in dem], acc=table.acc, top=top, ok=ok,
                    interim=interim, restricted=restricted, excluded=app.excluded_servers)

    def allowed(self, family: str, top: int, larger: bool) -> list[bool]:
        """Per variant: may a replica use it (``replica_rules.within_choice``)?"""
        variants = self.snapshot.families[family].variants
        return [larger or within_choice(variants[top], v) for v in variants]


def _demand_ratio(cluster: PlanCluster, infos: Sequence[PlanApp]) -> float:
    """δ = min over resources with demand of C^r / D^r (the binding resource)."""
    demand = [sum(column) for column in zip(*(info.dem[info.top] for info in infos), strict=True)]
    capacity = [sum(column) for column in zip(*cluster.free, strict=True)] or [0.0] * len(demand)
    ratios: list[float] = [c / d for c, d in zip(capacity, demand, strict=True) if d > 0]
    return min(ratios)


def _new_cluster(snapshot: ClusterSnapshot, servers: list[Server], names: Sequence[str],
                 klass: list[int], n_classes: int) -> PlanCluster:
    cluster = PlanCluster(servers, [s.server_id for s in servers],
                       [tuple(snapshot.free[s.server_id][r] for r in names) for s in servers],
                       klass, used=[[0.0] * len(names) for _ in servers],
                       reserve=[[0.0] * len(names) for _ in servers],
                       residents=[[] for _ in servers], entry=[],
                       orders=[[] for _ in range(n_classes)],
                       site_orders=[{} for _ in range(n_classes)])
    for k, server in enumerate(servers):
        entry = (-cluster.head(k), k)
        cluster.entry.append(entry)
        cluster.orders[klass[k]].append(entry)
        cluster.site_orders[klass[k]].setdefault(server.site_id, []).append(entry)
    for order in [*cluster.orders, *(o for sites in cluster.site_orders for o in sites.values())]:
        order.sort()
    return cluster


# --- placement --------------------------------------------------------------------------------


def _load(info: PlanApp, interim: int, target: int) -> tuple[Vec, Vec]:
    """(steady demand, transient reserve) of ``target`` recovered through ``interim``."""
    tgt = info.dem[target]
    if interim == target:
        return tgt, (0.0,) * len(tgt)
    itm = info.dem[interim]
    return tuple(map(max, tgt, itm)), tuple(map(min, tgt, itm))


def _best_in(cluster: PlanCluster, order: list[Entry], info: PlanApp, base: Vec,
             trans: Vec) -> Entry | None:
    """The worst-fit server in ``order`` that takes (base, trans), if any."""
    # The hot loop of the module. The fit test (``used + base + max(reserve, trans) <= free``
    # per resource) is inlined, memory last since the walk order already screens it, and
    # ``max`` spelled out with its exact semantics. An exclusion list needs only its servers
    # checked: its sites never reach this list (``PlanCluster.pools``).
    free, used, reserve, ids, excluded = (cluster.free, cluster.used, cluster.reserve,
                                          cluster.ids, info.excluded)
    need = base[0] - _PRUNE_SLACK
    resources = range(len(base) - 1, -1, -1)
    for entry in order:
        if -entry[0] < need:
            return None  # every remaining server has even less free memory
        k = entry[1]
        if excluded and ids[k] in excluded:
            continue
        room, load, held = free[k], used[k], reserve[k]
        for r in resources:
            high, t = held[r], trans[r]
            if t > high:
                high = t
            if load[r] + base[r] + high > room[r] + EPSILON:
                break
        else:
            return entry
    return None


def _place(cluster: PlanCluster, info: PlanApp) -> bool:
    """Matched variant down to the smallest, then the larger ones up: the first fit wins.

    ``ok`` leaves out the variants the app may not use (``replica_rules``).
    """
    for j in (*range(info.match, -1, -1), *range(info.match + 1, len(info.mem))):
        best: Entry | None = None
        for c in range(len(cluster.orders)):
            if not info.ok[c][j]:
                continue
            base, trans = _load(info, info.interim[c], j)
            for order in cluster.pools(c, info.app):
                hit = _best_in(cluster, order, info, base, trans)
                if hit is not None and (best is None or hit < best):
                    best = hit
        if best is not None:
            _commit(cluster, best[1], info, j)
            return True
    return False


def _commit(cluster: PlanCluster, k: int, info: PlanApp, j: int) -> None:
    interim = info.interim[cluster.klass[k]]
    base, trans = _load(info, interim, j)
    used, reserve = cluster.used[k], cluster.reserve[k]
    for r in range(len(base)):
        used[r] += base[r]
        reserve[r] = max(reserve[r], trans[r])
    info.server, info.variant, info.interim_index = k, j, interim
    info.base, info.trans = base, trans
    cluster.residents[k].append(info)
    cluster.touch(k)


# --- upgrade_model ----------------------------------------------------------------------------


def _upgrade_pass(cluster: PlanCluster, placed: Sequence[PlanApp]) -> bool:
    """Greedy by accuracy gain per extra MB, repeated until nothing improves.

    A failed candidate can only succeed later if another app on its server came to need *less*
    of some resource (a larger variant with a smaller compute share, say); capacity is otherwise
    only consumed. So a new round revisits just those servers: usually there are none.
    Returns whether any server came to need less of a resource (apps given up may fit now).
    """
    by_pos = {info.pos: info for info in placed}
    todo: Sequence[PlanApp] = placed
    freed = False
    while todo:
        candidates = []
        for info in todo:
            c, cur = cluster.klass[info.server], info.variant
            for v in range(cur + 1, len(info.acc)):
                gain = info.acc[v] - info.acc[cur]
                if gain > 0 and info.ok[c][v]:
                    extra = info.mem[v] - info.mem[cur]
                    ratio = gain / extra if extra > 0 else math.inf
                    candidates.append((-ratio, -gain, info.pos, v))
        candidates.sort()
        shrunk: set[int] = set()
        for _, _, pos, v in candidates:
            info = by_pos[pos]
            if info.acc[v] > info.acc[info.variant]:
                _try_upgrade(cluster, info, v, shrunk)
        freed = freed or bool(shrunk)
        todo = [info for info in placed if info.server in shrunk]
    return freed


def _try_upgrade(cluster: PlanCluster, info: PlanApp, v: int, shrunk: set[int]) -> None:
    """Raise ``info`` to variant ``v`` on its server if it fits; note a server that shrank."""
    k = info.server
    used, free = cluster.used[k], cluster.free[k]
    if used[0] - info.base[0] + info.mem[v] > free[0] + EPSILON:
        return  # cheap early exit: memory alone already fails (most candidates, late on)
    base, trans = _load(info, info.interim_index, v)
    if all(map(operator.ge, trans, info.trans)):
        # Usual case: its transient only grows, so the reserve without it needs no recount.
        reserve = list(map(max, cluster.reserve[k], trans))
    else:
        reserve = list(trans)
        for other in cluster.residents[k]:
            if other is not info:
                reserve = list(map(max, reserve, other.trans))
    new_used = [u - old + new for u, old, new in zip(used, info.base, base, strict=True)]
    if any(u + t > f + EPSILON for u, t, f in zip(new_used, reserve, free, strict=True)):
        return
    if any(map(operator.lt, base, info.base)) or any(map(operator.lt, trans, info.trans)):
        shrunk.add(k)
    cluster.used[k], cluster.reserve[k] = new_used, reserve
    info.variant, info.base, info.trans = v, base, trans


# --- output -----------------------------------------------------------------------------------


def _result(snapshot: ClusterSnapshot, cluster: PlanCluster, infos: Sequence[PlanApp],
            lost: Sequence[PlanApp], delta: float, names: Sequence[str]) -> ProgressivePlan:
    recoveries = []
    for info in infos:
        if info.server >= 0:
            variants = snapshot.families[info.app.family].variants
            recoveries.append(ProgressiveRecovery(
                info.app.app_id, cluster.servers[info.server].server_id,
                variants[info.interim_index].name, variants[info.variant].name))
    why = Reasons(snapshot, cluster, names)
    return ProgressivePlan(recoveries=tuple(recoveries), demand_ratio=delta,
                           unrecoverable=tuple(Unrecoverable(i.app.app_id, why(i)) for i in lost))
