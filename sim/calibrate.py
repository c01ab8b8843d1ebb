"""Calibrate the application mix on the paper's Fig. 7/8 baselines, under the issue's targets.

The paper fixes the cluster (servers, sites, 640 apps, headroom, K, α) but not the request
rates of its apps, so not how large each primary is, nor (for the 100-server experiments)
exactly which families "the same mixture of DNN models as the real experiments" (§5.3)
means. Those free choices (``sim.cluster.MixKnobs``) decide how often a full-size replica
does not fit, i.e. the full-size baselines' recovery rates. We fit them on the numbers the
text gives for the baselines of Fig. 7 and Fig. 8 only (``TARGETS``: every recovery-rate
claim of ``sim.paper`` for those figures that reads a full-size policy), and keep Fig. 11
(and Fig. 9, 10) for validation: no Fig. 11 number enters the score.

Constraint: the simulator's issue (issue 5) lists targets that depend on the mix: at 10 %
headroom Understudy recovers 100 % with at most 4.5 % accuracy reduction while every
full-size baseline stays below 80 %; with 5 of 10 sites failed Understudy recovers 100 %, at
least 39 % above the best full-size baseline (points and relative). The paper gives no mix
that we could take, and the best fit to Fig. 7/8 alone misses the five-site target, so the
mix is chosen among the settings that meet every one of these targets (``check_targets``:
the report's own verdicts, ``sim.report.targets``, on the same runs as ``all --seeds N``:
Fig. 8 at 10 % with every server failed, Fig. 11 with 5 sites failed, all four policies).
``--unconstrained`` chooses by the score alone (the best fit to the paper's figures).

Score of a setting: the root mean square, in points, of (ours - paper) over the targets,
ours the mean over seeds of each seed's value (the paper's numbers come from one placement:
its worst failure is the worst of six, not of six per seed). Only the baselines run
(Understudy does not enter the score and its ILP is the slow part). Fig. 8 fails the
``--quick`` sample of 20 servers per seed; Fig. 7 every server, as the experiments do, with
4x the seeds (``FIG7_SEEDS_PER_SEED``).

A coarse grid (``grid``: 72 settings) first, then a fine one around its winner
(``refine``); the lowest score of both that meets the targets wins. A setting meets them
when it does on seeds 0..N-1 (those of ``all --seeds N``) and again on seeds N..2N-1: seed to
seed, the best baseline with five sites failed moves by several points, and a setting that
passes on one set of seeds by a hair is no reproduction of the claim. The winner is then
checked once more on seeds 2N..3N-1, which no choice looked at (the hold-out).

    python -m sim.calibrate [--seeds 3] [--jobs 2] [--out calibration.csv] [--coarse-only]
                            [--unconstrained]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from model_repo.profiles import load_families
from policies.model import Family
from sim.cluster import MixKnobs
from sim.experiments import Unit, UnitResult, run_unit
from sim.paper import BASELINES, CLAIMS, Claim
from sim.pool import map_jobs
from sim.report import Target, targets
from sim.results import lookup, rows
from sim.runner import UNDERSTUDY
from sim.timing import Timing, profiler_fit, timing_for

CAPS_PCT = (20.0, 30.0, 40.0)
"""Largest primary, % of one A2 (before: 20, the default headroom). From 60 % on the testbed
mix's 640 primaries stop fitting 100 A2s."""

RATE_LOWS_RPS = (0.25, 1.0)
"""Lower end of the request rate (before: 1; regnet_y's primary needs 20.8 % of an A2 at
1 req/s, so with a low end of 1 every regnet_y app is above a 20 % headroom)..."""

RATE_HIGHS_RPS = (5.0, 10.0, 20.0)
"""...its upper end (before: 10)..."""

RATE_DISTRIBUTIONS = ("uniform", "log-uniform")
"""...drawn uniformly (before) or uniformly in log rate."""

MIXES = ("all", "testbed")
"""The 640-app cluster's families: all 22 profiled, or the testbed's five (§5.1)."""

FIG7_SEEDS_PER_SEED = 4
"""Fig. 7's 6-server cluster is cheap and its numbers (a worst failure of six above all) vary
much between placements: it runs this many times as many seeds as Fig. 8."""

FIG8_HEADROOMS = (0.1, 0.5)
"""The headrooms at which the text gives baseline recovery rates."""

