"""The ``understudy`` command line: ``demo``, ``profiles build|show`` and the commands of
:data:`COMMAND_MODULES`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared/data/torchvision_classification.csv"
"""The torchvision metadata CSV, in the ``shared/`` folder beside the repository."""

_GLOBAL_OPTIONS_WITH_VALUE = ("--log-level",)

COMMAND_MODULES: tuple[str, ...] = (
    "understudy.models_cli",
    "understudy.agent_cli",
    "understudy.sim_cli",
    "understudy.controller_cli",
    "understudy.testbed_cli",
    "understudy.graph_cli",
)
"""Modules that each add one top-level command.

Each defines ``COMMAND`` (its name), ``register(commands)`` (adds its sub-parser to the
``argparse`` sub-parsers object) and ``run(options) -> int``. A module absent from this
checkout is skipped, so a command lands together with its module.
"""


def _command_modules() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found[module.COMMAND] = module
    return found


def _build_parser(modules: dict[str, Any]) -> argparse.ArgumentParser:
    from model_repo.profiles import PROFILE_DIR

    parser = argparse.ArgumentParser(
        prog="understudy", description="Failover control plane for ML model serving at the edge.")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="root log level when understudy configures logging (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser(
        "demo", add_help=False,
        help="plan a generated edge cluster and fail a server (all further arguments go to "
             "the demo; see 'understudy demo --help')")

    profiles = commands.add_parser("profiles", help="model-variant profiles")
    actions = profiles.add_subparsers(dest="profiles_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="regenerate the JSON profiles from the CSV")
    build.add_argument("--csv", type=Path, default=DEFAULT_CSV,
                       help=f"torchvision metadata CSV (default {DEFAULT_CSV})")
    build.add_argument("--out", type=Path, default=PROFILE_DIR,
                       help=f"output folder (default {PROFILE_DIR})")
    show = actions.add_parser("show", help="print the profiles as a table")
    show.add_argument("--family", help="list this family's variants instead of the summary")
    show.add_argument("--dir", type=Path, default=None,
                      help=f"profile folder (default {PROFILE_DIR})")
    for module in modules.values():
        module.register(commands)
    return parser


def _split_demo(args: list[str]) -> tuple[list[str], list[str]] | None:
    """Split ``[global options] demo REST`` into the part we parse and REST, untouched."""
    index = 0
    while index < len(args):
        token = args[index]
        if token in _GLOBAL_OPTIONS_WITH_VALUE:
            index += 2
        elif token.startswith("-"):
            index += 1
        elif token == "demo":
            return args[: index + 1], args[index + 1:]
        else:
            return None
    return None


def _configure_logging(level: str) -> None:
    """Configure the root logger once; leave a configuration the caller made alone."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # Per-request chatter of the HTTP client libraries drowns the decisions we log.
        for noisy in ("httpx", "httpcore", "websockets"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def _run_demo(argv: list[str]) -> int:
    try:
        demo = importlib.import_module("understudy.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "understudy.demo":
            raise
        logger.error("the demo module (understudy/demo.py) is not installed in this checkout")
        return 1
    result = demo.main(argv)
    return int(result or 0)


def _profiles_build(csv_path: Path, out_dir: Path) -> int:
    from model_repo.profiles import build_profiles, merge_measurements, write_profiles

    docs = merge_measurements(build_profiles(csv_path), out_dir)
    paths = write_profiles(docs, out_dir)
    variants = sum(len(doc["variants"]) for doc in docs.values())
    print(f"wrote {len(paths)} families, {variants} variants to {out_dir}")
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for row in rows:
        cells = (cell.rjust(w) if i else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _profiles_show(profile_dir: Path | None, family_name: str | None) -> int:
    from model_repo.profiles import load_families

    families = load_families(profile_dir)
    if family_name is None:
        header = ["family", "variants", "smallest memory_mb", "largest memory_mb",
                  "max demand difference (MB)"]
        rows = [[name, str(len(fam.variants)), f"{fam.smallest.memory_mb:.1f}",
                 f"{fam.largest.memory_mb:.1f}",
                 f"{fam.largest.memory_mb - fam.smallest.memory_mb:.1f}"]
                for name, fam in sorted(families.items())]
        print(_table(header, rows))
        total = sum(len(fam.variants) for fam in families.values())
        print(f"\n{len(families)} families, {total} variants")
        return 0
    family = families.get(family_name)
    if family is None:
        print(f"unknown family {family_name!r}; known: {', '.join(sorted(families))}",
              file=sys.stderr)
        return 2
    header = ["variant", "memory_mb", "compute_per_rps", "latency_ms (ref)", "accuracy",
              "top1 %", "size_mb"]
    rows = [[v.name, f"{v.memory_mb:.1f}", f"{v.compute_per_rps:.4f}",
             f"{v.latency_ms['reference']:.3f}", f"{v.accuracy:.4f}",
             f"{v.top1_pct:.3f}" if v.top1_pct is not None else "-",
             f"{v.size_mb:.1f}" if v.size_mb is not None else "-"]
            for v in family.variants]
    print(f"family {family.name} ({len(family.variants)} variants, smallest memory first)")
    print(_table(header, rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``understudy`` command line; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] | None = None
    split = _split_demo(args)
    if split is not None:
        args, passthrough = split
    modules = _command_modules()
    parser = _build_parser(modules)
    options = parser.parse_args(args)
    _configure_logging(options.log_level)
    if options.command == "demo":
        return _run_demo(passthrough or [])
    if options.command in modules:
        return int(modules[options.command].run(options) or 0)
    from model_repo.profiles import ProfileError

    try:
        if options.profiles_command == "build":
            return _profiles_build(options.csv, options.out)
        return _profiles_show(options.dir, options.family)
    except ProfileError as exc:
        logger.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
