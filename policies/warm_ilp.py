"""Warm-backup selection and placement: FailLite eq. (1)-(7) with §3.4's extensions, in PuLP.

Model (for the apps in K that have a live primary; x binary, u continuous slack)::

    max  Σ a_ij q_i x_ijk  −  P Σ_i u_i
    s.t. Σ_jk x_ijk + u_i = R_i                     ∀i     (eq. 5, R backups, slack u_i)
         Σ_ij d^r_ij x_ijk ≤ c^r_k                  ∀k,r   (eq. 2)
         Σ_ijk d^r_ij x_ijk ≤ (1 − α) Σ_k c^r_k     ∀r     (eq. 3)
         Σ_j x_ijk ≤ 1                              ∀i,k   (R > 1: backups on distinct servers)
         Σ_j Σ_{k ∈ site} x_ijk ≤ 1                 ∀i,site (R > 1 and site independence)

Eq. (4) primary (or site) independence, the exclusion lists and eq. (6) the latency SLO are
enforced by never creating the forbidden columns (``warm_candidates``).

**Coverage first, accuracy second.** ``P = Σ_i R_i q_i + 1`` exceeds the largest accuracy
objective any plan can reach, so one more backup always beats any accuracy gain: the solver
maximises the number of backups placed, then effective accuracy. The slack makes every
instance feasible; apps with ``u_i > 0`` are reported as uncovered with a reason.

**Column generation (method "colgen", default).** The objective does not depend on the
server, so most of the app x variant x server columns are interchangeable. We start from a
few columns per (app, variant) — the servers with the most free memory, plus the best one
per site — solve the LP relaxation, price every omitted column with the LP duals and add
those with positive reduced cost, until none is left. The final LP optimum is then the LP
optimum of the full model, a valid upper bound; the MIP is solved over the generated
columns only and its gap is reported against that bound. Method "full" builds every
pruned column (the reference, and the fallback for tiny instances).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pulp

from policies.actions import SolveStats, UncoveredApp, WarmAssignment, WarmPlan
from policies.config import WarmPlanConfig
from policies.errors import SolverFailedError
from policies.model import ClusterSnapshot
from policies.resources import MEMORY_MB
from policies.solvers import SolverOptions, dual_sign, make_solver
from policies.warm_candidates import Column, WarmProblem, build_warm_problem

logger = logging.getLogger(__name__)

INITIAL_SERVERS_PER_VARIANT = 4
"""Columns per (app, variant) before pricing: the freest servers (plus the best per site)."""

MAX_PRICING_ROUNDS = 30
COLUMNS_PER_APP_PER_ROUND = 4
_RC_TOL = 1e-7


@dataclass(frozen=True, slots=True)
class _Model:
    problem: pulp.LpProblem
    x: dict[int, pulp.LpVariable]
    u: list[pulp.LpVariable]
    penalty: float


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

    ``clock`` only feeds the timings in the result; decisions never depend on it (beyond
    the solver's own time limit).
    """
    config = config or WarmPlanConfig()
    started = clock()
    problem = build_warm_problem(snapshot, alpha=config.alpha, replicas=config.replicas,
                                 site_independent=config.site_independent,
                                 keep_current_bonus=config.keep_current_bonus,
                                 variant_filter=variant_filter)
    if not problem.apps:
        stats = SolveStats(method=config.method, solver=config.solver, status="empty",
                           objective=0.0, bound=0.0, gap=0.0, total_s=clock() - started)
        return WarmPlan((), _uncovered(problem, {}, snapshot, config.replicas), stats)

    notes: list[str] = []
    lp_bound: float | None = None
    if config.method == "colgen":
        columns, lp_bound, rounds, complete = _generate_columns(problem, config, clock)
        notes.append(f"column generation: {len(columns)} of {len(problem.columns)} columns, "
                     f"{rounds} pricing rounds, "
                     + ("pricing complete (LP bound is global)" if complete
                        else "pricing stopped early (bound from reduced costs)"))
    else:
        columns = list(range(len(problem.columns)))
    built = clock()
    model = _build_model(problem, columns, relax=False)
    solved = _solve(model, config, clock, mip=True)
    return _to_plan(snapshot, problem, model, solved, lp_bound, config, notes,
                    build_s=built - started, total_s=clock() - started)


# --- model building ------------------------------------------------------------------------


def _build_model(problem: WarmProblem, columns: Sequence[int], *, relax: bool) -> _Model:
    """The PuLP model over the given column indices (see the module docstring)."""
    category = pulp.LpContinuous if relax else pulp.LpBinary
    model = pulp.LpProblem("warm_backups", pulp.LpMaximize)
    x = {n: pulp.LpVariable(f"x{n}", 0, 1, category) for n in columns}
    u = [pulp.LpVariable(f"u{i}", 0, r) for i, r in enumerate(problem.wanted)]
    penalty = sum(r * a.max_rate_rps for r, a in zip(problem.wanted, problem.apps,
                                                     strict=True)) * 1.1 + 1.0
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
        if problem.site_independent:
            groups[f"site{app}_{server.site_id}"].append(n)
    for name, group in groups.items():
        if len(group) > 1:
            _add_le(model, [(x[n], 1.0) for n in group], name, 1.0)