TARGET_UNITS = (("fig8", 0.1), ("fig11", 5))
"""The experiments and parameter values of the issue's mix-dependent targets."""


def _reads(claim: Claim) -> list[tuple[str, object, str]]:
    """The (policy, value, metric) triples a claim's lookup asks for."""
    asked: list[tuple[str, object, str]] = []

    def record(policy: str, value: object, metric: str) -> float:
        asked.append((policy, value, metric))
        return 1.0
    claim.ours(record)
    return asked


def _is_target(claim: Claim) -> bool:
    if claim.experiment not in ("fig7", "fig8") or claim.unit != "%" or claim.paper is None:
        return False
    reads = _reads(claim)
    return bool(reads) and all(p in BASELINES and m.startswith("recovery_rate")
                               for p, _, m in reads)


TARGETS: tuple[Claim, ...] = tuple(c for c in CLAIMS if _is_target(c))
"""The paper's Fig. 7 / Fig. 8 recovery rates of the full-size baselines (9 numbers)."""


def grid() -> list[MixKnobs]:
    """The coarse grid, the pre-calibration setting (20 %, uniform 1-10 rps, all) included."""
    return [MixKnobs(cap, (low, high), dist, mix) for mix, dist, low, cap, high
            in itertools.product(MIXES, RATE_DISTRIBUTIONS, RATE_LOWS_RPS, CAPS_PCT,
                                 RATE_HIGHS_RPS)]


