"""The ``understudy`` command line: ``demo``, ``profiles build|show`` and :data:`COMMANDS`.

Only the chosen command's module is imported (and only it registers its options), so
``understudy --help`` needs nothing beyond the standard library: it works in a client-only
install, where the server packages' dependencies are absent.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

DEFAULT_CSV = Path(__file__).resolve().parents[3] / "shared/data/torchvision_classification.csv"
"""The torchvision metadata CSV, in the ``shared/`` folder beside the repository."""

_GLOBAL_OPTIONS_WITH_VALUE = ("--log-level",)

COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("understudy.cli.models", "model-variant artifacts and profiling"),
    "agent": ("understudy.cli.agent", "run a server's agent and its Triton"),
    "sim": ("understudy.cli.sim", "discrete-event simulator of large edge clusters"),
    "controller": ("understudy.cli.controller", "run the controller (FastAPI + Redis)"),
    "testbed": ("understudy.cli.testbed", "local testbed: Redis, controller, agents"),
    "graph": ("understudy.cli.graph", "stateful service graphs with NSPB replication"),
    "gateway": ("understudy.cli.gateway", "inference gateway: KServe v2 endpoints per app"),
    "parity": ("understudy.cli.parity", "parity models (ParM): train them for a deployed variant"),
    "credentials": ("understudy.cli.credentials",
                    "credentials of the controller and its clients; a TLS CA and certificate"),
}
"""Top-level command -> (module, one-line help).

Each module defines ``register(parser)`` (adds its options and actions to the command's own
``argparse`` parser) and ``run(options) -> int``. It is imported only when its command runs.
"""


def _command_index(args: Sequence[str]) -> int | None:
    index = 0
    while index < len(args):
        token = args[index]
        if token in _GLOBAL_OPTIONS_WITH_VALUE:
            index += 2
        elif token.startswith("-"):
            index += 1
        else:
            return index
    return None


def command_token(args: Sequence[str]) -> str | None:
    """The command named by ``args`` (the first argument that is not a global option)."""
    index = _command_index(args)
    return None if index is None else args[index]


def load_command(name: str) -> ModuleType | None:
    """The module of command ``name``; None for ``demo``, ``profiles`` and unknown names."""
    entry = COMMANDS.get(name)
    return importlib.import_module(entry[0]) if entry is not None else None


def build_parser(command: str | None = None,
                 module: ModuleType | None = None) -> argparse.ArgumentParser:
    """The ``understudy`` parser; only ``command`` (with its ``module``) gets its options."""
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
    if command == "profiles":
        _register_profiles(profiles)
    for name, (_, help_text) in COMMANDS.items():
        command_parser = commands.add_parser(name, help=help_text)
        if name == command and module is not None:
            module.register(command_parser)
    return parser


def _register_profiles(profiles: argparse.ArgumentParser) -> None:
    from model_repo.profiles import PROFILE_DIR

    actions = profiles.add_subparsers(dest="profiles_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="regenerate the JSON profiles from the CSV")
    build.add_argument("--csv", type=Path, default=DEFAULT_CSV,
                       help=f"torchvision metadata CSV (default {DEFAULT_CSV})")
    build.add_argument("--out", type=Path, default=PROFILE_DIR,
                       help=f"output folder (default {PROFILE_DIR})")
    show = actions.add_parser("show", help="print the profiles as a table")
    show.add_argument("--family", help="list this family's variants instead of the summary")
    show.add_argument("--store", type=Path, action="append", default=[],
                      help="also the families imported into this artifact store (repeatable)")
    show.add_argument("--dir", type=Path, default=None,
                      help=f"profile folder (default {PROFILE_DIR})")


def _split_demo(args: list[str]) -> tuple[list[str], list[str]] | None:
    """Split ``[global options] demo REST`` into the part we parse and REST, untouched."""
    index = _command_index(args)
    if index is None or args[index] != "demo":
        return None
    return args[: index + 1], args[index + 1:]


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
        demo = importlib.import_module("understudy.cli.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "understudy.cli.demo":
            raise
        logger.error("the demo module (understudy/cli/demo.py) is not installed in this checkout")
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


def _profiles_show(profile_dir: Path | None, family_name: str | None,
                   stores: Sequence[Path] = ()) -> int:
    from model_repo.profiles import family_from_document, load_family_documents

    docs = load_family_documents(profile_dir, stores)
    families = {name: family_from_document(doc) for name, doc in docs.items()}
    if family_name is None:
        header = ["family", "origin", "variants", "smallest memory_mb", "largest memory_mb",
                  "max demand difference (MB)"]
        rows = [[name, docs[name].origin, str(len(fam.variants)),
                 f"{fam.smallest.memory_mb:.1f}", f"{fam.largest.memory_mb:.1f}",
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
    source = {v.name: v.accuracy_source for v in docs[family_name].variants}
    header = ["variant", "memory_mb", "compute_per_rps", "latency_ms (ref)", "accuracy",
              "top1 %", "top1 source", "size_mb"]
    rows = [[v.name, f"{v.memory_mb:.1f}", f"{v.compute_per_rps:.4f}",
             f"{v.latency_ms['reference']:.3f}", f"{v.accuracy:.4f}",
             f"{v.top1_pct:.3f}" if v.top1_pct is not None else "-", source[v.name],
             f"{v.size_mb:.1f}" if v.size_mb is not None else "-"]
            for v in family.variants]
    print(f"family {family.name} ({docs[family_name].origin}, {len(family.variants)} variants, "
          f"smallest memory first)")
    print(_table(header, rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``understudy`` command line; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] | None = None
    split = _split_demo(args)
    if split is not None:
        args, passthrough = split
    command = command_token(args)
    module = load_command(command) if command is not None else None
    options = build_parser(command, module).parse_args(args)
    _configure_logging(options.log_level)
    if options.command == "demo":
        return _run_demo(passthrough or [])
    if module is not None:
        return int(module.run(options) or 0)
    from model_repo.profiles import ProfileError

    try:
        if options.profiles_command == "build":
            return _profiles_build(options.csv, options.out)
        return _profiles_show(options.dir, options.family, options.store)
    except ProfileError as exc:
        logger.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
