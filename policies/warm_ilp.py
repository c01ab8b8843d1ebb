"""Warm-backup selection and placement: FailLite eq. (1)-(7) with §3.4's extensions, in PuLP.

Model (for the apps in K that have a live primary; x binary, u continuous slack)::

    max  Σ a_ij q_i x_ijk  −  P Σ_i u_i
    s.t. Σ_jk x_ijk + u_i = R_i                     ∀i     (eq. 5, R backups, slack u_i)
         Σ_ij d^r_ij x_ijk ≤ c^r_k                  ∀k,r   (eq. 2)
         Σ_ijk d^r_ij x_ijk ≤ (1 − α) Σ_k c^r_k     ∀r     (eq. 3)
         Σ_j x_ijk ≤ 1                              ∀i,k   (R > 1: backups on distinct servers)
         Σ_j Σ_{k ∈ site} x_ijk ≤ 1                 ∀i,site (R > 1, site independence, unpinned)

Eq. (4) primary (or site) independence, the exclusion lists, pins, eq. (6) the latency SLO
and "never above the primary variant" (``policies/replica_rules.py``) are enforced by never
creating the forbidden columns (``warm_candidates``). Site independence unset in the config
is resolved per snapshot: on when two or more sites have a live server.

**Coverage first, accuracy second.** ``P = Σ_i R_i q_i + 1`` exceeds the largest accuracy
objective any plan can reach, so one more backup always beats any accuracy gain: the solver
maximises the number of backups placed, then effective accuracy. The slack makes every
instance feasible; apps with ``u_i > 0`` are reported as uncovered with a reason.

**Decomposition (method "decomposed", default).** The objective does not depend on the
server, so the hard part of the full MIP (which of ~100 interchangeable servers) carries no
value. An aggregate ILP chooses the variants: one integer z_ij per (app, variant) with
eq. (3), eq. (5) and the coverage penalty, and with per-server capacity (eq. 2) summed over
servers. It is a relaxation of the full model, so its optimum bounds the full optimum from
above. ``warm_packing`` then places the chosen backups (decreasing size; worst-fit, or
best-fit when worst-fit leaves some out), retries unpacked ones with smaller variants and
upgrades where room is left. The reported gap is certified against the aggregate bound. When
that gap exceeds ``mip_rel_gap`` on a small instance the full MIP is solved too and the
better plan kept, so small instances are solved exactly. Method "full" builds the full MIP.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pulp

from policies.actions import SolveStats, UncoveredApp, WarmAssignment, WarmPlan
from policies.config import WarmPlanConfig
from policies.errors import SolverFailedError
from policies.model import ClusterSnapshot
from policies.replica_rules import resolve_site_independent
from policies.resources import MEMORY_MB
from policies.solvers import SolverOptions, make_solver
from policies.warm_candidates import WarmProblem, build_warm_problem
from policies.warm_heuristic import plan_warm_heuristic
from policies.warm_packing import Packing, pack

logger = logging.getLogger(__name__)

MAX_REPACK_ROUNDS = 6
"""Aggregate ILP + packing rounds before the decomposed method keeps its best packing."""


@dataclass(frozen=True, slots=True)
class _Model:
    problem: pulp.LpProblem
    x: dict[int, pulp.LpVariable]
    u: list[pulp.LpVariable]
    penalty: float


@dataclass(frozen=True, slots=True)
class _Master:
    model: _Model
    z: dict[tuple[int, str], pulp.LpVariable]


@dataclass(frozen=True, slots=True)
class _Solved:
    chosen: list[int]
    solver_objective: float
    solver_bound: float | None
    status: str
    variables: int
    constraints: int
    solve_s: float


def plan_warm_backups(snapshot: ClusterSnapshot, config: WarmPlanConfig | None = None, *,
                      variant_filter: frozenset[str] | None = None,
                      clock: Callable[[], float] = time.perf_counter) -> WarmPlan:
    """Choose warm backups (variant and server) for every app in K.

    ``config.method`` "heuristic" (or "auto" on a large instance) runs FailLite Algorithm 1
    instead (``policies.warm_heuristic``); the plan's ``stats.method`` says which ran.
    ``clock`` only feeds the timings in the result; decisions never depend on it (beyond
    the solver's own time limit).
    """
    config = config or WarmPlanConfig()
    if uses_heuristic(snapshot, config):
        return plan_warm_heuristic(snapshot, config, clock=clock)
    if config.method == "auto":
        config = config.model_copy(update={"method": "decomposed"})
    started = clock()
    problem = build_warm_problem(snapshot, alpha=config.alpha, replicas=config.replicas,
                                 site_independent=resolve_site_independent(
                                     snapshot, config.site_independent),
                                 keep_current_bonus=config.keep_current_bonus,
                                 variant_filter=variant_filter)
    if not problem.apps:
        stats = SolveStats(method=config.method, solver=config.solver, status="empty",
                           objective=0.0, bound=0.0, gap=0.0, total_s=clock() - started)
        return WarmPlan((), _uncovered(problem, {}, snapshot, config.replicas), stats)

    if config.method == "full":
        model = _build_model(problem, range(len(problem.columns)))
        built = clock()
        solved = _solve(model, config, clock)
        notes = ["full MIP"]
    else:
        solved, model, notes = _solve_decomposed(problem, config, clock)
        # Model building and packing interleave with the solves: build = total - solver time.
        built = clock() - solved.solve_s
    return _to_plan(snapshot, problem, model.penalty, solved, config, notes,
                    build_s=built - started, total_s=clock() - started)


def uses_heuristic(snapshot: ClusterSnapshot, config: WarmPlanConfig) -> bool:
    """True when ``config`` sends this snapshot to the heuristic instead of the ILP."""
    if config.method != "auto":
        return config.method == "heuristic"
    critical = sum(1 for a in snapshot.apps if a.critical)
    return critical * len(snapshot.free) > config.auto_ilp_max_size


def _solve_decomposed(problem: WarmProblem, config: WarmPlanConfig,
                      clock: Callable[[], float]) -> tuple[_Solved, _Model, list[str]]:
    """Aggregate ILP for the variants, packing for the servers, exact MIP when small."""
    budget = list(problem.budget)
    memory = problem.resources.index(MEMORY_MB)
    bound: float | None = None
    best: tuple[Packing, _Master, _Solved] | None = None
    notes = []
    solve_s = 0.0
    for attempt in range(1, MAX_REPACK_ROUNDS + 1):
        master = _build_master(problem, budget)
        master_solved = _solve(master.model, config, clock)
        solve_s += master_solved.solve_s
        if attempt == 1:
            # Only the first master (the true budget) is a relaxation of the full model.
            bound = master_solved.solver_bound
        items = [(i, name) for (i, name), var in master.z.items()
                 for _ in range(round(var.varValue or 0.0))]
        packing = pack(problem, items, memory)
        notes.append(f"round {attempt}: aggregate ILP chose {len(items)} backups "
                     f"({master_solved.status}), packing placed {len(packing.chosen)}")
        if best is None or _better(problem, packing, best[0]):
            best = (packing, master, master_solved)
        shortfall = _unpacked_demand(problem, items, packing)
        if not any(shortfall):
            break
        # Fragmentation left backups out: ask the master for the same choice with less room.
        budget = [max(0.0, b - s) for b, s in zip(budget, shortfall, strict=True)]
    assert best is not None
    packing, master, master_solved = best
    uncovered = problem.total_wanted - len(packing.chosen)
    objective = packing.value(problem) - master.model.penalty * uncovered
    solved = _Solved(list(packing.chosen), objective, bound, master_solved.status,
                     master_solved.variables, master_solved.constraints, solve_s)
    model = master.model
    if (_gap(solved) > config.mip_rel_gap
            and len(problem.columns) <= config.exact_fallback_max_columns):
        full = _build_model(problem, range(len(problem.columns)))
        exact = _solve(full, config, clock)
        notes.append(f"gap {_gap(solved):.2e} above mip_rel_gap: full MIP solved too "
                     f"({exact.status})")
        keep = exact if exact.solver_objective > solved.solver_objective else solved
        bounds = [b for b in (solved.solver_bound, exact.solver_bound) if b is not None]
        solved = _Solved(keep.chosen, keep.solver_objective, min(bounds, default=None),
                         exact.status, exact.variables, exact.constraints,
                         solved.solve_s + exact.solve_s)
        model = full
    if solved.status != "time_limit":
        status = "optimal" if _gap(solved) <= config.mip_rel_gap + 1e-12 else "feasible"
        solved = replace(solved, status=status)
    return solved, model, notes


def _better(problem: WarmProblem, a: Packing, b: Packing) -> bool:
    return (len(a.chosen), a.value(problem)) > (len(b.chosen), b.value(problem))


def _unpacked_demand(problem: WarmProblem, items: Sequence[tuple[int, str]],
                     packing: Packing) -> list[float]:
    """Per resource, the demand of the chosen backups the packing had to leave out."""
    asked: dict[int, list[float]] = defaultdict(lambda: [0.0] * len(problem.resources))
    for item in items:
        first = problem.columns_by_item[item][0]
        for r, d in enumerate(problem.columns[first].demand):
            asked[item[0]][r] += d
    for n in packing.chosen:
        for r, d in enumerate(problem.columns[n].demand):
            asked[problem.columns[n].app][r] -= d
    return [sum(max(0.0, v[r]) for v in asked.values()) for r in range(len(problem.resources))]


def _gap(solved: _Solved) -> float:
    if solved.solver_bound is None:
        return math.inf
    return max(0.0, solved.solver_bound - solved.solver_objective) / max(
        abs(solved.solver_bound), 1e-9)


# --- model building ------------------------------------------------------------------------


def _coverage_penalty(problem: WarmProblem) -> float:
    """P: above any accuracy objective (values carry at most a 10 % keep-current bonus)."""
    return sum(r * a.max_rate_rps for r, a in zip(problem.wanted, problem.apps,
                                                  strict=True)) * 1.1 + 1.0


def _build_model(problem: WarmProblem, columns: Sequence[int]) -> _Model:
    """The full PuLP model over the given column indices (see the module docstring)."""
    model = pulp.LpProblem("warm_backups", pulp.LpMaximize)
    x = {n: pulp.LpVariable(f"x{n}", 0, 1, pulp.LpBinary) for n in columns}
    u = [pulp.LpVariable(f"u{i}", 0, r) for i, r in enumerate(problem.wanted)]
    penalty = _coverage_penalty(problem)
    objective = [(x[n], problem.columns[n].value) for n in columns]
    objective += [(var, -penalty) for var in u]
    model.setObjective(pulp.LpAffineExpression(objective))

    by_app: dict[int, list[int]] = defaultdict(list)
    by_server: dict[int, list[int]] = defaultdict(list)
    for n in columns:
        column = problem.columns[n]
        by_app[column.app].append(n)
        by_server[column.server].append(n)
    for i, want in enumerate(problem.wanted):
        terms = [(x[n], 1.0) for n in by_app.get(i, ())] + [(u[i], 1.0)]
        model.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms),
                                              pulp.LpConstraintEQ, f"app{i}", want))
        if want > 1:
            _add_spread_rows(model, problem, x, i, by_app.get(i, []))
    for k, members in by_server.items():
        for r, cap in enumerate(problem.capacity[k]):
            if sum(problem.columns[n].demand[r] for n in members) > cap:
                _add_le(model, [(x[n], problem.columns[n].demand[r]) for n in members],
                        f"cap{k}_{r}", cap)
    for r, budget in enumerate(problem.budget):
        if sum(problem.columns[n].demand[r] for n in columns) > budget:
            _add_le(model, [(x[n], problem.columns[n].demand[r]) for n in columns],
                    f"budget{r}", budget)
    return _Model(model, x, u, penalty)


def _add_spread_rows(model: pulp.LpProblem, problem: WarmProblem, x: dict[int, pulp.LpVariable],
                     app: int, members: Sequence[int]) -> None:
    """An app's several backups go to distinct servers (and distinct sites when required)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for n in members:
        server = problem.servers[problem.columns[n].server]
        groups[f"one{app}_{problem.columns[n].server}"].append(n)
        if problem.spread_sites[app]:
            groups[f"site{app}_{server.site_id}"].append(n)
    for name, group in groups.items():
        if len(group) > 1:
            _add_le(model, [(x[n], 1.0) for n in group], name, 1.0)


def _add_le(model: pulp.LpProblem, terms: list[tuple[pulp.LpVariable, float]], name: str,
            rhs: float) -> None:
    model.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms),
                                          pulp.LpConstraintLE, name, rhs))


