"""NSPB benchmark: latency overhead against bare, recovery time, and a failover campaign.

1. Latency (real replica processes over TCP, this machine): for the SP-like and OL-like
   services, three deployments run side by side — ``bare``, ``nspb`` and ``remus`` — and are
   measured in interleaved rounds of one batch each (the order rotates every round) at batch
   sizes 1, 16 and 64.
   The client keeps one batch in flight (closed loop, ``batch`` requests at a time, one stream
   per request so LSTM state grows with the batch as in HAMS §VI-B); the figure is the median
   per-request latency from submit to reply. Overhead = median(mode) / median(bare) - 1.
2. Recovery (real processes): during a stream, SIGKILL the primary of a stateful operator and
   time from the kill to the end of the manager's recovery (detection by the process watch,
   freeze, fence, promotion, resume), ``--kills`` times per service.
3. Campaign (the deterministic simulator: the same cores and torch operators, seeded noise on
   every execution, lossy reordering network): randomized failover trials until each of
   ``nspb`` and ``strawman`` has seen ``--failovers`` crashed stateful primaries; the checker
   counts inconsistencies.

The last line is one JSON object.

    python bench/nspb.py [--batches 1,16,64 --iters 40 --kills 6 --failovers 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stateful.campaign import run_trial  # noqa: E402
from stateful.core.frontend import ClientRequest  # noqa: E402
from stateful.messages import Mode, RuntimeOptions  # noqa: E402
from stateful.runtime import LocalGraph  # noqa: E402
from stateful.services import request_maker, service_graph  # noqa: E402

MODES = (Mode.BARE, Mode.NSPB, Mode.REMUS)


async def one_batch(graph: LocalGraph, make: Callable[[int], ClientRequest], start: int,
                    size: int) -> list[float]:
    """Submit ``size`` requests at once; per-request latency in ms."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    futures = graph.submit_many_nowait([make(start + i) for i in range(size)])
    done: list[float] = []
    for future in futures:
        future.add_done_callback(lambda _f: done.append((loop.time() - sent) * 1e3))
    await asyncio.wait_for(asyncio.gather(*futures), 120.0)
    return done


async def latency(service: str, args: argparse.Namespace, run_dir: Path,
                  log: Callable[[str], None]) -> tuple[dict[str, float], LocalGraph]:
    batches = args.batches
    graphs = {m: LocalGraph(service_graph(service, batches[0], scale=args.scale,
                                          depth=args.depth, side=args.side),
                            RuntimeOptions(mode=m, link_mbps=args.link_mbps or None),
                            run_dir=run_dir / f"{service}-{m.value}",
                            spares=2 if m is Mode.NSPB else 0)
              for m in MODES}
    started = time.perf_counter()
    await asyncio.gather(*(g.start() for g in graphs.values()))
    log(f"{service}: 3 deployments up in {time.perf_counter() - started:.1f} s")
    out: dict[str, float] = {}
    counter = 0
    try:
        for batch in batches:
            await asyncio.gather(*(g.set_batch_size(batch) for g in graphs.values()))
            make = request_maker(service, seed=batch, streams=batch, side=args.side)
            samples: dict[Mode, list[float]] = {m: [] for m in MODES}
            for rnd in range(args.warmup + args.iters):
                # One batch per mode per round, the order rotating: every mode sees the same
                # background load (this machine is shared), and no mode always goes first.
                for mode in MODES[rnd % 3:] + MODES[:rnd % 3]:
                    counter += batch
                    lat = await one_batch(graphs[mode], make, counter, batch)
                    if rnd >= args.warmup:
                        samples[mode] += lat
            med = {m: statistics.median(samples[m]) for m in MODES}
            for m in MODES:
                out[f"{service}_b{batch}_{m.value}_ms"] = round(med[m], 2)
            nspb = (med[Mode.NSPB] / med[Mode.BARE] - 1) * 100
            remus = (med[Mode.REMUS] / med[Mode.BARE] - 1) * 100
            out[f"{service}_b{batch}_overhead_nspb_pct"] = round(nspb, 2)
            out[f"{service}_b{batch}_overhead_remus_pct"] = round(remus, 2)
            log(f"{service} batch {batch:3d}: bare {med[Mode.BARE]:8.2f} ms  nspb "
                f"{med[Mode.NSPB]:8.2f} ms ({nspb:+6.2f} %)  remus {med[Mode.REMUS]:8.2f} ms "
                f"({remus:+6.2f} %)")
    finally:
        await asyncio.gather(*(g.stop() for m, g in graphs.items() if m is not Mode.NSPB))
    return out, graphs[Mode.NSPB]


async def recovery(service: str, graph: LocalGraph, args: argparse.Namespace,
                   log: Callable[[str], None]) -> list[tuple[float, float]]:
    """(kill -> recovery done, kill -> failure signal) in ms, per kill."""
    await graph.set_batch_size(args.recovery_batch)
    make = request_maker(service, seed=99, streams=args.recovery_batch, side=args.side)
    stateful = sorted(graph.graph.topology.stateful)
    times: list[tuple[float, float]] = []
    counter = 10_000_000
    for k in range(args.kills):
        await graph.wait_replicated(timeout_s=120.0, standbys=1)
        op = stateful[k % len(stateful)]
        node = graph.node_of(op, "primary")
        assert node is not None
        stop = asyncio.Event()

        async def load(stop: asyncio.Event = stop) -> None:
            nonlocal counter
            while not stop.is_set():
                counter += args.recovery_batch
                await one_batch(graph, make, counter, args.recovery_batch)

        task = asyncio.ensure_future(load())
        await asyncio.sleep(0.3)
        before = len(graph.recoveries)
        killed_at = graph.kill(node)
        await graph.wait_recoveries(before + 1, timeout_s=60.0)
        done = graph.recoveries[before]
        stop.set()
        await task
        times.append(((done.finished_at - killed_at) * 1e3, (done.started_at - killed_at) * 1e3))
        log(f"{service}: killed {node} ({op}); recovered in {times[-1][0]:.1f} ms "
            f"(signal after {times[-1][1]:.1f} ms; promoted {done.promoted})")
    return times


