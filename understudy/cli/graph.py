"""``understudy graph``: run a stateful service graph (NSPB, HAMS) locally, or print its spec.

    understudy graph run --service sp --mode nspb --requests 300 --kill sentiment:primary@100
    understudy graph run --service ol --mode strawman --sim --noise-seed 1 --kill tracker:primary@40
    understudy graph spec --service ol --batch-size 64

``run`` starts every replica as a local process (``--sim``: on the deterministic simulator
instead), keeps ``--window`` requests in flight, SIGKILLs the replicas named by ``--kill``
(``OP:ROLE@N``, ROLE one of primary/backup/stateless, after N replies), waits for every reply
and prints latencies, recoveries and the consistency checker's verdict. The exit status is 0
when every request was answered and the checker found nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class KillSpec:
    op: str
    role: str
    after: int

    @classmethod
    def parse(cls, text: str) -> KillSpec:
        target, _, after = text.partition("@")
        op, _, role = target.partition(":")
        if role not in ("primary", "backup", "stateless") or not op:
            raise argparse.ArgumentTypeError(f"--kill wants OP:ROLE[@N], got {text!r}")
        try:
            return cls(op, role, int(after or 0))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--kill: bad count in {text!r}") from exc


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="graph_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="deploy a service locally and stream requests")
    spec = actions.add_parser("spec", help="print a service's graph spec as JSON")
    for sub in (run, spec):
        sub.add_argument("--service", choices=["sp", "ol"], default="sp")
        sub.add_argument("--batch-size", type=int, default=16)
        sub.add_argument("--scale", type=int, default=1, help="hidden-size multiplier")
        sub.add_argument("--depth", type=int, default=1,
                         help="hidden layers of the last stateless operator")
        sub.add_argument("--side", type=int, default=8, help="CNN inputs are side x side")
    run.add_argument("--mode", choices=["bare", "remus", "strawman", "nspb"], default="nspb")
    run.add_argument("--requests", type=int, default=200)
    run.add_argument("--window", type=int, default=32, help="requests in flight")
    run.add_argument("--noise-seed", type=int, default=None,
                     help="inject seeded non-determinism into every execution")
    run.add_argument("--kill", type=KillSpec.parse, action="append", default=[],
                     metavar="OP:ROLE@N", help="SIGKILL a replica after N replies (repeatable)")
    run.add_argument("--sim", action="store_true",
                     help="run on the deterministic simulator instead of processes")
    run.add_argument("--seed", type=int, default=0, help="requests (and simulator) seed")
    run.add_argument("--spares", type=int, default=2, help="warm standby processes")
    run.add_argument("--link-mbps", type=float, default=None,
                     help="emulated bandwidth between replica processes")


def run(options: argparse.Namespace) -> int:
    from stateful.services import service_graph

    graph = service_graph(options.service, options.batch_size, scale=options.scale,
                          depth=options.depth, side=options.side)
    if options.graph_command == "spec":
        _write(graph.model_dump_json(indent=2))
        return 0
    started = time.perf_counter()
    if options.sim:
        result = _run_sim(graph, options)
    else:
        result = asyncio.run(_run_processes(graph, options))
    result["wall_s"] = time.perf_counter() - started
    return _report(result, options)


def _options(options: argparse.Namespace) -> Any:
    from stateful.messages import Mode, NoiseSpec, RuntimeOptions

    noise = NoiseSpec(seed=options.noise_seed) if options.noise_seed is not None else None
    return RuntimeOptions(mode=Mode(options.mode), observe=True, noise=noise,
                          link_mbps=options.link_mbps)


def _run_sim(graph: Any, options: argparse.Namespace) -> dict[str, Any]:
    from stateful.services import request_maker
    from stateful.simulation import SimCluster

    sim = SimCluster(graph, _options(options), seed=options.seed, spares=options.spares)
    make = request_maker(options.service, seed=options.seed, side=options.side)
    kills = sorted(options.kill, key=lambda k: k.after)
    sent = 0
    while len(sim.replies) < options.requests:
        while sent < options.requests and sent - len(sim.replies) < options.window:
            sim.submit(make(sent))
            sent += 1
        while kills and len(sim.replies) >= kills[0].after:
            _kill_sim(sim, kills.pop(0))
        target = min(options.requests, len(sim.replies) + 1)
        def reached(t: int = target) -> bool:
            return len(sim.replies) >= t

        if not sim.run(reached, timeout_s=60.0):
            break
    sim.run(sim.idle, timeout_s=10.0)
    latencies = [(sim.reply_times[r] - sim.submit_times[r]) * 1e3 for r in sim.replies]
    return {"replies": len(sim.replies), "latencies_ms": latencies,
            "recoveries": sim.recoveries, "report": sim.report(), "clock": "virtual"}


def _kill_sim(sim: Any, kill: KillSpec) -> None:
    node = sim.node_of(kill.op, "backup" if kill.role == "backup" else "primary")
    if node is None or not sim.can_fail(node):
        logger.warning("not killing %s %s: outside the failure model right now", kill.op,
                       kill.role)
        return
    logger.warning("killing %s (%s of %s)", node, kill.role, kill.op)
    sim.kill(node)


async def _run_processes(graph: Any, options: argparse.Namespace) -> dict[str, Any]:
    from stateful.runtime import LocalGraph
    from stateful.services import request_maker

    make = request_maker(options.service, seed=options.seed, side=options.side)
    latencies: list[float] = []
    replied = 0
    async with LocalGraph(graph, _options(options), spares=options.spares) as local:
        logger.warning("replica logs and observations in %s", local.run_dir)
        semaphore = asyncio.Semaphore(options.window)
        kills = sorted(options.kill, key=lambda k: k.after)

        async def one(i: int) -> None:
            nonlocal replied
            async with semaphore:
                sent = time.perf_counter()
                await local.submit(make(i), timeout_s=120.0)
                latencies.append((time.perf_counter() - sent) * 1e3)
                replied += 1
                while kills and replied >= kills[0].after:
                    kill = kills.pop(0)
                    node = local.node_of(kill.op, kill.role)
                    if node is not None:
                        logger.warning("SIGKILL %s (%s of %s)", node, kill.role, kill.op)
                        local.kill(node)

        await asyncio.gather(*(one(i) for i in range(options.requests)))
        if options.kill:
            await local.wait_replicated(timeout_s=60.0)
        return {"replies": replied, "latencies_ms": latencies, "recoveries": local.recoveries,
                "report": local.report(), "clock": "wall"}


def _report(result: dict[str, Any], options: argparse.Namespace) -> int:
    lat = sorted(result["latencies_ms"])
    report = result["report"]
    _write(f"service {options.service}, mode {options.mode}, batch {options.batch_size}, "
           f"{'simulator' if options.sim else 'processes'}")
    if lat:
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        _write(f"{result['replies']}/{options.requests} replies in {result['wall_s']:.1f} s; "
               f"latency ({result['clock']}) p50 {statistics.median(lat):.1f} ms, "
               f"p99 {p99:.1f} ms")
    for rec in result["recoveries"]:
        _write(f"recovery {rec.recovery} of {list(rec.failed)}: "
               f"{(rec.finished_at - rec.started_at) * 1e3:.1f} ms; promoted "
               f"{list(rec.promoted)}, rolled back {list(rec.rolled_back)}, restarted "
               f"{list(rec.restarted)}")
    _write(f"consistency: {report.summary()}")
    for item in report.inconsistencies[:10]:
        _write(f"  {item.kind} {item.op}#{item.seq}: {item.detail}")
    return 0 if report.ok and result["replies"] == options.requests else 1


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")
