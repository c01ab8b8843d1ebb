"""Writing the results: CSV per experiment, the PNG plots, report.md and the JSON summary.

``summary.csv`` and ``scenarios.csv`` hold only simulated quantities, formatted with fixed
precision, so the same seeds give byte-identical files. Wall-clock figures (ILP and plan
times, Fig. 13's runtimes) go to ``timings.csv`` / ``runtime.csv`` and the report only.
"""

from __future__ import annotations

import csv
import io
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.cluster import CALIBRATED, MixKnobs
from sim.experiments import EXPERIMENTS, UnitResult
from sim.metrics import summarize
from sim.paper import BASELINES, CLAIMS, FC, FW, FWK, U
from sim.plots import LABELS, plot_experiment
from sim.results import ALL_SEEDS, Row, experiments_in, lookup, metric, pooled, rows
from sim.timing import Timing

SUMMARY_FIELDS = ("recovery_rate", "recovery_rate_min", "recovery_rate_pooled", "mttr_mean_ms",
                  "mttr_p50_ms", "mttr_p99_ms", "e2e_mean_ms", "settled_mean_ms",
                  "accuracy_reduction_pct", "accuracy_reduction_max_pct")


def _fmt(value: float | int | str | None, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def param_text(value: object) -> str:
    """A parameter value as text: floats without trailing zeros (0.1, not 0.100)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _csv(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body)
    return buffer.getvalue()


def summary_csv(all_rows: Sequence[Row], experiment: str) -> str:
    """Per-seed and pooled summaries of ``experiment`` (rates and accuracy in %, times in ms)."""
    param = EXPERIMENTS[experiment].param
    header = ["experiment", param, "policy", "seed", "apps", "servers", "critical",
              "memory_utilisation_pct", "compute_utilisation_pct", "warm_method",
              "warm_backups", "warm_uncovered", "scenarios", "affected", "recovered",
              *(f"{f}_pct" if f.startswith("recovery") else f for f in SUMMARY_FIELDS),
              "warm", "progressive", "cold", "lost", "preempted"]
    body = []
    for row in all_rows:
        if row.experiment != experiment:
            continue
        s = row.summary
        body.append([experiment, param_text(row.value), row.policy, str(row.seed),
                     _fmt(row.apps, 1), _fmt(row.servers, 1), _fmt(row.critical, 1),
                     _fmt(100 * row.memory_utilisation, 2),
                     _fmt(100 * row.compute_utilisation, 2), row.warm_method,
                     _fmt(row.warm_backups, 1), _fmt(row.warm_uncovered, 1), str(s.scenarios),
                     str(s.affected), str(s.recovered),
                     *(_fmt(metric(row, f), 4) for f in SUMMARY_FIELDS),
                     str(s.warm), str(s.progressive), str(s.cold), str(s.lost),
                     str(row.preempted)])
    return _csv(header, body)


def scenarios_csv(results: Sequence[UnitResult], experiment: str) -> str:
    """One line per (seed, value, policy, failure scenario)."""
    param = EXPERIMENTS[experiment].param
    header = ["experiment", param, "policy", "seed", "scenario", "failed_servers", "affected",
              "warm", "progressive", "cold", "lost", "recovery_rate_pct", "mttr_mean_ms",
              "mttr_max_ms", "accuracy_reduction_pct", "preempted"]
    body = []
    for unit in results:
        if unit.experiment != experiment:
            continue
        for policy in unit.policies:
            for record in policy.scenarios:
                s = summarize([record.outcomes])
                mttr = [o.mttr_ms for o in record.outcomes if o.mttr_ms is not None]
                body.append([experiment, param_text(unit.value), policy.policy, str(unit.seed),
                             record.name, str(record.failed_servers), str(s.affected),
                             str(s.warm), str(s.progressive), str(s.cold), str(s.lost),
                             _fmt(100 * s.recovery_rate, 4), _fmt(s.mttr_mean_ms),
                             _fmt(max(mttr, default=None)), _fmt(s.accuracy_reduction_pct, 4),
                             str(record.preempted)])
    return _csv(header, body)


def timings_csv(results: Sequence[UnitResult], experiment: str) -> str:
    """Wall-clock times: the warm step per policy and the failover decisions (not reproducible)."""
    param = EXPERIMENTS[experiment].param
    if experiment == "fig13":
        header = ["axis", "apps", "servers", "variants", "seed", "heuristic_ms",
                  "plan_failover_ms", "recovered", "demand_ratio"]
        body = [[p.axis, str(p.apps), str(p.servers), str(p.variants), str(p.seed),
                 _fmt(p.heuristic_ms), _fmt(p.plan_failover_ms), str(p.recovered),
                 _fmt(p.demand_ratio, 4)] for u in results if u.experiment == experiment
                for p in u.scale]
        return _csv(header, body)
    header = [param, "policy", "seed", "warm_method", "warm_total_s", "plan_mean_ms",
              "plan_max_ms"]
    body = []
    for unit in results:
        if unit.experiment != experiment:
            continue
        for p in unit.policies:
            walls = [1000 * s.plan_wall_s for s in p.scenarios]
            body.append([param_text(unit.value), p.policy, str(unit.seed), p.warm_method,
                         _fmt(p.warm_total_s), _fmt(sum(walls) / len(walls) if walls else None),
                         _fmt(max(walls, default=None))])
    return _csv(header, body)


def json_summary(all_rows: Sequence[Row], results: Sequence[UnitResult]) -> dict[str, object]:
    """Per experiment, policy and parameter value: recovery rate, mean MTTR, accuracy loss."""
    out: dict[str, object] = {}
    for name in experiments_in(results):
        if name == "fig13":
            look = lookup(results, all_rows, name)
            out[name] = {"heuristic_ms_max": {
                f"{axis}={n}": round(v, 3) for axis, n in
                sorted({(p.axis, _axis_n(p)) for u in results for p in u.scale})
                if (v := look("heuristic", (axis, n), "runtime_ms")) is not None}}
            continue
        table: dict[str, dict[str, dict[str, float | None]]] = {}
        for (policy, value), row in pooled(all_rows, name).items():
            table.setdefault(policy, {})[param_text(value)] = {
                "recovery_rate_pct": _round(metric(row, "recovery_rate")),
                "mttr_mean_ms": _round(metric(row, "mttr_mean_ms")),
                "accuracy_reduction_pct": _round(metric(row, "accuracy_reduction_pct"))}
        out[name] = table
    return out


def _axis_n(point: object) -> int:
    from sim.scale import ScalePoint, axis_value

    assert isinstance(point, ScalePoint)
    return axis_value(point)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# --- targets -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One of the issue's targets and whether this run meets it."""

    what: str
    ours: str
    met: bool | None


def targets(results: Sequence[UnitResult], all_rows: Sequence[Row],
            wall_s: float, names: Sequence[str], seeds: int, quick: bool) -> list[Target]:
    """The issue's targets, evaluated on the experiments this run holds."""
    out: list[Target] = []
    present = experiments_in(results)
    if "fig8" in present:
        look = lookup(results, all_rows, "fig8")
        rate, acc = look(U, 0.1, "recovery_rate"), look(U, 0.1, "accuracy_reduction_pct")
        out.append(Target("fig8, headroom 10 %: Understudy recovers 100 %", _pct(rate),
                          rate is not None and rate >= 100.0 - 1e-9))
        out.append(Target("fig8, headroom 10 %: Understudy accuracy reduction <= 4.5 % "
                          "(paper 4.52 %)", _pct(acc), acc is not None and acc <= 4.5))
        rivals = {p: look(p, 0.1, "recovery_rate") for p in (FW, FC, FWK)}
        text = ", ".join(f"{LABELS[p]} {_pct(v)}" for p, v in rivals.items())
        out.append(Target("fig8, headroom 10 %: every full-size baseline below 80 %", text,
                          all(v is not None and v < 80.0 for v in rivals.values())))
    if "fig11" in present:
        look = lookup(results, all_rows, "fig11")
        rate = look(U, 5, "recovery_rate")
        best = max((v for p in BASELINES if (v := look(p, 5, "recovery_rate")) is not None),
                   default=None)
        out.append(Target("fig11, 5 of 10 sites failed: Understudy recovers 100 %", _pct(rate),
                          rate is not None and rate >= 100.0 - 1e-9))
        if rate is not None and best is not None:
            # §5.6 does not say whether "by at least 39.3%" is points or relative: judge both.
            gain = rate - best
            relative = 100.0 * (rate / best - 1.0) if best else float("inf")
            out.append(Target("fig11, 5 of 10 sites: >= 39 points above the best full-size "
                              "baseline", f"+{gain:.1f} points (best baseline {best:.1f} %)",
                              gain >= 39.0))
            out.append(Target("fig11, 5 of 10 sites: >= 39 % above the best full-size "
                              "baseline, read as relative (ours / best - 1)",
                              f"+{relative:.1f} % relative", relative >= 39.0))
    if "fig13" in present:
        look = lookup(results, all_rows, "fig13")
        apps, servers = look("heuristic", ("apps", 3000), "runtime_ms"), \
            look("heuristic", ("servers", 1000), "runtime_ms")
        out.append(Target("fig13: heuristic curve up to 3000 apps / 1000 servers (paper < 4 s)",
                          f"{_ms(apps)} at 3000 apps, {_ms(servers)} at 1000 servers",
                          apps is not None and servers is not None
                          and max(apps, servers) < 4000.0))
    if set(names) == set(EXPERIMENTS) and seeds >= 3 and not quick:
        out.append(Target("'all' with 3 seeds within 20 minutes", f"{wall_s / 60:.1f} min",
                          wall_s <= 20 * 60))
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


# --- markdown ----------------------------------------------------------------------------------


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _ours_table(all_rows: Sequence[Row], name: str) -> list[str]:
    param = EXPERIMENTS[name].param
    header = [param, "policy", "warm step", "recovery % (worst)", "MTTR mean / p50 / p99 ms",
              "end-to-end ms", "accuracy red. % (max)", "warm/prog/cold/lost", "preempted"]
    body = []
    for (policy, value), row in pooled(all_rows, name).items():
        s = row.summary
        body.append([param_text(value), LABELS.get(policy, policy), row.warm_method,
                     f"{100 * s.recovery_rate:.1f} ({100 * s.recovery_rate_min:.1f})",
                     f"{_fmt(s.mttr_mean_ms, 0)} / {_fmt(s.mttr_p50_ms, 0)} / "
                     f"{_fmt(s.mttr_p99_ms, 0)}", _fmt(s.e2e_mean_ms, 0),
                     f"{_fmt(s.accuracy_reduction_pct, 2)} "
                     f"({_fmt(s.accuracy_reduction_max_pct, 1)})",
                     f"{s.warm}/{s.progressive}/{s.cold}/{s.lost}", str(row.preempted)])
    return _table(header, body)


def _claims_table(results: Sequence[UnitResult], all_rows: Sequence[Row], name: str) -> list[str]:
    look = lookup(results, all_rows, name)
    body = []
    for claim in CLAIMS:
        if claim.experiment != name:
            continue
        ours = claim.ours(look)
        paper = "> 0" if claim.paper is None else f"{claim.paper:g}"
        body.append([claim.source, claim.what, f"{paper} {claim.unit}",
                     "n/a" if ours is None else f"{ours:.2f} {claim.unit}",
                     claim.verdict(ours)])
    return _table(["paper", "quantity", "paper value", "ours", "vs paper"], body)


def _cluster_line(all_rows: Sequence[Row], name: str) -> str:
    described: dict[str, list[str]] = {}
    done = set()
    for row in all_rows:
        if row.experiment != name or row.seed != ALL_SEEDS or row.value in done:
            continue
        done.add(row.value)
        text = (f"{row.apps:.0f} apps ({row.critical:.0f} in K), {row.servers:.0f} servers, "
                f"primaries use {100 * row.memory_utilisation:.1f} % of GPU memory and "
                f"{100 * row.compute_utilisation:.1f} % of compute")
        described.setdefault(text, []).append(param_text(row.value))
    if len(described) == 1:
        return next(iter(described))
    return "; ".join(f"{', '.join(values)}: {text}" for text, values in described.items())


def markdown(results: Sequence[UnitResult], all_rows: Sequence[Row], *, seeds: int, quick: bool,
             wall_s: float, names: Sequence[str], timing: Timing,
             knobs: MixKnobs = CALIBRATED) -> str:
    """The whole report: targets, then one section per experiment, ours beside the paper's."""
    lines = ["# Understudy simulator: FailLite's experiments reproduced", "",
             f"Seeds: {seeds} ({'quick' if quick else 'full'} run), wall time "
             f"{wall_s:.0f} s on {platform.machine()} / Python {platform.python_version()}.",
             f"Timing model: heartbeat {timing.heartbeat_ms:g} ms x {timing.missed_heartbeats} "
             f"missed, notification {timing.notification_ms:g} ms, command "
             f"{timing.command_ms:g} ms, {timing.load_threads} load threads per server; load "
             f"time = measured where profiled ({len(timing.measured)} variants), else "
             f"{timing.fit.intercept_ms:.1f} ms + {timing.fit.ms_per_mb:.3f} ms/MB of "
             f"{timing.fit.basis}{_scaled(timing)} ({timing.fit.source}).",
             f"Application mix: {knobs.label()} "
             f"({'the calibrated one' if knobs == CALIBRATED else 'NOT the calibrated one'}; "
             "sim/calibration.md).",
             "MTTR is §5.1's: from failure detection to the client notification; 'end-to-end' "
             "adds the detection delay (from the failure itself).", "", "## Targets", ""]
    found = targets(results, all_rows, wall_s, names, seeds, quick)
    lines += _table(["target", "ours", "met"],
                    [[t.what, t.ours, "yes" if t.met else "NO"] for t in found])
    for name in experiments_in(results):
        experiment = EXPERIMENTS[name]
        lines += ["", f"## {name}: {experiment.title} ({experiment.source})", "",
                  f"Setup: {experiment.setup}."]
        if name != "fig13":
            lines += ["", f"Clusters (mean over seeds): {_cluster_line(all_rows, name)}.", ""]
            lines += _ours_table(all_rows, name)
        lines += ["", "Paper vs ours:", ""] + _claims_table(results, all_rows, name)
        lines += ["", f"![{name}]({name}/{name}.png)"]
    return "\n".join(lines) + "\n"


def _scaled(timing: Timing) -> str:
    return "" if timing.fit.scale == 1.0 else f" x {timing.fit.scale:g}"


def write_all(out: Path, results: Sequence[UnitResult], *, seeds: int, quick: bool,
              wall_s: float, names: Sequence[str], timing: Timing,
              knobs: MixKnobs = CALIBRATED) -> dict[str, object]:
    """Write every file under ``out``; return the JSON summary."""
    all_rows = rows(results)
    for name in experiments_in(results):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        if name == "fig13":
            (folder / "runtime.csv").write_text(timings_csv(results, name), encoding="utf-8")
        else:
            (folder / "summary.csv").write_text(summary_csv(all_rows, name), encoding="utf-8")
            (folder / "scenarios.csv").write_text(scenarios_csv(results, name),
                                                  encoding="utf-8")
            (folder / "timings.csv").write_text(timings_csv(results, name), encoding="utf-8")
        plot_experiment(name, all_rows, results, folder / f"{name}.png")
    (out / "report.md").write_text(markdown(results, all_rows, seeds=seeds, quick=quick,
                                            wall_s=wall_s, names=names, timing=timing,
                                            knobs=knobs),
                                   encoding="utf-8")
    summary = json_summary(all_rows, results)
    found = targets(results, all_rows, wall_s, names, seeds, quick)
    document = {"experiments": summary,
                "targets": [{"target": t.what, "ours": t.ours, "met": t.met} for t in found]}
    (out / "results.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
    return summary