def refine(center: MixKnobs) -> list[MixKnobs]:
    """The fine grid around the coarse winner.

    Its mix and distribution; the cap in 5-point steps within 10 points (20-50 %); the rate's
    low end halved / kept / doubled, its high end x0.6 / x1 / x1.5.
    """
    cap = center.max_primary_compute_pct
    caps = sorted({c for c in (cap - 10, cap - 5, cap, cap + 5, cap + 10) if 20 <= c <= 50})
    low, high = center.rate_rps
    ranges = [(lo, hi) for lo in (low / 2, low, low * 2) for hi in (high * 0.6, high, high * 1.5)
              if lo < hi]
    return [MixKnobs(c, r, center.rate_distribution, center.large_scale_mix)
            for c in caps for r in ranges]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One setting: our value of each target (None: the 640 apps do not fit), and the score."""

    knobs: MixKnobs
    ours: tuple[float | None, ...]
    fig7_apps: float
    fig8_compute_pct: float
    fig8_memory_pct: float
    note: str = ""
    issue_targets: tuple[Target, ...] = field(default=())
    """The report's verdicts on the issue's targets, seeds 0..N-1 (empty: not checked)..."""
    repeat_targets: tuple[Target, ...] = field(default=())
    """...and on seeds N..2N-1 (checked only where every target of the first set is met)."""

    @property
    def meets_targets(self) -> bool:
        """Every target was checked on both sets of seeds and is met."""
        return _all_met(self.issue_targets) and _all_met(self.repeat_targets)

    @property
    def score(self) -> float:
        """RMS of (ours - paper) in points over the targets; inf when a target is missing."""
        if any(v is None for v in self.ours):
            return math.inf
        errors = [(v - c.paper) ** 2 for v, c in zip(self.ours, TARGETS, strict=True)
                  if v is not None and c.paper is not None]
        return math.sqrt(sum(errors) / len(errors))


def _all_met(found: Sequence[Target]) -> bool:
    return bool(found) and all(t.met for t in found)


def _units(seeds: int) -> list[Unit]:
    out = [Unit("fig7", seed, "testbed", quick=False)
           for seed in range(FIG7_SEEDS_PER_SEED * seeds)]
    out += [Unit("fig8", seed, h, quick=True) for seed in range(seeds) for h in FIG8_HEADROOMS]
    return out


def check_targets(knobs: MixKnobs, families: Mapping[str, Family], timing: Timing,
                  seeds: int, first_seed: int = 0) -> tuple[Target, ...]:
    """The report's verdicts on the issue's mix-dependent targets under ``knobs``.

    The same units as ``all`` runs for them (every server of Fig. 8's cluster at 10 %
    headroom, 10 sets of 5 failed sites), seeds ``first_seed`` .. ``first_seed + seeds - 1``,
    Understudy and the three baselines. ValueError when the 640 primaries do not fit.
    """
    results = [run_unit(Unit(name, seed, value, quick=False), families, timing, knobs=knobs,
                        policies=(UNDERSTUDY, *BASELINES))
               for name, value in TARGET_UNITS
               for seed in range(first_seed, first_seed + seeds)]
    names = tuple(name for name, _ in TARGET_UNITS)
    return tuple(targets(results, rows(results), 0.0, names, seeds, quick=False))


def evaluate(knobs: MixKnobs, families: Mapping[str, Family], timing: Timing,
             seeds: int, with_targets: bool = True) -> Evaluation:
    """Run the baselines of Fig. 7 and Fig. 8 (sampled) under ``knobs``; our target values.

    Each target is the mean over seeds of one seed's value (Fig. 7 runs
    ``FIG7_SEEDS_PER_SEED`` x ``seeds`` seeds, Fig. 8 ``seeds``). ``with_targets`` also
    checks the issue's targets (``check_targets``), the slow part.
    """
    results: list[UnitResult] = []
    try:
        for unit in _units(seeds):
            results.append(run_unit(unit, families, timing, knobs=knobs, policies=BASELINES))
    except ValueError as error:  # the 640 primaries do not fit 100 A2s
        return Evaluation(knobs, tuple(None for _ in TARGETS), math.nan, math.nan, math.nan,
                          str(error).split(";")[0])
    per_seed: dict[str, list[list[float | None]]] = {"fig7": [], "fig8": []}
    for name, count in (("fig7", FIG7_SEEDS_PER_SEED * seeds), ("fig8", seeds)):
        for seed in range(count):
            mine = [u for u in results if u.seed == seed and u.experiment == name]
            look = lookup(mine, rows(mine), name)
            per_seed[name].append([c.ours(look) if c.experiment == name else None
                                   for c in TARGETS])
    ours = tuple(_mean_or_none(per_seed[c.experiment][s][i]
                               for s in range(len(per_seed[c.experiment])))
                 for i, c in enumerate(TARGETS))
    fig7 = [u for u in results if u.experiment == "fig7"]
    fig8 = [u for u in results if u.experiment == "fig8" and u.value == FIG8_HEADROOMS[0]]
    checked = check_targets(knobs, families, timing, seeds) if with_targets else ()
    repeated = (check_targets(knobs, families, timing, seeds, first_seed=seeds)
                if _all_met(checked) else ())
    return Evaluation(knobs, ours, _mean(u.apps for u in fig7),
                      100.0 * _mean(u.compute_utilisation for u in fig8),
                      100.0 * _mean(u.memory_utilisation for u in fig8),
                      issue_targets=checked, repeat_targets=repeated)


def _mean_or_none(values: Iterable[float | None]) -> float | None:
    found = list(values)
    if any(v is None for v in found):
        return None
    return _mean(v for v in found if v is not None)


def _mean(values: Iterable[float]) -> float:
    found = list(values)
    return sum(found) / len(found) if found else math.nan


_INPUTS: tuple[Mapping[str, Family], Timing] | None = None


def default_inputs() -> tuple[Mapping[str, Family], Timing]:
    """The packaged profiles and their measured load times, loaded once per process."""
    global _INPUTS
    if _INPUTS is None:
        families = load_families()
        _INPUTS = (families, timing_for(families, "profiles", profiler_fit(None)))
    return _INPUTS


def _evaluate_in_worker(job: tuple[MixKnobs, int, bool]) -> Evaluation:
    return evaluate(job[0], *default_inputs(), seeds=job[1], with_targets=job[2])


def calibrate(settings: Sequence[MixKnobs], seeds: int, jobs: int = 1,
              with_targets: bool = True) -> list[Evaluation]:
    """Evaluate every setting (in worker processes with ``jobs`` > 1), in grid order."""
    return map_jobs(_evaluate_in_worker, [(k, seeds, with_targets) for k in settings], jobs)


def best(evaluations: Sequence[Evaluation], constrained: bool = False) -> Evaluation | None:
    """The lowest score; ties go to the earlier setting in grid order.

    ``constrained``: among the settings meeting the issue's targets. None if none qualifies.
    """
    allowed = [e for e in evaluations if e.meets_targets or not constrained]
    return min(allowed, key=lambda e: e.score, default=None)


def _targets_cell(evaluation: Evaluation) -> str:
    if not evaluation.issue_targets:
        return "-"
    missed = [t.ours for t in evaluation.issue_targets if not t.met]
    if missed:
        return "no: " + "; ".join(missed)
    if not evaluation.repeat_targets:
        return "on the first seeds; the next ones not checked"
    again = [t.ours for t in evaluation.repeat_targets if not t.met]
    return "yes" if not again else "no, on the next seeds: " + "; ".join(again)


def _short(claim: Claim) -> str:
    reads = _reads(claim)
    policy, value, metric = reads[0]
    name = {"full-size-warm": "FW", "full-size-cold": "FC", "full-size-warm-k": "FWK"}[policy]
    where = "f7" if value == "testbed" else f"f8@{float(value) * 100:.0f}"  # type: ignore[arg-type]
    return f"{where} {name}{' min' if metric == 'recovery_rate_min' else ''}"


def table(evaluations: Sequence[Evaluation]) -> str:
    """A markdown table: setting, score, cluster, then each target (paper value in the head)."""
    head = ["setting", "score (RMS pts)", "fig7 apps", "fig8 compute / memory %"]
    head += [f"{_short(c)} ({c.paper:g})" for c in TARGETS]
    head += ["issue targets met on both seed sets (else what missed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in sorted(evaluations, key=lambda e: e.score):
        if e.note:
            cells = [e.knobs.label(), "-", "-", "-"] + [e.note] + [""] * len(TARGETS)
        else:
            cells = [e.knobs.label(), f"{e.score:.1f}", f"{e.fig7_apps:.0f}",
                     f"{e.fig8_compute_pct:.0f} / {e.fig8_memory_pct:.0f}"]
            cells += [f"{v:.1f}" for v in e.ours if v is not None]
            cells.append(_targets_cell(e))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, evaluations: Sequence[Evaluation]) -> None:
    """One row per setting with the knobs, the score and every target value."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["max_primary_compute_pct", "rate_low_rps", "rate_high_rps",
                         "rate_distribution", "mix",
                         "score", "fig7_apps", "fig8_compute_pct", "fig8_memory_pct", "note",
                         "meets_issue_targets", *[_short(c) for c in TARGETS]])
        for e in evaluations:
            writer.writerow([e.knobs.max_primary_compute_pct, *e.knobs.rate_rps,
                             e.knobs.rate_distribution, e.knobs.large_scale_mix,
                             f"{e.score:.3f}", e.fig7_apps, e.fig8_compute_pct,
                             e.fig8_memory_pct, e.note, e.meets_targets,
                             *["" if v is None else f"{v:.3f}" for v in e.ours]])


