"""``understudy models build|profile|list``: the artifact store and the profiler."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_STORE = Path("runs/artifacts")
DEMO_FAMILIES = ("mobilenet_v3", "shufflenet_v2", "convnext", "efficientnet", "regnet_y")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``models`` options and actions to its command parser."""
    from model_repo.artifacts import DEFAULT_SCALE

    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="write Triton model directories with seeded weights")
    build.add_argument("--families", type=_csv, default=list(DEMO_FAMILIES),
                       help=f"comma-separated families (default: {','.join(DEMO_FAMILIES)})")
    build.add_argument("--variants", type=_csv, default=None,
                       help="only these variants (comma-separated)")
    build.add_argument("--scale", type=float, default=DEFAULT_SCALE,
                       help=f"weight size = profiled size x scale (default {DEFAULT_SCALE})")
    build.add_argument("--out", type=Path, default=DEFAULT_STORE,
                       help=f"artifact store directory (default {DEFAULT_STORE})")
    build.add_argument("--rebuild", action="store_true", help="rewrite existing weights")
    listing = actions.add_parser("list", help="list the variants in an artifact store")
    listing.add_argument("--store", type=Path, default=DEFAULT_STORE)
    profile = actions.add_parser("profile", help="measure variants on a real Triton")
    profile.add_argument("--store", type=Path, default=DEFAULT_STORE)
    profile.add_argument("--families", type=_csv, default=None)
    profile.add_argument("--variants", type=_csv, default=None)
    profile.add_argument("--repeats", type=int, default=5)
    profile.add_argument("--requests", type=int, default=50,
                         help="batch-1 requests for the latency percentiles")
    profile.add_argument("--work-dir", type=Path, default=Path("runs/profiler"))
    profile.add_argument("--profiles-dir", type=Path, default=None,
                         help="profile documents to update (default: the packaged ones)")
    profile.add_argument("--no-write", action="store_true",
                         help="print the figures without updating the profile files")


def run(options: argparse.Namespace) -> int:
    """Dispatch ``models`` actions; returns an exit status."""
    from model_repo.artifacts import ArtifactError
    from model_repo.profiles import ProfileError

    try:
        if options.models_command == "build":
            return _build(options)
        if options.models_command == "list":
            return _list(options.store)
        return _profile(options)
    except (ArtifactError, ProfileError, ValueError) as exc:
        logger.error("%s", exc)
        return 2


def _build(options: argparse.Namespace) -> int:
    from model_repo.artifacts import build_store
    from model_repo.profiles import load_families

    families = load_families()
    unknown = sorted(set(options.families) - set(families))
    if unknown:
        raise ValueError(f"unknown families: {', '.join(unknown)}")
    manifests = build_store(options.out, [families[f] for f in options.families],
                            scale=options.scale, variants=options.variants,
                            rebuild=options.rebuild)
    total = sum(m.weights_mb for m in manifests)
    sys.stdout.write(f"{len(manifests)} variants, {total:.0f} MB of weights in {options.out}\n")
    return 0


def _list(store: Path) -> int:
    from model_repo.artifacts import list_store

    entries = list_store(store)
    for entry in entries:
        spec = entry.manifest.network
        sys.stdout.write(f"{entry.family:16} {entry.variant:28} {entry.manifest.weights_mb:9.1f} MB"
                         f"  width {spec.width:5} hidden {spec.hidden_layers:4}\n")
    sys.stdout.write(f"{len(entries)} variants\n")
    return 0


def _profile(options: argparse.Namespace) -> int:
    from agent.profiler import ProfileSettings, profile_store
    from model_repo.artifacts import list_store
    from model_repo.profiles import (
        PROFILE_DIR,
        apply_measurement,
        dump_document,
    )

    variants = options.variants
    if options.families:
        variants = [e.variant for e in list_store(options.store) if e.family in options.families
                    and (options.variants is None or e.variant in options.variants)]
    settings = ProfileSettings(repeats=options.repeats, latency_requests=options.requests)

    def show(entry: Any, m: Any) -> None:
        sys.stdout.write(
            f"{entry.family:14} {entry.variant:26} {m.weights_mb:8.1f} MB  load {m.load_s:6.3f} s"
            f"  unload {m.unload_s:6.3f} s  p50 {m.latency_p50_ms:7.2f} ms"
            f"  p99 {m.latency_p99_ms:7.2f} ms  resident {m.resident_mb or 0:8.1f} MB\n")
        sys.stdout.flush()

    results, fit = profile_store(options.store, options.work_dir, variants, settings, show)
    if fit is not None:
        sys.stdout.write(f"fit: load_s = {fit.intercept_s:.4f} + {fit.slope_s_per_mb:.6f} * "
                         f"weights_mb  (r2 {fit.r2:.3f}, {fit.variants} variants)\n")
    if not options.no_write:
        directory = options.profiles_dir or PROFILE_DIR
        by_family: dict[str, list[Any]] = {}
        for entry, measurement in results.values():
            by_family.setdefault(entry.family, []).append((entry.variant, measurement))
        for family, items in by_family.items():
            path = directory / f"{family}.json"
            doc = json.loads(path.read_text(encoding="utf-8"))
            for variant, measurement in items:
                apply_measurement(doc, variant, measurement)
            if fit is not None:
                doc["load_time_fit"] = fit.model_dump()
            path.write_text(dump_document(doc), encoding="utf-8")
        sys.stdout.write(f"updated {len(by_family)} profile documents in {directory}\n")
    return 0
