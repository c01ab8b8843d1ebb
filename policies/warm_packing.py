"""Packing a chosen set of warm backups onto servers, repairing what does not fit.

The decomposed warm planner first decides *which* variant each app in K gets (an aggregate
ILP that ignores the split of capacity across servers), then this module decides *where*:
decreasing-size packing (worst-fit, then best-fit if worst-fit leaves items out), a repair
step that retries an unpacked backup with smaller variants, and an upgrade pass that spends
capacity left on a server on more accurate variants. Pure functions over ``WarmProblem``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.warm_candidates import WarmProblem

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Packing:
    """Chosen column indices and the backups asked for that found no room."""

    chosen: tuple[int, ...]
    unpacked: int

    def value(self, problem: WarmProblem) -> float:
        return sum(problem.columns[n].value for n in self.chosen)


class _State:
    """Remaining capacity, remaining warm budget and per-app spread while packing."""

    def __init__(self, problem: WarmProblem) -> None:
        self.problem = problem
        self.room = [list(c) for c in problem.capacity]
        self.budget = list(problem.budget)
        self.servers_of: dict[int, set[int]] = defaultdict(set)
        self.sites_of: dict[int, set[str]] = defaultdict(set)
        self.chosen: list[int] = []

    def allowed(self, n: int) -> bool:
        column = self.problem.columns[n]
        if column.server in self.servers_of[column.app]:
            return False
        site = self.problem.servers[column.server].site_id
        if self.problem.spread_sites[column.app] and site in self.sites_of[column.app]:
            return False
        room = self.room[column.server]
        return all(d <= room[r] + _EPS and d <= self.budget[r] + _EPS
                   for r, d in enumerate(column.demand))

    def take(self, n: int) -> None:
        column = self.problem.columns[n]
        for r, d in enumerate(column.demand):
            self.room[column.server][r] -= d
            self.budget[r] -= d
        self.servers_of[column.app].add(column.server)
        self.sites_of[column.app].add(self.problem.servers[column.server].site_id)
        self.chosen.append(n)

    def release(self, n: int) -> None:
        column = self.problem.columns[n]
        for r, d in enumerate(column.demand):
            self.room[column.server][r] += d
            self.budget[r] += d
        self.servers_of[column.app].discard(column.server)
        self.sites_of[column.app].discard(self.problem.servers[column.server].site_id)
        self.chosen.remove(n)


def pack(problem: WarmProblem, items: Sequence[tuple[int, str]], memory_index: int) -> Packing:
    """Place ``items`` (app index, variant name), one backup each; the better of two orders.

    Worst-fit keeps free memory balanced for cold failover; best-fit packs tighter. We try
    worst-fit first and use best-fit only when worst-fit leaves something out.
    """
    columns_by_item = problem.columns_by_item
    best: Packing | None = None
    for strategy in ("worst", "best"):
        state = _State(problem)
        unpacked = _place_all(state, items, columns_by_item, memory_index, strategy)
        unpacked = _repair(state, unpacked, memory_index)
        _upgrade(state)
        packing = Packing(tuple(state.chosen), len(unpacked))
        if best is None or (packing.unpacked, -packing.value(problem)) < (
                best.unpacked, -best.value(problem)):
            best = packing
        if best.unpacked == 0:
            break
    assert best is not None
    return best


def _place_all(state: _State, items: Sequence[tuple[int, str]],
               columns_by_item: dict[tuple[int, str], list[int]], memory_index: int,
               strategy: str) -> list[tuple[int, str]]:
    problem = state.problem

    def size(item: tuple[int, str]) -> float:
        first = columns_by_item[item][0]
        return problem.columns[first].demand[memory_index]

    unpacked = []
    for item in sorted(items, key=lambda it: (-size(it), it)):
        n = _choose(state, columns_by_item[item], memory_index, strategy)
        if n is None:
            unpacked.append(item)
        else:
            state.take(n)
    return unpacked


def _choose(state: _State, candidates: Sequence[int], memory_index: int,
            strategy: str) -> int | None:
    """The column to use among ``candidates``: a kept current backup first, then by fit."""
    problem = state.problem
    feasible = [n for n in candidates if state.allowed(n)]
    if not feasible:
        return None

    def key(n: int) -> tuple[float, float, int]:
        column = problem.columns[n]
        room = state.room[column.server][memory_index]
        fit = -room if strategy == "worst" else room
        return (-column.value, fit, column.server)

    # The value only differs between servers through the keep-current bonus.
    return min(feasible, key=key)


def _repair(state: _State, unpacked: list[tuple[int, str]],
            memory_index: int) -> list[tuple[int, str]]:
    """Retry each unpacked backup with any variant of its app, most valuable first."""
    problem = state.problem
    still: list[tuple[int, str]] = []
    for app, variant in unpacked:
        candidates = sorted(problem.columns_by_app[app], key=lambda m: -problem.columns[m].value)
        choice = _choose(state, candidates, memory_index, "worst")
        if choice is None:
            still.append((app, variant))
        else:
            state.take(choice)
    return still


def _upgrade(state: _State) -> None:
    """Swap chosen backups for more valuable variants on the same server while room allows."""
    problem = state.problem
    improved = True
    while improved:
        improved = False
        for n in sorted(state.chosen, key=lambda n: problem.columns[n].value):
            column = problem.columns[n]
            better = sorted((m for m in problem.columns_by_app_server[(column.app, column.server)]
                             if problem.columns[m].value > column.value + _EPS),
                            key=lambda m: -problem.columns[m].value)
            if not better:
                continue
            state.release(n)
            for m in better:
                if state.allowed(m):
                    state.take(m)
                    improved = True
                    break
            else:
                state.take(n)