def _add_le(model: pulp.LpProblem, terms: list[tuple[pulp.LpVariable, float]], name: str,
            rhs: float) -> None:
    model.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms),
                                          pulp.LpConstraintLE, name, rhs))


# --- solving -------------------------------------------------------------------------------


def _solve(model: _Model, config: WarmPlanConfig, clock: Callable[[], float], *,
           mip: bool) -> _Solved:
    options = SolverOptions(config.time_limit_s, config.mip_rel_gap, config.threads)
    solver = make_solver(config.solver if mip else "highs", options, mip=mip)
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
    bound = _solver_bound(model.problem, solver) if mip else objective
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


# --- column generation ---------------------------------------------------------------------


def _initial_columns(problem: WarmProblem) -> set[int]:
    """Per (app, variant): the freest servers plus the freest server of every site."""
    rank = sorted(range(len(problem.servers)),
                  key=lambda k: (-problem.capacity[k][problem.resources.index(MEMORY_MB)], k))
    position = {k: p for p, k in enumerate(rank)}
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for n, column in enumerate(problem.columns):
        groups[(column.app, column.variant.name)].append(n)
    chosen: set[int] = set()
    for members in groups.values():
        members.sort(key=lambda n: position[problem.columns[n].server])
        chosen.update(members[:INITIAL_SERVERS_PER_VARIANT])
        seen_sites: set[str] = set()
        for n in members:
            site = problem.servers[problem.columns[n].server].site_id
            if site not in seen_sites:
                seen_sites.add(site)
                chosen.add(n)
    return chosen


def _generate_columns(problem: WarmProblem, config: WarmPlanConfig,
                      clock: Callable[[], float]) -> tuple[list[int], float, int, bool]:
    """Grow the column set until no omitted column has a positive reduced cost.

    Returns the columns, an upper bound on the full LP optimum, the rounds run and whether
    pricing completed (then the bound is the full LP optimum itself).
    """
    active = _initial_columns(problem)
    sign = dual_sign("highs")
    for round_no in range(1, MAX_PRICING_ROUNDS + 1):
        model = _build_model(problem, sorted(active), relax=True)
        solved = _solve(model, config, clock, mip=False)
        duals = {name: sign * (c.pi or 0.0) for name, c in model.problem.constraints.items()}
        best: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for n, column in enumerate(problem.columns):
            if n in active:
                continue
            rc = _reduced_cost(problem, column, duals)
            if rc > _RC_TOL:
                best[column.app].append((rc, n))
        if not best:
            return sorted(active), solved.solver_objective, round_no, True
        if round_no == MAX_PRICING_ROUNDS:
            bound = solved.solver_objective + sum(
                min(problem.wanted[i] * max(rc for rc, _ in cands), sum(rc for rc, _ in cands))
                for i, cands in best.items())
            return sorted(active), bound, round_no, False
        for cands in best.values():
            cands.sort(reverse=True)
            active.update(n for _, n in cands[:COLUMNS_PER_APP_PER_ROUND])
    raise AssertionError("unreachable")


def _reduced_cost(problem: WarmProblem, column: Column, duals: dict[str, float]) -> float:
    k = column.server
    rc = column.value - duals.get(f"app{column.app}", 0.0)
    for r, amount in enumerate(column.demand):
        if amount:
            rc -= amount * (duals.get(f"cap{k}_{r}", 0.0) + duals.get(f"budget{r}", 0.0))
    if problem.wanted[column.app] > 1:
        rc -= duals.get(f"one{column.app}_{k}", 0.0)
        if problem.site_independent:
            rc -= duals.get(f"site{column.app}_{problem.servers[k].site_id}", 0.0)
    return rc


# --- result --------------------------------------------------------------------------------


def _to_plan(snapshot: ClusterSnapshot, problem: WarmProblem, model: _Model, solved: _Solved,
             lp_bound: float | None, config: WarmPlanConfig, notes: list[str], *,
             build_s: float, total_s: float) -> WarmPlan:
    assignments = []
    placed: dict[str, int] = defaultdict(int)
    for n in sorted(solved.chosen, key=lambda n: (problem.columns[n].app, problem.columns[n].server)):
        column = problem.columns[n]
        app = problem.apps[column.app]
        placed[app.app_id] += 1
        assignments.append(WarmAssignment(app.app_id, problem.servers[column.server].server_id,
                                          column.variant.name, column.variant.accuracy))
    accuracy_objective = sum(a.accuracy * snapshot.app_by_id[a.app_id].max_rate_rps
                             for a in assignments)
    uncovered_backups = problem.total_wanted - len(assignments)
    bounds = [b for b in (solved.solver_bound, lp_bound) if b is not None]
    solver_bound = min(bounds) if bounds else None
    bound = gap = None
    if solver_bound is not None:
        bound = solver_bound + model.penalty * uncovered_backups
        denominator = max(abs(solver_bound), 1e-9)
        gap = max(0.0, (solver_bound - solved.solver_objective) / denominator)
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
            want = app.warm_replicas if app.warm_replicas is not None else replicas
            out.append(UncoveredApp(app_id, want, 0, reason))
    return tuple(out)