def _build_master(problem: WarmProblem, budget: Sequence[float]) -> _Master:
    """The aggregate ILP: which variant (and how many copies) each app gets, not where."""
    model = pulp.LpProblem("warm_variants", pulp.LpMaximize)
    groups = problem.columns_by_item
    spread: dict[int, int] = {}
    for i, members in problem.columns_by_app.items():
        servers = {problem.columns[n].server for n in members}
        sites = {problem.servers[k].site_id for k in servers}
        spread[i] = len(sites) if problem.spread_sites[i] else len(servers)
    z: dict[tuple[int, str], pulp.LpVariable] = {}
    for (i, name), members in groups.items():
        distinct = len({problem.columns[n].server for n in members})
        upper = min(problem.wanted[i], distinct)
        category = pulp.LpBinary if upper == 1 else pulp.LpInteger
        z[(i, name)] = pulp.LpVariable(f"z{i}_{len(z)}", 0, upper, category)
    u = [pulp.LpVariable(f"u{i}", 0, r) for i, r in enumerate(problem.wanted)]
    penalty = _coverage_penalty(problem)
    objective = [(var, max(problem.columns[n].value for n in groups[key]))
                 for key, var in z.items()]
    model.setObjective(pulp.LpAffineExpression(objective + [(var, -penalty) for var in u]))
    by_app: dict[int, list[pulp.LpVariable]] = defaultdict(list)
    for (i, _), var in z.items():
        by_app[i].append(var)
    for i, want in enumerate(problem.wanted):
        terms = [(var, 1.0) for var in by_app.get(i, [])]
        model.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms + [(u[i], 1.0)]),
                                              pulp.LpConstraintEQ, f"app{i}", want))
        if want > 1 and terms:
            _add_le(model, terms, f"spread{i}", float(spread[i]))
    total_capacity = [sum(c[r] for c in problem.capacity) for r in range(len(problem.resources))]
    for r, share in enumerate(budget):
        limit = min(share, total_capacity[r])
        terms = [(var, problem.columns[groups[key][0]].demand[r]) for key, var in z.items()]
        if sum(coef * (var.upBound or 0) for var, coef in terms) > limit:
            _add_le(model, terms, f"budget{r}", limit)
    return _Master(_Model(model, {}, u, penalty), z)