def campaign(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, object]:
    totals = {m: {"failovers": 0, "inconsistencies": 0, "lost": 0, "bad_trials": 0, "runs": 0}
              for m in (Mode.NSPB, Mode.STRAWMAN)}
    seed = args.seed
    started = time.perf_counter()
    while min(t["failovers"] for t in totals.values()) < args.failovers:
        for mode, total in totals.items():
            result = run_trial(seed, mode)
            total["runs"] += 1
            total["failovers"] += result.failovers
            total["inconsistencies"] += result.inconsistencies
            total["lost"] += result.lost
            total["bad_trials"] += int(result.inconsistencies > 0)
        seed += 1
    for mode, total in totals.items():
        log(f"campaign {mode.value:8s}: {total['failovers']} failovers in {total['runs']} runs, "
            f"{total['inconsistencies']} inconsistencies in {total['bad_trials']} runs, "
            f"{total['lost']} lost requests")
    log(f"campaign took {time.perf_counter() - started:.1f} s")
    return {f"campaign_{m.value}_{k}": v for m, t in totals.items() for k, v in t.items()}


async def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, object]:
    run_dir = Path(tempfile.mkdtemp(prefix="understudy-bench-nspb-"))
    out: dict[str, object] = {}
    kills: list[tuple[float, float]] = []
    for service in args.services:
        figures, nspb_graph = await latency(service, args, run_dir, log)
        out.update(figures)
        try:
            if args.kills:
                kills += await recovery(service, nspb_graph, args, log)
        finally:
            await nspb_graph.stop()
    if kills:
        total = [k[0] for k in kills]
        out["recovery_p50_ms"] = round(statistics.median(total), 1)
        out["recovery_max_ms"] = round(max(total), 1)
        out["detection_p50_ms"] = round(statistics.median(k[1] for k in kills), 1)
        out["recovery_kills"] = len(kills)
    return out


def summary(out: dict[str, object], args: argparse.Namespace) -> dict[str, object]:
    top = max(args.batches)
    nspb = [float(out[f"{s}_b{top}_overhead_nspb_pct"]) for s in args.services]  # type: ignore[arg-type]
    remus = [float(out[f"{s}_b{top}_overhead_remus_pct"]) for s in args.services]  # type: ignore[arg-type]
    head = {"overhead_nspb_pct": round(statistics.mean(nspb), 2),
            "overhead_remus_pct": round(statistics.mean(remus), 2),
            "recovery_p50_ms": out.get("recovery_p50_ms"),
            "trials": min(out.get("campaign_nspb_failovers", 0),  # type: ignore[type-var]
                          out.get("campaign_strawman_failovers", 0)),
            "inconsistencies_nspb": out.get("campaign_nspb_inconsistencies"),
            "inconsistencies_strawman": out.get("campaign_strawman_inconsistencies")}
    return {**head, "batch": top, "cpus": os.cpu_count(), **out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=lambda s: s.split(","), default=["sp", "ol"])
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")],
                        default=[1, 16, 64])
    parser.add_argument("--iters", type=int, default=40,
                        help="measured rounds per batch size (one batch per mode each)")
    parser.add_argument("--warmup", type=int, default=3, help="rounds discarded first")
    parser.add_argument("--scale", type=int, default=16, help="hidden-size multiplier")
    parser.add_argument("--depth", type=int, default=8,
                        help="hidden layers of the last stateless operator")
    parser.add_argument("--side", type=int, default=16, help="CNN input images are side x side")
    parser.add_argument("--link-mbps", type=float, default=1000.0,
                        help="emulated bandwidth between replica processes (0: loopback)")
    parser.add_argument("--kills", type=int, default=6, help="primary kills per service")
    parser.add_argument("--recovery-batch", type=int, default=16)
    parser.add_argument("--failovers", type=int, default=500,
                        help="campaign failovers per mode (0 skips the campaign)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    def log(line: str) -> None:
        print(line, flush=True)

    out = asyncio.run(measure(args, log))
    if args.failovers:
        out.update(campaign(args, log))
    result = summary(out, args)
    ratio = (result["overhead_remus_pct"] / result["overhead_nspb_pct"]  # type: ignore[operator]
             if result["overhead_nspb_pct"] else float("inf"))
    log(f"targets: nspb overhead <= 5 %: {result['overhead_nspb_pct']} %; remus >= 3x nspb: "
        f"{ratio:.1f}x; recovery p50 <= 200 ms: {result['recovery_p50_ms']} ms; "
        f"nspb inconsistencies 0: {result['inconsistencies_nspb']}; strawman > 0: "
        f"{result['inconsistencies_strawman']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
