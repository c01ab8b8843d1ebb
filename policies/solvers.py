"""The one place that turns a solver name into a configured PuLP solver."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pulp

from policies.config import SolverName
from policies.errors import SolverUnavailableError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """Limits shared by every backend."""

    time_limit_s: float
    mip_rel_gap: float
    threads: int | None = None


def make_solver(name: SolverName, options: SolverOptions, *, mip: bool = True) -> pulp.LpSolver:
    """A ready PuLP solver; raises ``SolverUnavailableError`` with a hint when it cannot run."""
    common = {"msg": False, "timeLimit": options.time_limit_s, "mip": mip}
    solver: pulp.LpSolver
    if name == "highs":
        solver = pulp.HiGHS(gapRel=options.mip_rel_gap, threads=options.threads, **common)
    elif name == "cbc":
        solver = pulp.PULP_CBC_CMD(gapRel=options.mip_rel_gap, threads=options.threads, **common)
    elif name == "gurobi":
        solver = pulp.GUROBI(gapRel=options.mip_rel_gap, **common)
        if options.threads is not None:
            solver.optionsDict["Threads"] = options.threads
    else:
        raise SolverUnavailableError(f"unknown solver {name!r}; choose highs, cbc or gurobi")
    if not solver.available():
        hint = {"highs": "pip install highspy",
                "cbc": "PuLP's bundled CBC binary is missing",
                "gurobi": "pip install 'understudy-edge[gurobi]' and install a licence"}[name]
        raise SolverUnavailableError(f"solver {name!r} is not available here ({hint})")
    return solver


def dual_sign(name: SolverName) -> float:
    """Factor turning PuLP's reported row duals into duals of our maximisation problem.

    PuLP's HiGHS interface minimises the negated objective, so HiGHS's duals come back with
    the opposite sign; CBC and Gurobi report them for the problem as stated.
    """
    return -1.0 if name == "highs" else 1.0