def main(argv: Sequence[str] | None = None) -> int:
    """Search the grid, print the table, the chosen setting and its hold-out check."""
    parser = argparse.ArgumentParser(prog="python -m sim.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", type=Path, default=None, help="also write this CSV")
    parser.add_argument("--coarse-only", action="store_true", help="skip the fine grid")
    parser.add_argument("--unconstrained", action="store_true",
                        help="choose by the score alone; the issue's targets are not checked")
    options = parser.parse_args(argv)
    constrained = not options.unconstrained
    coarse = calibrate(grid(), options.seeds, options.jobs, with_targets=constrained)
    chosen = best(coarse, constrained)
    sys.stdout.write("coarse grid:\n\n" + table(coarse) + "\n\n")
    if chosen is None:
        sys.stdout.write("no setting of the coarse grid meets the issue's targets\n")
        return 1
    sys.stdout.write(f"coarse best: {chosen.knobs.label()} (score {chosen.score:.2f})\n\n")
    evaluations = list(coarse)
    if not options.coarse_only:
        fine = calibrate([k for k in refine(chosen.knobs) if k not in set(grid())],
                         options.seeds, options.jobs, with_targets=constrained)
        evaluations += fine
        chosen = best(evaluations, constrained) or chosen
        sys.stdout.write("fine grid (new settings only):\n\n" + table(fine) + "\n\n")
    if options.out is not None:
        write_csv(options.out, evaluations)
    sys.stdout.write(f"best: {chosen.knobs.label()} (score {chosen.score:.2f} points)\n")
    if constrained:
        held_out = check_targets(chosen.knobs, *default_inputs(), seeds=options.seeds,
                                 first_seed=2 * options.seeds)
        sys.stdout.write(f"hold-out, seeds {2 * options.seeds}-{3 * options.seeds - 1}:\n")
        for target in held_out:
            sys.stdout.write(f"  {'met' if target.met else 'MISSED'}: {target.what}: "
                             f"{target.ours}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
