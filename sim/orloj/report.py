"""Outputs of an Orloj experiment: CSV, PNG, a text table beside the paper's numbers, JSON.

The PNG is drawn like the paper's figure, with the paper's values (where the appendix has them)
as dotted lines of the same colour as our run of that system.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.orloj.experiments import EXPERIMENTS, Point  # noqa: E402
from sim.orloj.paper import CLAIMS, SYSTEMS, paper_value  # noqa: E402
from sim.orloj.schedulers import BASELINES, LABELS, ORLOJ, ORLOJ_PAPER  # noqa: E402

COLOURS = {ORLOJ: "tab:red", ORLOJ_PAPER: "tab:orange", "clipper": "tab:blue",
           "nexus": "tab:green", "clockwork": "tab:purple", "triton": "tab:gray"}
PAPER_COLOUR = {"orloj": COLOURS[ORLOJ], "clipper": COLOURS["clipper"],
                "nexus": COLOURS["nexus"], "clockwork": COLOURS["clockwork"]}
SWEEPS = ("orloj-fig3", "orloj-fig7", "orloj-fig8", "orloj-fig9")
GAIN_BY_X = {"orloj-load": "gain_vs_best_baseline_pct_by_load",
             "orloj-slope": "gain_vs_best_baseline_pct_by_slope"}
"""Experiments whose summary has Orloj's gain over the best baseline at each x, per case."""


def write_csv(points: Sequence[Point], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["experiment", "case", "x", "series", "value", "paper", "detail"])
        for p in points:
            paper = (paper_value(p.case, p.x, "orloj" if p.series == ORLOJ else p.series)
                     if p.experiment in SWEEPS else None)
            writer.writerow([p.experiment, p.case, p.x, p.series, f"{p.value:.4f}",
                             "" if paper is None else paper, p.detail])


def _by_case(points: Sequence[Point]) -> dict[str, dict[str, dict[float, float]]]:
    table: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for p in points:
        table[p.case][p.series][p.x] = p.value
    return table


def text_table(name: str, points: Sequence[Point]) -> str:
    """Our series per case and x, and for the SLO sweeps the paper's four systems beside."""
    table = _by_case(points)
    lines = [f"{name}: {EXPERIMENTS[name].title}", f"  paper: {CLAIMS[name]}"]
    for case, series in table.items():
        names = list(series)
        xs = sorted({x for values in series.values() for x in values})
        head = f"  {case:<20} {EXPERIMENTS[name].xlabel:>10} | " + " ".join(
            f"{s[:11]:>11}" for s in names)
        if name in SWEEPS:
            head += " || paper: " + " ".join(f"{s:>9}" for s in SYSTEMS)
        lines.append(head)
        for x in xs:
            row = f"  {'':<20} {x:>10g} | " + " ".join(
                f"{series[s].get(x, float('nan')):>11.3f}" for s in names)
            if name in SWEEPS:
                values = [paper_value(case, x, s) for s in SYSTEMS]
                row += " ||        " + " ".join(
                    f"{'-' if v is None else f'{v:.2f}':>9}" for v in values)
            lines.append(row)
    return "\n".join(lines)


def _gain(series: dict[str, dict[float, float]], x: float) -> float | None:
    """Orloj's gain over the best baseline at ``x``, in per cent (None when all finish 0)."""
    best = max(series[b][x] for b in BASELINES)
    return round(100 * (series[ORLOJ][x] / best - 1), 1) if best > 0 else None


def summary(name: str, points: Sequence[Point]) -> dict[str, object]:
    """Headline numbers: per case, Orloj's gain over the best baseline at the tightest SLO.

    Ours (over Clipper, Nexus, Clockwork and Triton) and the paper's (over the first three).
    """
    out: dict[str, object] = {"experiment": name}
    table = _by_case(points)
    if name not in SWEEPS:
        out["values"] = {case: {s: {f"{x:g}": round(v, 4) for x, v in values.items()}
                                for s, values in series.items()}
                         for case, series in table.items()}
        if name in GAIN_BY_X:
            out[GAIN_BY_X[name]] = {
                case: {f"{x:g}": _gain(series, x) for x in sorted(series[ORLOJ])}
                for case, series in table.items()}
        return out
    gains: dict[str, float | None] = {}
    paper_gains: dict[str, float | None] = {}
    rates: dict[str, dict[str, dict[str, float]]] = {}
    for case, series in table.items():
        tight = min(series[ORLOJ])
        gains[case] = _gain(series, tight)
        theirs = [v for v in (paper_value(case, tight, s) for s in SYSTEMS) if v is not None]
        if len(theirs) == len(SYSTEMS) and max(theirs[:3]) > 0:
            paper_gains[case] = round(100 * (theirs[3] / max(theirs[:3]) - 1), 1)
        else:
            paper_gains[case] = None
        rates[case] = {s: {f"{x:g}": round(v, 4) for x, v in values.items()}
                       for s, values in series.items()}
    out["gain_vs_best_baseline_tight_pct"] = gains
    out["paper_gain_tight_pct"] = paper_gains
    out["finish_rate"] = rates
    return out


def plot(name: str, points: Sequence[Point], path: Path) -> None:
    experiment = EXPERIMENTS[name]
    table = _by_case(points)
    cols = min(len(table), 4)
    rows = (len(table) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.ravel()[len(table):]:
        ax.set_visible(False)
    for ax, (case, series) in zip(axes.ravel(), table.items(), strict=False):
        for s, values in series.items():
            xs = sorted(values)
            ax.plot(xs, [values[x] for x in xs], marker="o", ms=3, label=LABELS.get(s, s),
                    color=COLOURS.get(s))
        if name in SWEEPS:
            xs = sorted({x for values in series.values() for x in values})
            for system in SYSTEMS:
                ys = [paper_value(case, x, system) for x in xs]
                if all(y is not None for y in ys):
                    ax.plot(xs, ys, ls=":", marker="x", ms=4, color=PAPER_COLOUR[system],
                            label=f"paper: {system}")
        if experiment.ylabel == "finish rate":  # one scale, so that figures compare at a glance
            ax.set_ylim(-0.02, 1.02)
        if name in ("orloj-fig10", "orloj-fig11", "orloj-fig12", "orloj-slope"):
            ax.set_xscale("log")
        if name == "orloj-fig10":
            ax.set_yscale("log")
        ax.set_title(case, fontsize=9)
        ax.set_xlabel(experiment.xlabel, fontsize=8)
        ax.set_ylabel(experiment.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=7,
               frameon=False)
    fig.suptitle(experiment.title)
    fig.tight_layout(rect=(0.0, 0.08 + 0.02 * (len(labels) > 5), 1.0, 1.0))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(name: str, points: Sequence[Point], out: Path) -> dict[str, object]:
    """CSV, PNG and JSON under ``out/name``; returns the summary."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(points, folder / "points.csv")
    plot(name, points, folder / f"{name}.png")
    result = summary(name, points)
    (folder / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n",
                                         encoding="utf-8")
    (folder / "table.txt").write_text(text_table(name, points) + "\n", encoding="utf-8")
    return result
