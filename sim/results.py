"""Aggregating unit results: per-seed and pooled summaries, lookups for the paper comparison.

Pooled means: the metrics recomputed over every scenario of every seed (not a mean of means).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sim.experiments import EXPERIMENTS, ParamValue, PolicyResult, UnitResult
from sim.metrics import Summary, summarize
from sim.paper import Lookup

ALL_SEEDS = "all"


@dataclass(frozen=True, slots=True)
class Row:
    """One (experiment, value, policy, seed or "all") summary with the cluster it ran on."""

    experiment: str
    value: ParamValue
    policy: str
    seed: int | str
    apps: float
    servers: float
    critical: float
    memory_utilisation: float
    compute_utilisation: float
    warm_method: str
    warm_backups: float
    warm_uncovered: float
    preempted: int
    summary: Summary


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def rows(results: Sequence[UnitResult]) -> list[Row]:
    """Per-seed rows, then one pooled row per (experiment, value, policy), in run order."""
    groups: dict[tuple[str, ParamValue, str], list[tuple[UnitResult, PolicyResult]]] = \
        defaultdict(list)
    out: list[Row] = []
    for unit in results:
        for result in unit.policies:
            groups[(unit.experiment, unit.value, result.policy)].append((unit, result))
            out.append(_row(unit.experiment, unit.value, result.policy, unit.seed,
                            [(unit, result)]))
    for (experiment, value, policy), members in groups.items():
        out.append(_row(experiment, value, policy, ALL_SEEDS, members))
    return out


def _row(experiment: str, value: ParamValue, policy: str, seed: int | str,
         members: Sequence[tuple[UnitResult, PolicyResult]]) -> Row:
    units = [u for u, _ in members]
    results = [p for _, p in members]
    methods = sorted({p.warm_method for p in results})
    scenarios = [s for p in results for s in p.scenarios]
    return Row(
        experiment, value, policy, seed,
        apps=_mean([u.apps for u in units]), servers=_mean([u.servers for u in units]),
        critical=_mean([u.critical for u in units]),
        memory_utilisation=_mean([u.memory_utilisation for u in units]),
        compute_utilisation=_mean([u.compute_utilisation for u in units]),
        warm_method="/".join(methods),
        warm_backups=_mean([p.warm_backups for p in results]),
        warm_uncovered=_mean([p.warm_uncovered for p in results]),
        preempted=sum(s.preempted for s in scenarios),
        summary=summarize(s.outcomes for s in scenarios))


def pooled(all_rows: Sequence[Row], experiment: str) -> dict[tuple[str, ParamValue], Row]:
    """The pooled rows of ``experiment`` by (policy, value)."""
    return {(r.policy, r.value): r for r in all_rows
            if r.experiment == experiment and r.seed == ALL_SEEDS}


_PERCENT = {"recovery_rate", "recovery_rate_min", "recovery_rate_pooled"}


def metric(row: Row, name: str) -> float | None:
    """A row's metric as the report shows it (rates in %)."""
    if name in ("apps", "servers", "critical", "warm_backups"):
        return float(getattr(row, name))
    value = getattr(row.summary, name)
    if value is None:
        return None
    return 100.0 * value if name in _PERCENT else float(value)


def lookup(results: Sequence[UnitResult], all_rows: Sequence[Row], experiment: str) -> Lookup:
    """The ``Lookup`` the paper claims of ``experiment`` read our numbers through."""
    table = pooled(all_rows, experiment)
    if experiment == "fig13":
        runtime: dict[tuple[str, int], list[float]] = defaultdict(list)
        for unit in results:
            for point in unit.scale:
                key = (point.axis, {"apps": point.apps, "servers": point.servers,
                                    "variants": point.variants}[point.axis])
                runtime[key].append(point.heuristic_ms)

        def scale_lookup(policy: str, value: object, name: str) -> float | None:
            del policy, name
            found = runtime.get(value)  # type: ignore[call-overload]
            return max(found) if found else None
        return scale_lookup

    def find(policy: str, value: object, name: str) -> float | None:
        row = table.get((policy, value))  # type: ignore[arg-type]
        return None if row is None else metric(row, name)
    return find


def experiments_in(results: Sequence[UnitResult]) -> list[str]:
    """The experiments present, in paper order."""
    present = {u.experiment for u in results}
    return [name for name in EXPERIMENTS if name in present]
