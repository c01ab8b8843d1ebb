"""``understudy models build|import|train-digits|train-early-exit|profile|profile-early-exit|list``.

``build`` writes the synthetic families (generated networks with seeded weights) and, unless
``--no-digits``, trains the real ``digits`` family and imports it (both cached), and with
``--early-exit`` the dynamic ``digits_ee`` family too (``train-early-exit`` trains it alone,
``profile-early-exit`` measures its served execution-time distribution); ``import``
brings a user's family in from its manifest (``docs/models.md``); ``profile`` measures the
synthetic variants on a real Triton; ``list`` says which variants are synthetic.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_STORE = Path("runs/artifacts")
DEFAULT_DIGITS_DIR = Path("runs/digits")
DEFAULT_EARLY_EXIT_DIR = Path("runs/digits_ee")
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
    build.add_argument("--no-digits", action="store_true",
                       help="skip training and importing the real digits family")
    build.add_argument("--digits-dir", type=Path, default=DEFAULT_DIGITS_DIR,
                       help=f"where the digits family is trained (default {DEFAULT_DIGITS_DIR})")
    build.add_argument("--early-exit", action="store_true",
                       help="also train and import the early-exit digits_ee family (a dynamic "
                            f"model; trained in {DEFAULT_EARLY_EXIT_DIR})")
    imports = actions.add_parser("import", help="import a family of your models from its "
                                 "manifest: check, store, profile on Triton, measure accuracy")
    imports.add_argument("manifest", type=Path, help="the family manifest (YAML or JSON)")
    imports.add_argument("--store", type=Path, default=DEFAULT_STORE,
                         help=f"artifact store directory (default {DEFAULT_STORE})")
    imports.add_argument("--force", action="store_true",
                         help="profile again even if the store is up to date")
    imports.add_argument("--check", action="store_true",
                         help="only check the manifest (no store, no Triton)")
    _measure_options(imports, repeats=3, work_dir=Path("runs/import"))
    digits = actions.add_parser("train-digits", help="train the digits family (scikit-learn's "
                                "digits) and write its manifest, ONNX and TorchScript files")
    digits.add_argument("--out", type=Path, default=DEFAULT_DIGITS_DIR,
                        help=f"output folder (default {DEFAULT_DIGITS_DIR})")
    digits.add_argument("--force", action="store_true", help="train again even if cached")
    early = actions.add_parser("train-early-exit", help="train the early-exit digits_ee family "
                               "(a dynamic model) and write its manifest and TorchScript files")
    early.add_argument("--out", type=Path, default=DEFAULT_EARLY_EXIT_DIR,
                       help=f"output folder (default {DEFAULT_EARLY_EXIT_DIR})")
    early.add_argument("--force", action="store_true", help="train again even if cached")
    probe = actions.add_parser("profile-early-exit", help="serve early-exit variants on a fresh "
                               "Triton at batch 1: per-exit latency, execution-time p50/p99")
    probe.add_argument("--store", type=Path, default=DEFAULT_STORE)
    probe.add_argument("--variants", type=_csv, default=["digits_ee", "digits_ee_s"])
    probe.add_argument("--requests", type=int, default=300,
                       help="held-out digits sent, one request each (default 300)")
    probe.add_argument("--work-dir", type=Path, default=Path("runs/early_exit_probe"))
    probe.add_argument("--device", choices=["auto", "cpu", "gpu"], default="cpu")
    listing = actions.add_parser("list", help="list the variants in an artifact store")
    listing.add_argument("--store", type=Path, default=DEFAULT_STORE)
    profile = actions.add_parser("profile", help="measure the synthetic variants on a real "
                                 "Triton")
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


def _measure_options(parser: argparse.ArgumentParser, repeats: int, work_dir: Path) -> None:
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"loads per variant, the median reported (default {repeats})")
    parser.add_argument("--requests", type=int, default=50,
                        help="batch-1 requests for the latency percentiles")
    parser.add_argument("--work-dir", type=Path, default=work_dir,
                        help=f"Triton's repository and logs (default {work_dir})")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                        help="where the models run (auto: GPU 0 when NVML finds one)")


def run(options: argparse.Namespace) -> int:
    """Dispatch ``models`` actions; returns an exit status."""
    from agent.triton_config import TritonError
    from model_repo.artifacts import ArtifactError
    from model_repo.profiles import ProfileError

    actions = {"build": _build, "import": _import, "train-digits": _train_digits,
               "train-early-exit": _train_early_exit, "profile-early-exit": _profile_early_exit,
               "list": lambda o: _list(o.store), "profile": _profile}
    try:
        return int(actions[options.models_command](options))
    except (ArtifactError, ProfileError, TritonError, ValueError) as exc:
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
    sys.stdout.write(f"{len(manifests)} synthetic variants, {total:.0f} MB of weights in "
                     f"{options.out}\n")
    status = 0
    if not options.no_digits:
        from model_repo.digits import MANIFEST_NAME, train_digits

        train_digits(options.digits_dir)
        status = _import(_import_options(options.digits_dir / MANIFEST_NAME, options.out))
    if status == 0 and options.early_exit:
        from model_repo.digits_ee import MANIFEST_NAME as EE_MANIFEST
        from model_repo.digits_ee import train_early_exit

        train_early_exit(DEFAULT_EARLY_EXIT_DIR)
        status = _import(_import_options(DEFAULT_EARLY_EXIT_DIR / EE_MANIFEST, options.out))
    return status


def _import_options(manifest: Path, store: Path) -> argparse.Namespace:
    return argparse.Namespace(manifest=manifest, store=store, force=False, check=False,
                              repeats=3, requests=30, work_dir=Path("runs/import"),
                              device="auto")


def _train_early_exit(options: argparse.Namespace) -> int:
    from model_repo.digits_ee import MANIFEST_NAME, train_early_exit

    record = train_early_exit(options.out, force=options.force)
    for name, variant in record["variants"].items():
        mix = " ".join(f"{share:.2f}" for share in variant["exit_fractions"])
        heads = " ".join(f"{top1:.3f}" for top1 in variant["top1_per_exit_head"])
        sys.stdout.write(f"{name:12} {variant['parameters']:9d} params  held-out top-1 "
                         f"{variant['top1']:.4f}  exit mix {mix}  per-exit top-1 {heads}\n")
    sys.stdout.write(f"family manifest: {options.out / MANIFEST_NAME} "
                     f"(understudy models import {options.out / MANIFEST_NAME})\n")
    return 0


def _profile_early_exit(options: argparse.Namespace) -> int:
    from agent.early_exit_probe import profile_variants

    if not 1 <= options.requests <= 100_000:
        raise ValueError("--requests must be between 1 and 100000")
    results = profile_variants(options.store, options.variants, options.work_dir,
                               options.requests, options.device)
    for name, result in results.items():
        sys.stdout.write(f"{name}: {result['requests']} requests at batch 1, top-1 "
                         f"{result.get('top1')}\n")
        sys.stdout.write("  exit  share  exec_us p50  round trip us p50\n")
        for row in result["per_exit"]:
            sys.stdout.write(f"  {row['exit']:4d}  {row['share']:.3f}  {row['exec_us_p50']:11.1f}"
                             f"  {row['round_trip_us_p50']:17.1f}\n")
        sys.stdout.write(f"  exec_us p50 {result['exec_us_p50']}  p99 {result['exec_us_p99']}  "
                         f"p99/p50 {result['exec_p99_over_p50']}  cv {result['exec_us_cv']}\n")
    sys.stdout.write(json.dumps(results, sort_keys=True) + "\n")
    return 0


def _train_digits(options: argparse.Namespace) -> int:
    from model_repo.digits import MANIFEST_NAME, train_digits

    record = train_digits(options.out, force=options.force)
    for name, variant in record["variants"].items():
        sys.stdout.write(f"{name:16} {variant['format']:12} {variant['parameters']:9d} params"
                         f"  held-out top-1 {variant['top1']:.4f}\n")
    sys.stdout.write(f"family manifest: {options.out / MANIFEST_NAME} "
                     f"(understudy models import {options.out / MANIFEST_NAME})\n")
    return 0


def _import(options: argparse.Namespace) -> int:
    from agent.model_import import import_family
    from agent.profiler import ProfileSettings
    from model_repo.family_manifest import load_family_manifest

    family = load_family_manifest(options.manifest)
    if options.check:
        sys.stdout.write(f"{options.manifest}: family {family.family}, "
                         f"{len(family.variants)} variants, evaluation set "
                         f"{family.evaluation.count if family.evaluation else 'none'}: ok\n")
        return 0

    def show(result: Any) -> None:
        m = result.measurement
        top1 = (f"top-1 {result.top1:.4f} measured" if result.top1 is not None
                else f"top-1 {result.declared_top1:.4f} declared")
        sys.stdout.write(
            f"{result.manifest.variant:24} {result.manifest.format:11} {m.weights_mb:8.3f} MB"
            f"  load {m.load_s * 1000:7.1f} ms  resident {m.resident_mb or 0:7.1f} MB"
            f"  p50 b1 {m.latency_p50_ms:6.2f} ms  {top1}\n")
        sys.stdout.flush()

    settings = ProfileSettings(repeats=options.repeats, latency_requests=options.requests)
    outcome = import_family(options.manifest, options.store, options.work_dir, settings,
                            force=options.force, device=options.device, progress=show)
    verb = "up to date" if outcome.skipped else "imported"
    sys.stdout.write(f"family {outcome.family} {verb}: profile {outcome.profile}\n")
    return 0


def _list(store: Path) -> int:
    from model_repo.artifacts import list_store

    entries = list_store(store)
    for entry in entries:
        manifest = entry.manifest
        if manifest.synthetic:
            spec = manifest.network
            detail = f"synthetic    width {spec.width:5} hidden {spec.hidden_layers:4}"
        else:
            detail = f"imported     {manifest.format}"
        sys.stdout.write(f"{entry.family:16} {entry.variant:28} {manifest.weights_mb:9.3f} MB"
                         f"  {detail}\n")
    synthetic = sum(1 for e in entries if e.manifest.synthetic)
    sys.stdout.write(f"{len(entries)} variants ({synthetic} synthetic: generated networks with "
                     f"seeded weights; {len(entries) - synthetic} imported)\n")
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
