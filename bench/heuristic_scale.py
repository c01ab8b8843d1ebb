"""Scale benchmark of the progressive-failover heuristic (FailLite Algorithm 1).

Builds (seeded) a synthetic cluster: ``--servers`` live servers in 10 sites, each about
70-80 % full of unaffected primaries, plus failed servers that held the primaries of the
``--apps`` affected apps (families of 4 variants, 50..2500 MB). Outside the timed region it
builds the snapshot; it then times ``policies.progressive.plan_progressive`` and the direct
reference (``policies/progressive_reference.py``, a full server scan per placement attempt)
on the same instance, asserts both give the same plan, and prints medians. The last line is
one JSON object.

Memory is in whole MB and compute in multiples of 1/64, so every sum is exact and the two
implementations must agree to the bit.

    .venv/bin/python bench/heuristic_scale.py [--apps 3000 --servers 1000 --runs 7 --seed 0]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run from a checkout: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.actions import ProgressivePlan  # noqa: E402
from policies.model import (  # noqa: E402
    Application,
    ClusterSnapshot,
    Family,
    Placement,
    Role,
    Server,
    Site,
    Variant,
)
from policies.progressive import plan_progressive  # noqa: E402
from policies.progressive_reference import reference_plan_progressive  # noqa: E402
from policies.resources import COMPUTE, MEMORY_MB, Resources  # noqa: E402

SITES = 10
MEMORY_MB_PER_SERVER = 16000.0
COMPUTE_PER_SERVER = 100.0
VARIANTS = 4
FAMILIES = 60


def make_families(rng: random.Random) -> list[Family]:
    """Families of 4 variants in 50..2500 MB, accuracy rising with size to 1.0."""
    out = []
    for f in range(FAMILIES):
        name = f"fam-{f:03d}"
        memory = [rng.randint(50, 120), rng.randint(150, 400), rng.randint(450, 1100),
                  rng.randint(1200, 2500)]
        accuracy = sorted(rng.uniform(0.55, 0.98) for _ in memory[:-1]) + [1.0]
        latency = [round(rng.uniform(1.0, 3.0) * (j + 1) ** 1.5, 3) for j in range(len(memory))]
        out.append(Family(name, tuple(
            Variant(f"{name}-v{j}", name, round(accuracy[j], 4),
                    Resources({MEMORY_MB: float(m)}), compute_per_rps=(j + 1) / 64,
                    latency_ms={"reference": latency[j]})
            for j, m in enumerate(memory))))
    return out


def make_fillers() -> Family:
    """One family whose variants occupy 500..4000 MB: the background load of live servers."""
    return Family("filler", tuple(
        Variant(f"filler-{m}", "filler", 1.0 - m / 10000, Resources({MEMORY_MB: float(m)}),
                compute_per_rps=0.5)
        for m in range(500, 4001, 500)))


def affected_apps(rng: random.Random, families: list[Family], count: int) -> list[Application]:
    apps = []
    for i in range(count):
        family = rng.choice(families)
        slo = None
        if rng.random() < 0.3:  # an SLO that rules out the largest variant or two
            cut = rng.choice((1, 2))
            slo = family.variants[-cut].latency_ms["reference"] - 0.001
        excluded = frozenset({f"site-{rng.randrange(SITES):02d}"}) if rng.random() < 0.1 else ()
        apps.append(Application(f"app-{i:05d}", family.name, critical=rng.random() < 0.2,
                                max_rate_rps=float(rng.randint(1, 20)), latency_slo_ms=slo,
                                excluded_sites=frozenset(excluded)))
    return apps


def build_instance(apps: int, servers: int, seed: int,
                   fill: float = 0.75) -> tuple[ClusterSnapshot, list[str]]:
    rng = random.Random(seed)
    families = make_families(rng)
    fillers = make_fillers()
    capacity = Resources({MEMORY_MB: MEMORY_MB_PER_SERVER, COMPUTE: COMPUTE_PER_SERVER})
    sites = [Site(f"site-{s:02d}") for s in range(SITES)]
    live = [Server(f"srv-{k:05d}", sites[k % SITES].site_id, capacity) for k in range(servers)]
    app_list: list[Application] = []
    placements: list[Placement] = []
    for server in live:  # background primaries: fill ± 5 % of memory (default 70-80 %)
        budget = MEMORY_MB_PER_SERVER * min(1.0, rng.uniform(fill - 0.05, fill + 0.05))
        while budget >= 500:
            size = min(rng.randrange(500, 4001, 500), int(budget) // 500 * 500)
            filler = Application(f"bg-{len(app_list):06d}", "filler",
                                 primary_variant=f"filler-{size}",
                                 max_rate_rps=float(rng.randint(1, 16)))
            app_list.append(filler)
            placements.append(Placement(filler.app_id, server.server_id, f"filler-{size}",
                                        Role.PRIMARY))
            budget -= size
    by_name = {f.name: f for f in families}
    affected = affected_apps(rng, families, apps)
    failed: list[Server] = []
    room = Resources()
    for app in affected:  # primaries first-fit on servers that are now failed
        variant = by_name[app.family].most_accurate
        demand = variant.demand(app.max_rate_rps)
        if not failed or not demand.fits_within(room):
            failed.append(Server(f"dead-{len(failed):05d}", rng.choice(sites).site_id, capacity))
            room = capacity
        room = room - demand
        placements.append(Placement(app.app_id, failed[-1].server_id, variant.name, Role.PRIMARY))
    snapshot = ClusterSnapshot(
        families={f.name: f for f in [*families, fillers]}, sites=tuple(sites),
        servers=tuple(live + failed), apps=tuple(app_list + affected),
        placements=tuple(placements), failed_servers=frozenset(s.server_id for s in failed))
    return snapshot, [a.app_id for a in affected]


def timed(runs: int, call: Callable[[], ProgressivePlan]) -> tuple[list[float], ProgressivePlan]:
    times = []
    plan = ProgressivePlan(recoveries=(), unrecoverable=())
    for _ in range(max(1, runs)):
        gc.collect()  # so no run pays for the previous run's garbage
        start = time.perf_counter()
        plan = call()
        times.append(time.perf_counter() - start)
    return times, plan


def same_plan(fast: ProgressivePlan, ref: ProgressivePlan) -> bool:
    """Recoveries, unrecoverable app ids (reasons are free text) and δ must match exactly."""
    return (fast.recoveries == ref.recoveries and fast.demand_ratio == ref.demand_ratio
            and [u.app_id for u in fast.unrecoverable] == [u.app_id for u in ref.unrecoverable])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, default=3000)
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7, help="timed runs of the fast heuristic")
    parser.add_argument("--reference-runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fill", type=float, default=0.75,
                        help="mean share of live servers' memory used before the failure")
    args = parser.parse_args()

    start = time.perf_counter()
    snapshot, app_ids = build_instance(args.apps, args.servers, args.seed, args.fill)
    print(f"instance: {len(app_ids)} affected apps, {len(snapshot.free)} live servers, "
          f"{len(snapshot.failed_servers)} failed, {len(snapshot.apps)} apps in all "
          f"(built in {time.perf_counter() - start:.1f} s)")

    fast_times, fast = timed(args.runs, lambda: plan_progressive(snapshot, app_ids))
    ref_times, ref = timed(args.reference_runs,
                           lambda: reference_plan_progressive(snapshot, app_ids))
    if not same_plan(fast, ref):
        raise SystemExit("fast and reference plans differ")
    upgraded = sum(r.target_variant != r.interim_variant for r in fast.recoveries)
    median, ref_median = statistics.median(fast_times), statistics.median(ref_times)
    print(f"demand ratio δ = {fast.demand_ratio:.3f}; recovered {len(fast.recoveries)} "
          f"({upgraded} with an upgrade after the interim), unrecoverable "
          f"{len(fast.unrecoverable)}")
    print(f"fast:      median {median * 1000:.1f} ms over {args.runs} runs "
          f"(min {min(fast_times) * 1000:.1f} ms)")
    print(f"reference: median {ref_median:.2f} s over {args.reference_runs} runs; plans identical")
    print(json.dumps({
        "median_s": round(median, 4), "reference_median_s": round(ref_median, 4),
        "speedup": round(ref_median / median, 1), "apps": len(app_ids),
        "servers": len(snapshot.free), "variants": VARIANTS,
        "recovered": len(fast.recoveries), "unrecoverable": len(fast.unrecoverable),
        "runs": args.runs, "reference_runs": args.reference_runs, "seed": args.seed,
        "fill": args.fill,
        "demand_ratio": round(fast.demand_ratio, 4)}))


if __name__ == "__main__":
    main()
