"""``understudy sim experiment NAME``: FailLite's or Orloj's simulated experiments.

FailLite's (``fig7``, ``fig8``, ``fig9``, ``fig10``, ``fig11``, ``fig13``, ``all``) write CSV,
PNG plots and ``report.md`` under ``--out`` and print, as their last line, one JSON object: per
experiment, policy and parameter value, the recovery rate, mean MTTR and accuracy reduction.
Orloj's (``orloj-fig3``, ``orloj-fig7`` ... ``orloj-fig12``, ``orloj-load``, ``orloj-slope``)
print the figure's series beside the paper's numbers, write ``<out>/<name>/`` (CSV, PNG, table,
summary) and end with the summary as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.cluster import MixKnobs

ORLOJ_CHOICES = ("orloj-fig3", "orloj-fig7", "orloj-fig8", "orloj-fig9", "orloj-fig10",
                 "orloj-fig11", "orloj-fig12", "orloj-load", "orloj-slope")
CHOICES = ("fig7", "fig8", "fig9", "fig10", "fig11", "fig13", "all", *ORLOJ_CHOICES)


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``sim experiment`` to the ``sim`` command parser."""
    actions = parser.add_subparsers(dest="sim_command", required=True, metavar="ACTION")
    experiment = actions.add_parser(
        "experiment", help="reproduce FailLite's or Orloj's simulated experiments",
        description="Run one of FailLite's experiments (or all) with the four policies, or "
                    "one of Orloj's (orloj-fig*) with its schedulers and baselines; write "
                    "CSV, plots and a report beside the paper's numbers.")
    experiment.add_argument("name", choices=CHOICES, help="experiment (paper figure) or all")
    experiment.add_argument("--seeds", type=int, default=None,
                            help="seeds 0..N-1 (default 3, or 1 with --quick; orloj-*: "
                                 "the first seed only)")
    experiment.add_argument("--out", type=Path, default=Path("sim-results"),
                            help="output folder (default ./sim-results)")
    experiment.add_argument("--quick", action="store_true",
                            help="a small version: fewer failures and parameter values")
    experiment.add_argument("--jobs", type=int, default=1,
                            help="worker processes (results do not depend on it)")
    experiment.add_argument("--no-progress", action="store_true", help="no progress bar")
    experiment.add_argument("--profiles", type=Path, default=None,
                            help="profile folder (default: the packaged profiles)")
    experiment.add_argument("--store", type=Path, action="append", default=[],
                            help="an artifact store whose imported families (e.g. digits, "
                                 "from `understudy models build`) join the packaged ones; "
                                 "repeatable")
    experiment.add_argument("--load-times", choices=("profiles", "paper"), default="profiles",
                            help="'profiles': measured load times, else the profiler's fit "
                                 "(default); 'paper': FailLite Fig. 5's line for every variant")
    mix = experiment.add_argument_group(
        "application mix", "the generator's free choices; default: the calibrated ones "
        "(sim/calibration.md); the report says which mix ran")
    mix.add_argument("--mix-preset", choices=("calibrated", "fig7-8-fit"), default="calibrated",
                     help="'calibrated': the best fit to the paper's Fig. 7/8 baselines among "
                          "the mixes that meet the issue's targets (default); 'fig7-8-fit': "
                          "the best fit with no constraint. The options below apply on top")
    mix.add_argument("--mix-cap", type=float, default=None, metavar="PCT",
                     help="largest primary, %% of one A2's compute")
    mix.add_argument("--mix-rates", default=None, metavar="LOW-HIGH",
                     help="request-rate range, req/s (e.g. 1-10)")
    mix.add_argument("--mix-distribution", choices=("uniform", "log-uniform"), default=None,
                     help="how rates are drawn in that range")
    mix.add_argument("--mix-families", choices=("all", "testbed"), default=None,
                     help="families of the 100-server experiments")


def mix_knobs(options: argparse.Namespace) -> MixKnobs:
    """The preset mix with the other ``--mix-*`` options applied; ValueError on bad values."""
    from sim.cluster import CALIBRATED, FIG78_FIT, ClusterSpec

    knobs = FIG78_FIT if options.mix_preset == "fig7-8-fit" else CALIBRATED
    if options.mix_cap is not None:
        knobs = replace(knobs, max_primary_compute_pct=options.mix_cap)
    if options.mix_rates is not None:
        low, sep, high = options.mix_rates.partition("-")
        try:
            rates = (float(low), float(high)) if sep else None
        except ValueError:
            rates = None
        if rates is None:
            raise ValueError(f"--mix-rates must be LOW-HIGH in req/s, got {options.mix_rates!r}")
        knobs = replace(knobs, rate_rps=rates)
    if options.mix_distribution is not None:
        knobs = replace(knobs, rate_distribution=options.mix_distribution)
    if options.mix_families is not None:
        knobs = replace(knobs, large_scale_mix=options.mix_families)
    ClusterSpec().with_knobs(knobs)  # the spec's checks: rates ordered and positive, cap range
    return knobs


def run(options: argparse.Namespace) -> int:
    """Run the experiment(s); the last line of stdout is the JSON summary."""
    from sim.suite import expand, run_suite

    if options.name in ORLOJ_CHOICES:
        return _run_orloj(options)
    seeds = options.seeds if options.seeds is not None else (1 if options.quick else 3)
    if seeds < 1 or options.jobs < 1:
        sys.stderr.write("--seeds and --jobs must be at least 1\n")
        return 2
    try:
        knobs = mix_knobs(options)
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    names = expand(options.name)
    result = run_suite(names, seeds=seeds, quick=options.quick, out=options.out,
                       jobs=options.jobs, progress=not options.no_progress,
                       profile_dir=None if options.profiles is None else str(options.profiles),
                       load_times=options.load_times, knobs=knobs,
                       stores=tuple(str(path) for path in options.store))
    sys.stdout.write(f"report: {options.out / 'report.md'} ({result.wall_s:.1f} s)\n")
    sys.stdout.write(json.dumps(result.summary, sort_keys=True) + "\n")
    return 0


def _run_orloj(options: argparse.Namespace) -> int:
    """One of Orloj's experiments: the table on stdout, the summary JSON as the last line."""
    from sim.orloj.suite import run_experiment

    seed = 0 if options.seeds is None else options.seeds - 1
    if seed < 0:
        sys.stderr.write("--seeds must be at least 1\n")
        return 2
    result = run_experiment(options.name, out=options.out, quick=options.quick, seed=seed)
    sys.stdout.write(result.table + "\n")
    sys.stdout.write(f"outputs: {options.out / options.name} ({result.wall_s:.1f} s)\n")
    sys.stdout.write(json.dumps(result.summary, sort_keys=True) + "\n")
    return 0
