"""One PNG per experiment, drawn like the paper's figure (matplotlib, Agg backend)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim.experiments import EXPERIMENTS, UnitResult  # noqa: E402
from sim.results import Row, metric, pooled  # noqa: E402
from sim.scale import axis_value  # noqa: E402

LABELS = {"understudy": "Understudy", "understudy-no-preempt": "Understudy (no preemption)",
          "full-size-warm": "Full-Size-Warm", "full-size-cold": "Full-Size-Cold",
          "full-size-warm-k": "Full-Size-Warm(K)"}
PANELS = (("recovery_rate", "Recovery rate (%)"), ("mttr_mean_ms", "Mean MTTR (ms)"),
          ("accuracy_reduction_pct", "Accuracy reduction (%)"))


def plot_experiment(name: str, all_rows: Sequence[Row], results: Sequence[UnitResult],
                    path: Path) -> None:
    """Draw ``name``'s figure into ``path``."""
    if name == "fig13":
        _scale(results, path)
    elif name == "fig9":
        _criticality(all_rows, path)
    elif name in ("fig7", "fig10"):
        _bars(name, all_rows, path)
    else:
        _lines(name, all_rows, path)


def _series(name: str, all_rows: Sequence[Row]) -> dict[str, list[Row]]:
    table = pooled(all_rows, name)
    by_policy: dict[str, list[Row]] = defaultdict(list)
    for (policy, _), row in table.items():
        by_policy[policy].append(row)
    return by_policy


def _finish(fig: plt.Figure, title: str, path: Path, legend_from: plt.Axes | None = None) -> None:
    fig.suptitle(title)
    if legend_from is not None:
        handles, labels = legend_from.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
                   frameon=False)
        fig.tight_layout(rect=(0.0, 0.07, 1.0, 1.0))
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _lines(name: str, all_rows: Sequence[Row], path: Path) -> None:
    experiment = EXPERIMENTS[name]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for policy, series in _series(name, all_rows).items():
        xs = [float(r.value) * (100 if name == "fig8" else 1) for r in series]
        for ax, (key, label) in zip(axes, PANELS, strict=True):
            ys = [metric(r, key) for r in series]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o",
                    label=LABELS.get(policy, policy))
            ax.set_ylabel(label)
            ax.set_xlabel("Headroom (%)" if name == "fig8" else "Failed sites (of 10)")
            ax.grid(alpha=0.3)
    _finish(fig, f"{experiment.source}: {experiment.title}", path, legend_from=axes[0])


def _bars(name: str, all_rows: Sequence[Row], path: Path) -> None:
    experiment = EXPERIMENTS[name]
    series = _series(name, all_rows)
    values = list(dict.fromkeys(r.value for rows in series.values() for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    width = 0.8 / max(1, len(series))
    for i, (policy, rows) in enumerate(series.items()):
        by_value = {r.value: r for r in rows}
        xs = [k + i * width for k in range(len(values))]
        for ax, (key, label) in zip(axes, PANELS, strict=True):
            ys = [metric(by_value[v], key) if v in by_value else None for v in values]
            ax.bar(xs, [y or 0.0 for y in ys], width, label=LABELS.get(policy, policy))
            ax.set_ylabel(label)
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(values))],
                          [str(v) for v in values])
            ax.grid(alpha=0.3, axis="y")
    _finish(fig, f"{experiment.source}: {experiment.title}", path, legend_from=axes[0])


def _criticality(all_rows: Sequence[Row], path: Path) -> None:
    rows = sorted(pooled(all_rows, "fig9").values(), key=lambda r: float(r.value))
    xs = [100 * float(r.value) for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(xs, [metric(r, "accuracy_reduction_pct") or 0.0 for r in rows], marker="o",
            color="tab:blue", label="Accuracy loss")
    ax.set_xlabel("Top-K (%)")
    ax.set_ylabel("Accu. reduction (%)")
    other = ax.twinx()
    other.plot(xs, [metric(r, "mttr_mean_ms") or 0.0 for r in rows], marker="s",
               color="tab:red", label="MTTR")
    other.set_ylabel("MTTR (ms)")
    fig.legend(loc="upper center", fontsize=7)
    _finish(fig, "§5.4, Fig. 9: Impact of K", path)


def _scale(results: Sequence[UnitResult], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, axis in zip(axes, ("apps", "servers", "variants"), strict=True):
        points: dict[int, list[float]] = defaultdict(list)
        for unit in results:
            for point in unit.scale:
                if point.axis == axis:
                    points[axis_value(point)].append(point.heuristic_ms / 1000.0)
        xs = sorted(points)
        ax.plot(xs, [max(points[x]) for x in xs], marker="o")
        ax.set_xlabel({"apps": "Applications", "servers": "Servers",
                       "variants": "Model variants"}[axis])
        ax.set_ylabel("Runtime (s)")
        ax.grid(alpha=0.3)
    _finish(fig, "§5.8, Fig. 13: Scalability of the heuristic", path)
