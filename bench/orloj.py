"""Finish rate of the gateway's batch schedulers (Orloj and its baselines) on live models.

Usage: ``python bench/orloj.py [--seconds 5] [--load 0.4] [--slos 1,1.5,2,3,5]
[--schedulers orloj,clipper,...] [--static-only | --dynamic-only]`` (run it under
``flock /tmp/understudy-bench.lock``: it starts Triton and a gateway). ``--schedulers`` may
also name ``orloj_paper`` (Orloj with the paper's rules only); the gain and the static gap
are taken against the baselines that ran.

Set-up (``deploy/scheduling_bed.py``): one Triton (Python backend, Triton's own batcher taken
out) serves a static model, ``digits_cnn``, and, where this checkout has the early-exit family,
the high-variance dynamic one, ``digits_ee`` (a request leaves at the first confident exit, so
its execution time depends on the digit; the model reports each row's time in ``exec_us``).
One ``understudy gateway`` routes one app per (model, scheduler, SLO) to them, each app with
its ``--scheduler`` and ``--slo-ms``: every scheduler goes through the same gateway path
(``gateway.batching``: the same warm-up and profile, batches sent as one Triton request).

1. **Execution time** (the same run, before anything else): per model, 300 requests one at a
   time through the gateway without a scheduler; their p99 latency is the "p99 execution time"
   the SLOs are multiples of (what one request takes on this path: transfer, the gateway, the
   model), and the median latency of a request of 8 rows gives the capacity at the largest
   batch, ``8 / latency(8)``.
2. **Load**: Poisson arrivals at ``--load`` times that capacity (0.4, as the simulator's
   ``orloj-fig*`` experiments), at most ``--max-rate`` (400/s: the client and the gateway share
   the machine with the model), held-out digits drawn at random, for ``--seconds`` per run,
   after a warm-up that lets the app's scheduler take over. A request *finishes* when its
   answer comes back within the SLO of its scheduled send time (a client that falls behind
   counts against the scheduler); a drop (``deadline-unreachable``, ``expired``) or a late
   answer does not. The finish rate is finished over sent (Orloj §5.2).
3. **Runs**: every (model, SLO, scheduler); at each SLO the ``--seconds`` go in ``--slices``
   (5) slices, and in each slice every scheduler takes its turn, in a shuffled order, on the
   same arrival times and digits, so that a drift of the machine (a background job, a slow
   second) falls on all of them instead of on whichever ran then; all of it ``--repeats`` times
   (3) with seeds ``--seed``, ``--seed + 1``, ... on the same Triton and gateway (one
   5-second run per point moved by tens of points on this machine).

Last line: one JSON object. ``finish_rate[model][scheduler][slo]`` (slo as "1.5x"), the median
over the repeats (``finish_rate_by_repeat`` has each; ``outcomes`` are summed over them);
``gain_vs_best_baseline_tight_pct``: on the dynamic model, 100 (Orloj / best baseline - 1) of
the mean finish rate over the tight SLOs (<= 2x), the best baseline being the one with the
highest such mean (``gain_by_slo_pct`` has each SLO's); ``static_gap_pct``: on the static model,
the largest shortfall of Orloj behind the best baseline at any SLO, in percentage points
(0 when Orloj is never behind); ``scheduler_overhead_us_p50``: Orloj's median CPU time per
decision (``next_batch`` and the enqueues since the previous decision), over its apps, and
``overhead_us_p50_by_scheduler``; ``exec_p99_ms`` and ``rate_rps`` per model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy.scheduling_bed import (  # noqa: E402
    ServedModel,
    early_exit_available,
    start_gateway,
    start_triton,
    write_repository,
    write_routes,
)
from gateway.upstream import HttpUpstream, UpstreamError  # noqa: E402

SCHEDULERS = ("orloj", "clipper", "nexus", "clockwork", "triton")
BASELINES = SCHEDULERS[1:]
VARIANTS = ("orloj_paper",)
"""Schedulers run only when ``--schedulers`` names them (Orloj with the paper's rules)."""
STATIC = ServedModel("digits", "digits_cnn", "static__digits_cnn")
DYNAMIC = ServedModel("digits_ee", "digits_ee", "dynamic__digits_ee")
TIGHT_MAX = 2.0
MAX_BATCH = 8
WARMUP_REQUESTS = 60
MEASURE_REQUESTS = 300
TIMEOUT_HEADER = "understudy-timeout-ms"


def bodies(count: int = 256) -> tuple[list[tuple[bytes, tuple[tuple[str, str], ...]]], bytes,
                                      tuple[tuple[str, str], ...]]:
    """Pre-encoded one-digit requests (binary extension), and one request of 8 digits."""
    from model_repo.digits import load_split

    _, _, x_test, _ = load_split()
    out = [encode(x_test[i:i + 1]) for i in range(min(count, len(x_test)))]
    eight, headers = encode(x_test[:MAX_BATCH])
    return out, eight, headers


def encode(images: np.ndarray) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    header = json.dumps({"inputs": [{"name": "image", "shape": list(images.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": images.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]
                         }).encode()
    return header + np.ascontiguousarray(images).tobytes(), (
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(len(header))))


@dataclass
class Run:
    sent: int = 0
    finished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, other: Run) -> None:
        """Count ``other``'s requests in this run too."""
        self.sent += other.sent
        self.finished += other.finished
        add_counts(self.outcomes, other.outcomes)


def add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` (outcome -> requests) into ``into``."""
    for kind, count in counts.items():
        into[kind] = into.get(kind, 0) + count


class Client:
    """Requests to the gateway on keep-alive connections."""

    def __init__(self, url: str) -> None:
        self.hostport = url.removeprefix("http://")
        self.http = HttpUpstream(5.0)

    async def infer(self, app: str, body: bytes, headers: tuple[tuple[str, str], ...],
                    timeout_ms: float) -> tuple[int, str]:
        try:
            reply = await self.http.request(
                self.hostport, "POST", f"/v2/models/{app}/infer",
                (*headers, (TIMEOUT_HEADER, f"{timeout_ms:.0f}")), body)
        except UpstreamError as exc:
            return 0, str(exc)
        if reply.status == 200:
            return 200, ""
        return reply.status, reply.body.decode("utf-8", "replace")[:300]

    async def sequential(self, app: str, requests: list[tuple[bytes, Any]], count: int,
                         strict: bool = True) -> list[float]:
        """One at a time; with ``strict``, a refusal is an error (not in a warm-up, where the
        scheduler that takes over may drop what its SLO rules out)."""
        latencies = []
        for i in range(count):
            body, headers = requests[i % len(requests)]
            started = time.perf_counter()
            status, error = await self.infer(app, body, headers, 5000)
            if status != 200 and strict:
                raise RuntimeError(f"{app}: {status} {error}")
            latencies.append(time.perf_counter() - started)
        return latencies


def reason_of(status: int, error: str) -> str:
    for reason in ("deadline-unreachable", "action-window-missed", "expired"):
        if f"[{reason}]" in error:
            return reason
    return "error" if status != 504 else "deadline"


async def poisson_run(client: Client, app: str, requests: list[tuple[bytes, Any]],
                      rate: float, seconds: float, slo_s: float, seed: int) -> Run:
    """Poisson arrivals for ``seconds``; each request's outcome against the SLO."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    run = Run()
    tasks = []
    timeout_ms = max(1000.0, 10 * slo_s * 1000)

    async def one(due: float, body: bytes, headers: Any) -> None:
        status, error = await client.infer(app, body, headers, timeout_ms)
        latency = loop.time() - due
        if status == 200:
            kind = "finished" if latency <= slo_s else "late"
        else:
            kind = reason_of(status, error)
        run.outcomes[kind] = run.outcomes.get(kind, 0) + 1
        run.finished += kind == "finished"

    start = loop.time() + 0.05
    due = start
    while True:
        due += rng.expovariate(rate)
        if due - start > seconds:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        body, headers = requests[rng.randrange(len(requests))]
        tasks.append(asyncio.create_task(one(due, body, headers)))
        run.sent += 1
    await asyncio.gather(*tasks)
    return run


def app_name(model: str, scheduler: str, slo: float) -> str:
    return f"{model}-{scheduler}-{str(slo).replace('.', 'p')}"


async def measure(client: Client, models: dict[str, ServedModel], requests: list[Any],
                  eight: bytes, eight_headers: Any) -> dict[str, dict[str, float]]:
    figures = {}
    for key in models:
        await client.sequential(f"probe-{key}", requests, 50)  # warm-up
        alone = await client.sequential(f"probe-{key}", requests, MEASURE_REQUESTS)
        batch = await client.sequential(f"probe-{key}", [(eight, eight_headers)], 60)
        figures[key] = {"p50_s": float(np.percentile(alone, 50)),
                        "p99_s": float(np.percentile(alone, 99)),
                        "batch8_s": statistics.median(batch)}
    return figures


async def bench(args: argparse.Namespace, gateway_url: str, models: dict[str, ServedModel],
                slos: list[float], requests: list[Any], figures: dict[str, dict[str, float]],
                seed: int) -> dict[str, Any]:
    client = Client(gateway_url)
    finish: dict[str, dict[str, dict[str, float]]] = {}
    outcomes: dict[str, Any] = {}
    order = list(args.schedulers)
    shuffle = random.Random(seed)
    for key in models:
        capacity = MAX_BATCH / figures[key]["batch8_s"]
        rate = min(args.load * capacity, args.max_rate)
        figures[key]["rate_rps"] = rate
        figures[key]["capacity_rps"] = capacity
        for slo in slos:
            slo_s = slo * figures[key]["p99_s"]
            for scheduler in order:
                await client.sequential(app_name(key, scheduler, slo), requests,
                                        WARMUP_REQUESTS, strict=False)
            runs = {scheduler: Run() for scheduler in order}
            # in slices, the schedulers' turns interleaved: the machine's drifts (a background
            # job, a slow second) fall on all of them rather than on whichever ran then
            for piece in range(args.slices):
                shuffle.shuffle(order)
                for scheduler in order:
                    runs[scheduler].add(await poisson_run(
                        client, app_name(key, scheduler, slo), requests, rate,
                        args.seconds / args.slices, slo_s, seed * 1000 + piece))
            for scheduler, run in runs.items():
                rate_done = run.finished / max(run.sent, 1)
                finish.setdefault(key, {}).setdefault(scheduler, {})[f"{slo:g}x"] = round(
                    rate_done, 4)
                outcomes.setdefault(key, {}).setdefault(scheduler, {})[f"{slo:g}x"] = \
                    run.outcomes
                logging.info("%s %s %gx (%.2f ms): %.3f of %d %s", key, scheduler, slo,
                             slo_s * 1000, rate_done, run.sent, run.outcomes)
    return {"finish_rate": finish, "outcomes": outcomes}


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats as one result: each finish rate their median, the outcomes summed."""
    first = runs[0]["finish_rate"]
    finish = {key: {scheduler: {slo: round(statistics.median(
        run["finish_rate"][key][scheduler][slo] for run in runs), 4) for slo in rates}
        for scheduler, rates in per.items()} for key, per in first.items()}
    outcomes: dict[str, Any] = {}
    for run in runs:
        for key, per in run["outcomes"].items():
            for scheduler, by_slo in per.items():
                for slo, counts in by_slo.items():
                    add_counts(outcomes.setdefault(key, {}).setdefault(scheduler, {})
                               .setdefault(slo, {}), counts)
    return {"finish_rate": finish, "outcomes": outcomes,
            "finish_rate_by_repeat": [run["finish_rate"] for run in runs]}


def baselines_in(finish: dict[str, dict[str, float]]) -> list[str]:
    """The baselines that ran (have finish rates)."""
    return [b for b in BASELINES if b in finish]


def gains(finish: dict[str, dict[str, float]], slos: list[float]) -> tuple[float | None,
                                                                             dict[str, Any]]:
    tight = [f"{s:g}x" for s in slos if s <= TIGHT_MAX]
    if not tight:
        return None, {}

    def mean(name: str) -> float:
        return statistics.mean(finish[name][s] for s in tight)

    baselines = baselines_in(finish)
    if "orloj" not in finish or not baselines:
        return None, {}
    best = max(baselines, key=mean)
    gain = 100.0 * (mean("orloj") / mean(best) - 1.0) if mean(best) > 0 else None
    by_slo = {}
    for s in (f"{x:g}x" for x in slos):
        top = max(finish[b][s] for b in baselines)
        by_slo[s] = round(100.0 * (finish["orloj"][s] / top - 1.0), 1) if top > 0 else None
    return (None if gain is None else round(gain, 1)), {"best_baseline_tight": best,
                                                         "gain_by_slo_pct": by_slo}


def static_gap(static: dict[str, dict[str, float]] | None) -> float | None:
    """Orloj's largest shortfall behind the best baseline on the static model (a fraction)."""
    baselines = baselines_in(static or {})
    if not static or "orloj" not in static or not baselines:
        return None
    return max(max(static[b][s] for b in baselines) - static["orloj"][s] for s in static["orloj"])


def parse_args() -> tuple[argparse.Namespace, dict[str, ServedModel], list[float]]:
    """The options, the models to run (key -> model) and the SLO multiples."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per run")
    parser.add_argument("--load", type=float, default=0.4,
                        help="arrival rate as a fraction of the capacity at batch 8")
    parser.add_argument("--max-rate", type=float, default=400.0,
                        help="at most this many requests per second (the client and the "
                             "gateway share this machine's cores with the model)")
    parser.add_argument("--slos", default="1,1.5,2,3,5", help="multiples of the p99")
    parser.add_argument("--slices", type=int, default=5,
                        help="each run's seconds in this many slices, the schedulers' turns "
                             "interleaved (the same arrivals for each in a slice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every point, seeds --seed, --seed + 1, ...; each finish "
                             "rate is their median")
    parser.add_argument("--static-only", action="store_true")
    parser.add_argument("--dynamic-only", action="store_true")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS),
                        help="which to run (comma-separated; also " + ", ".join(VARIANTS) + ")")
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy the gateway's log (calibration, schedulers) here at the end, "
                             "and its /metrics (batch sizes, decision CPU) next to it")
    args = parser.parse_args()
    if args.repeats < 1 or args.slices < 1:
        parser.error("--repeats and --slices: at least 1")
    args.schedulers = [s for s in args.schedulers.split(",") if s]
    unknown = set(args.schedulers) - set(SCHEDULERS) - set(VARIANTS)
    if unknown:
        parser.error(f"--schedulers: unknown {sorted(unknown)}")
    if not args.schedulers:
        parser.error("--schedulers: none")
    if args.static_only and args.dynamic_only:
        parser.error("--static-only and --dynamic-only exclude each other")
    models = {} if args.dynamic_only else {"static": STATIC}
    if not args.static_only and early_exit_available():
        models["dynamic"] = DYNAMIC
    if not models:
        parser.error("--dynamic-only: this checkout has no early-exit family")
    return args, models, [float(s) for s in args.slos.split(",")]


def main() -> None:
    args, models, slos = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orloj-bench-") as scratch:
        root = Path(scratch)
        write_repository(root / "store", root / "repository", list(models.values()))
        triton: Any = start_triton(root, root / "repository", list(models.values()))
        gateway = None
        try:
            apps: dict[str, ServedModel] = {f"probe-{k}": m for k, m in models.items()}
            for key, model in models.items():
                for scheduler in args.schedulers:
                    for slo in slos:
                        apps[app_name(key, scheduler, slo)] = model
            write_routes(root / "gateway", triton.config.http_url, triton.config.grpc_url,
                         apps)
            requests, eight, eight_headers = bodies()
            # the SLOs are set once the execution times are known: measure on a gateway of
            # its own first
            probe = start_gateway(root / "gateway", {}, {})
            try:
                figures = asyncio.run(measure(Client(probe.url), models, requests, eight,
                                              eight_headers))
            finally:
                probe.stop()
            schedulers = {app: app.split("-")[1] for app in apps if not app.startswith("probe")}
            slo_ms = {app: float(app.rsplit("-", 1)[1].replace("p", ".")) * figures[
                app.split("-")[0]]["p99_s"] * 1000 for app in schedulers}
            gateway = start_gateway(root / "gateway", schedulers, slo_ms,
                                    "--max-batch", str(MAX_BATCH))
            result = combine([asyncio.run(bench(args, gateway.url, models, slos, requests,
                                                figures, args.seed + repeat))
                              for repeat in range(args.repeats)])
            overhead = {}
            for scheduler in args.schedulers:
                values = [gateway.sample("understudy_gateway_scheduler_decision_cpu_p50_seconds",
                                         app_id=app) for app, s in schedulers.items()
                          if s == scheduler]
                found = [v for v in values if v]
                overhead[scheduler] = round(statistics.median(found) * 1e6, 1) if found else None
        finally:
            if gateway is not None:
                if args.keep_log is not None:
                    args.keep_log.with_suffix(".metrics").write_text(gateway.metrics())
                gateway.stop()
            triton.stop()
            if args.keep_log is not None and (root / "gateway" / "gateway.log").exists():
                shutil.copyfile(root / "gateway" / "gateway.log", args.keep_log)
    finish = result["finish_rate"]
    gain, gain_detail = gains(finish["dynamic"], slos) if "dynamic" in finish else (None, {})
    gap = static_gap(finish.get("static"))
    for key, per in finish.items():
        for scheduler, rates in per.items():
            print(f"{key:8s} {scheduler:10s} " + " ".join(f"{s}:{r:.3f}" for s, r in
                                                          rates.items()))
    print(json.dumps({
        "finish_rate": finish,
        "gain_vs_best_baseline_tight_pct": gain, **gain_detail,
        "static_gap_pct": None if gap is None else round(max(0.0, gap) * 100, 1),
        "scheduler_overhead_us_p50": overhead.get("orloj"),
        "overhead_us_p50_by_scheduler": overhead,
        "exec_p99_ms": {k: round(f["p99_s"] * 1000, 3) for k, f in figures.items()},
        "exec_p50_ms": {k: round(f["p50_s"] * 1000, 3) for k, f in figures.items()},
        "batch8_ms": {k: round(f["batch8_s"] * 1000, 3) for k, f in figures.items()},
        "rate_rps": {k: round(f["rate_rps"], 1) for k, f in figures.items()},
        "capacity_rps": {k: round(f["capacity_rps"], 1) for k, f in figures.items()},
        "load": args.load, "seconds_per_run": args.seconds, "slos": slos,
        "dynamic_model": "dynamic" in models,
        "outcomes": result["outcomes"], "repeats": args.repeats,
        "finish_rate_by_repeat": result["finish_rate_by_repeat"],
        "wall_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