# --- solving -------------------------------------------------------------------------------


def _solve(model: _Model, config: WarmPlanConfig, clock: Callable[[], float]) -> _Solved:
    options = SolverOptions(config.time_limit_s, config.mip_rel_gap, config.threads)
    solver = make_solver(config.solver, options)
    started = clock()
    model.problem.solve(solver)
    elapsed = clock() - started
    if model.problem.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise SolverFailedError(
            f"{solver.name} returned {pulp.LpStatus[model.problem.status]} without a solution "
            f"(time limit {config.time_limit_s:g} s)")
    chosen = [n for n, var in model.x.items() if (var.varValue or 0.0) > 0.5]
    objective = pulp.value(model.problem.objective) or 0.0
    status = "optimal" if model.problem.sol_status == pulp.LpSolutionOptimal else "time_limit"
    bound = _solver_bound(model.problem, solver)
    if bound is None and status == "optimal":
        # The backend exposes no dual bound: its optimum within the relative gap is one.
        bound = objective + config.mip_rel_gap * abs(objective)
    return _Solved(chosen, objective, bound, status, len(model.x) + len(model.u),
                   len(model.problem.constraints), elapsed)


def _solver_bound(problem: pulp.LpProblem, solver: pulp.LpSolver) -> float | None:
    """The MIP dual bound where the backend exposes it (HiGHS), else None."""
    highs_model = getattr(problem, "solverModel", None)
    if solver.name != "HiGHS" or highs_model is None:
        return None
    bound = highs_model.getInfo().mip_dual_bound
    # PuLP's HiGHS interface minimises the negated objective.
    return -bound if math.isfinite(bound) else None


