"""Load time per variant on a real Triton, for 3 families x 3 sizes, with the fitted a + b * MB.

Usage: ``python bench/load_times.py [--store DIR] [--scale S] [--repeats N]``. Builds the needed
artifacts (seeded weights, profiled size x scale) if the store lacks them, profiles the smallest,
a middle and the largest variant of each family on one fresh Triton (median of ``repeats`` loads),
and prints a table, the least-squares fit, and per family the ratio of the largest variant's load
time to the smallest's (target: >= 3x). The last line is one JSON object.

The bench defaults to scale 1.0 (weights of the real profiled size, 4.2 GB for these nine
variants, built once into their own store), not the demo store's 0.35: every load through
Triton's Python backend pays a size-independent ~0.3 s here (the stub process starts, about
0.09 s, and imports NumPy, about 0.15 s on this CPU, before our code runs), and at 0.35 the
smallest efficientnet is 7 MB, so that fixed cost would hide the size effect the bench measures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.profiler import ProfileSettings, profile_store  # noqa: E402
from model_repo.artifacts import DEFAULT_SCALE, build_store  # noqa: E402
from model_repo.profiles import load_families  # noqa: E402

FAMILIES = ("convnext", "efficientnet", "regnet_y")
BENCH_SCALE = 1.0


def _three_sizes(family: object) -> list[str]:
    variants = family.variants  # type: ignore[attr-defined]
    by_size = sorted(variants, key=lambda v: v.size_mb)
    picks = [by_size[0], by_size[len(by_size) // 2], by_size[-1]]
    return list(dict.fromkeys(v.name for v in picks))


def main() -> int:
    """Run the benchmark; print the table and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None,
                        help="artifact store (default: runs/artifacts-bench-<scale>)")
    parser.add_argument("--scale", type=float, default=BENCH_SCALE,
                        help=f"weight size / profiled size (demo store: {DEFAULT_SCALE})")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--families", default=",".join(FAMILIES))
    options = parser.parse_args()
    if options.store is None:
        options.store = REPO / "runs" / f"artifacts-bench-{options.scale:g}"
    logging.basicConfig(level=logging.WARNING)

    families = load_families()
    chosen = [families[name] for name in options.families.split(",")]
    variants = [name for family in chosen for name in _three_sizes(family)]
    build_store(options.store, chosen, scale=options.scale, variants=variants)
    settings = ProfileSettings(repeats=options.repeats, latency_requests=options.requests)
    results, fit = profile_store(options.store, REPO / "runs" / "bench-load-times", variants,
                                 settings)
    print(f"{'family':14} {'variant':24} {'weights MB':>10} {'load s':>8} {'unload s':>8} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'resident MB':>11}")
    rows = []
    for name in variants:
        entry, m = results[name]
        print(f"{entry.family:14} {name:24} {m.weights_mb:10.1f} {m.load_s:8.3f} {m.unload_s:8.3f} "
              f"{m.latency_p50_ms:8.2f} {m.latency_p99_ms:8.2f} {m.resident_mb or 0:11.1f}")
        rows.append({"family": entry.family, "variant": name, "weights_mb": m.weights_mb,
                     "load_s": round(m.load_s, 4), "load_s_runs": m.load_s_runs,
                     "unload_s": round(m.unload_s, 4),
                     "latency_p50_ms": round(m.latency_p50_ms, 3),
                     "latency_p99_ms": round(m.latency_p99_ms, 3),
                     "resident_mb": m.resident_mb})
    ratios = {}
    for family in chosen:
        names = _three_sizes(family)
        ratios[family.name] = round(results[names[-1]][1].load_s / results[names[0]][1].load_s, 2)
    assert fit is not None  # noqa: S101 - nine variants always give a fit
    print(f"fit: load_s = {fit.intercept_s:.4f} + {fit.slope_s_per_mb:.6f} * weights_mb "
          f"(r2 {fit.r2:.3f}, scale {options.scale})")
    print("largest / smallest load time per family: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(json.dumps({"fit_intercept_s": round(fit.intercept_s, 5),
                      "fit_slope_s_per_mb": round(fit.slope_s_per_mb, 7),
                      "fit_r2": round(fit.r2, 4), "scale": options.scale,
                      "repeats": options.repeats,
                      "largest_over_smallest": ratios,
                      "min_largest_over_smallest": min(ratios.values()),
                      "variants": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