# --- result --------------------------------------------------------------------------------


def _to_plan(snapshot: ClusterSnapshot, problem: WarmProblem, penalty: float, solved: _Solved,
             config: WarmPlanConfig, notes: list[str], *, build_s: float,
             total_s: float) -> WarmPlan:
    assignments = []
    placed: dict[str, int] = defaultdict(int)
    ordered = sorted(solved.chosen,
                     key=lambda m: (problem.columns[m].app, problem.columns[m].server))
    for n in ordered:
        column = problem.columns[n]
        app = problem.apps[column.app]
        placed[app.app_id] += 1
        assignments.append(WarmAssignment(app.app_id, problem.servers[column.server].server_id,
                                          column.variant.name, column.variant.accuracy))
    accuracy_objective = sum(a.accuracy * snapshot.app_by_id[a.app_id].max_rate_rps
                             for a in assignments)
    uncovered_backups = problem.total_wanted - len(assignments)
    bound = gap = None
    if solved.solver_bound is not None:
        # Plans at least as well covered as this one have accuracy <= solver bound + P*U.
        bound = solved.solver_bound + penalty * uncovered_backups
        gap = _gap(solved)
    stats = SolveStats(
        method=config.method, solver=config.solver, status=solved.status,
        objective=accuracy_objective, bound=bound, gap=gap, variables=solved.variables,
        constraints=solved.constraints, build_s=build_s, solve_s=solved.solve_s,
        total_s=total_s, notes=tuple(notes))
    logger.info("warm plan: %d backups for %d apps, %d uncovered backups, objective %.3f, "
                "gap %s, %.3f s", len(assignments), len(problem.apps), uncovered_backups,
                accuracy_objective, gap, total_s)
    return WarmPlan(tuple(assignments), _uncovered(problem, placed, snapshot, config.replicas),
                    stats)


def _uncovered(problem: WarmProblem, placed: dict[str, int], snapshot: ClusterSnapshot,
               replicas: int) -> tuple[UncoveredApp, ...]:
    out = []
    for app, want in zip(problem.apps, problem.wanted, strict=True):
        got = placed.get(app.app_id, 0)
        if got < want:
            reason = problem.unplaceable.get(
                app.app_id, "capacity: the warm budget ((1 - alpha) share) or the servers' "
                            "free capacity is exhausted; apps covered were maximised first")
            out.append(UncoveredApp(app.app_id, want, got, reason))
    listed = {a.app_id for a in problem.apps}
    for app_id, reason in sorted(problem.unplaceable.items()):
        if app_id not in listed:
            app = snapshot.app_by_id[app_id]
            want = app.backups_wanted(replicas)
            out.append(UncoveredApp(app_id, want, 0, reason))
    return tuple(out)
