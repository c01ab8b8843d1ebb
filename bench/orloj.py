"""Finish rate of the gateway's batch schedulers (Orloj and its baselines) on live models.

Usage: ``python bench/orloj.py [--seconds 5] [--load 0.4] [--sweep-loads 0.7,1]
[--slos 1,1.5,2,3,5] [--schedulers orloj,clipper,...] [--workloads static,dynamic,shared]``
(run it under ``flock /tmp/understudy-bench.lock``: it starts Triton and a gateway).
``--schedulers`` may also name ``orloj_paper`` (Orloj with the paper's rules only); the gain
and the static gap are taken against the baselines that ran.

Set-up (``deploy/scheduling_bed.py``): one Triton (Python backend, Triton's own batcher taken
out) serves a static model, ``digits_cnn``, and, where this checkout has the early-exit family,
the high-variance dynamic one, ``digits_ee`` (a request leaves at the first confident exit, so
its execution time depends on the digit; the model reports each row's time in ``exec_us``).
One ``understudy gateway`` routes the workloads' apps to them, each app with its
``--scheduler`` and ``--slo-ms``: every scheduler goes through the same gateway path
(``gateway.batching``: the same warm-up and profile, batches sent as one Triton request).
Workloads (``--workloads``, all by default):

- ``static``: ``digits_cnn``, one app per (scheduler, SLO), any held-out digit;
- ``dynamic``: ``digits_ee``, one app per (scheduler, SLO), any held-out digit: the
  scheduler sees one app, one distribution;
- ``shared``: ``digits_ee``, two apps per (scheduler, SLO) sharing one queue
  (``--model-queue``): ``easy`` sends the digits that leave at the model's first exit,
  ``hard`` those that run to its last (found by asking the model each digit's
  ``exit_index`` first), each app half the arrivals. Apps of different lengths behind one
  model, the setting of Orloj's per-model queue (§3.2) and of the simulator's cases.

1. **Execution time** (the same run, before anything else): per workload, 2,000 requests one at
   a time through the gateway without a scheduler (a shared workload's classes in turn); their
   p99 latency (the median of four consecutive parts' p99s: a slow second moves one part) is
   the "p99 execution time" the SLOs are multiples of (what one request takes
   on this path: transfer, the gateway, the model), and the median latency of 60 requests of 8
   rows, spread among those 2,000, gives the capacity at the largest batch,
   ``8 / latency(8)``.
2. **Load**: Poisson arrivals at ``--load`` times that capacity (0.4, as the simulator's
   ``orloj-fig*`` experiments), at most ``--max-rate`` (400/s: the client and the gateway share
   the machine with the model), digits drawn at random from the app's, for ``--seconds`` per
   run, after a warm-up that lets the queue's scheduler take over. A request *finishes* when
   its answer comes back within the SLO of its scheduled send time (a client that falls
   behind counts against the scheduler); a drop (``deadline-unreachable``, ``expired``), a
   timeout (``deadline``), any other failure (``error-<status>``, 0 when the request failed
   on its way; the first of each logged with its text) or a late answer does not. The
   finish rate is finished over sent (Orloj §5.2). Each request carries the time left to
   its SLO when it is sent as its timeout (``understudy-timeout-ms``), as a client with a
   deadline does, so the gateway's deadline is the client's (``--no-propagate-deadline``:
   10 x the SLO, the gateway's objective alone); ``client_send_lag_ms`` is how late the
   client sent (p50, p99). The client sends at niceness ``--client-nice`` (-10, where it may
   raise its priority), as a load generator on a machine of its own is not held up by the
   gateway and Triton it loads.
3. **Runs**: every (workload, SLO, scheduler); at each SLO the ``--seconds`` go in
   ``--slices`` (25) slices, and in each slice every scheduler takes its turn, in a shuffled
   order, on the same arrival times and digits, so that a drift of the machine (a background
   job, a slow second) falls on all of them instead of on whichever ran then (in slices of
   a fifth of a second, a slow second spreads over every scheduler rather than costing one
   of them its repeat); all of it
   ``--repeats`` times (5) with seeds ``--seed``, ``--seed + 1``, ... on the same Triton and
   gateway (one 5-second run per point moved by tens of points on this machine).
4. **Load sweep**: then the early-exit workloads again, on the same apps, at the tight SLOs
   (<= 2x) only, at each of ``--sweep-loads`` (0.7 and 1) times the capacity, at most
   ``--sweep-max-rate`` (1000/s), the same repeats. Orloj's lead at a tight SLO grows with
   the load (the simulator's ``orloj-load`` shows the same). The paper gives no number: it
   scales its trace "such that the incoming rate matches the system load" (§5.2), and its
   baselines finish under half of what it does even at relaxed SLOs (its gain there is over
   100 %), which only an arrival rate near the capacity does; 1 is that setting, 0.7 one
   below it.

Last line: one JSON object. ``finish_rate[workload][scheduler][slo]`` (slo as "1.5x"), the
median over the repeats (``finish_rate_by_repeat`` has each; ``outcomes`` are summed over
them, and ``outcomes_by_class`` has a shared queue's per class of digits);
``gain_vs_best_baseline_tight_pct``: on the early-exit model's per-model queue (``shared``;
``dynamic`` when only that ran: ``gain_workload`` says which), 100 (Orloj /
best baseline - 1) of the mean finish rate over the tight SLOs (<= 2x), the best baseline
being the one with the highest such mean (of the medians), at the heaviest load run
(``gain_load``: the sweep's heaviest, or ``--load`` without a sweep; ``gain_by_slo_pct``
has each SLO's there). Paired: each repeat's ratio, the median over the repeats (the
schedulers of a repeat shared its arrivals and its slices of time; the machine's drift
between repeats is far larger than the gaps between schedulers); ``gain_unpaired_pct``
beside it, the ratio of the medians.
``gain_by_load_tight_pct[load][workload]`` has the gain of each early-exit workload at every
load (``--load``'s too: ``gain_by_workload_tight_pct`` repeats it), ``best_baseline_by_load``
and ``gain_by_slo_pct_by_load`` beside it, and ``load_sweep[load]`` the sweep's finish rates,
outcomes, rates and client lag as above. ``static_gap_pct``: on
the static model, the largest shortfall of Orloj behind the best baseline at any SLO, in
percentage points (0 when Orloj is never behind), paired as the gain (at each SLO the median
over the repeats of the best baseline's finish rate less Orloj's in that repeat;
``static_gap_unpaired_pct``: from the medians); ``scheduler_overhead_us_p50``: Orloj's median
CPU time per decision (``next_batch`` and the enqueues since the previous decision), over its
queues, and ``overhead_us_p50_by_scheduler`` (``_mean``: over all their decisions); both
over the whole run, the load sweep's decisions (more requests queued) included;
``gateway_gc_pauses``: per generation, the gateway's garbage-collector passes over the whole
run (``passes``, ``total_ms``, ``over_10ms``: a pass holds every queue's requests);
``exec_p99_ms``, ``rate_rps`` per workload and ``requests_per_class``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from orloj_client import Client, Request, Run, poisson_run, warm  # noqa: E402
from orloj_figures import (  # noqa: E402
    DYNAMIC_WORKLOADS,
    SCHEDULERS,
    TIGHT_MAX,
    combine,
    gains_by_load,
    static_gap,
    steady_p99,
)

from deploy.scheduling_bed import (  # noqa: E402
    ServedModel,
    early_exit_available,
    start_gateway,
    start_triton,
    write_repository,
    write_routes,
)

VARIANTS = ("orloj_paper",)
"""Schedulers run only when ``--schedulers`` names them (Orloj with the paper's rules)."""
STATIC = ServedModel("digits", "digits_cnn", "static__digits_cnn")
DYNAMIC = ServedModel("digits_ee", "digits_ee", "dynamic__digits_ee")
MAX_BATCH = 8
WARMUP_REQUESTS = 60
MEASURE_REQUESTS = 2000
BATCH_PROBES = 60
"""Requests of 8 digits timed for the capacity, spread evenly among the requests timed alone:
a slow or fast second of the machine moves a few of them, not the capacity every load is a
fraction of (timed in a row, they all fell in the same second or two)."""


@dataclass(frozen=True)
class Workload:
    """What one series of runs serves: a model, and the classes of digits its apps send.

    One class: one app per (scheduler, SLO). Several: an app per class, sharing one queue
    (``--model-queue``), each sending only its class's digits.
    """

    key: str
    model: ServedModel
    classes: tuple[str, ...] = ("",)

    def _base(self, scheduler: str, slo: float) -> str:
        return f"{self.key}-{scheduler}-{str(slo).replace('.', 'p')}"

    def apps(self, scheduler: str, slo: float) -> list[str]:
        base = self._base(scheduler, slo)
        return [f"{base}-{c}" if c else base for c in self.classes]

    def queue(self, scheduler: str, slo: float) -> str | None:
        """The queue the apps share (None: one app)."""
        return None if len(self.classes) == 1 else self._base(scheduler, slo)


WORKLOADS = {"static": Workload("static", STATIC), "dynamic": Workload("dynamic", DYNAMIC),
             "shared": Workload("shared", DYNAMIC, ("easy", "hard"))}


def bodies() -> tuple[list[Request], list[np.ndarray], Request]:
    """Pre-encoded one-digit requests of the held-out digits (binary extension), the digits,
    and one request of 8 digits."""
    from model_repo.digits import load_split

    _, _, x_test, _ = load_split()
    digits = [x_test[i:i + 1] for i in range(len(x_test))]
    return [encode(d) for d in digits], digits, encode(x_test[:MAX_BATCH])


def encode(images: np.ndarray, output: str = "logits", binary: bool = True) -> Request:
    wanted: dict[str, Any] = {"name": output}
    if binary:
        wanted["parameters"] = {"binary_data": True}
    header = json.dumps({"inputs": [{"name": "image", "shape": list(images.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": images.nbytes}}],
                         "outputs": [wanted]}).encode()
    return header + np.ascontiguousarray(images).tobytes(), (
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(len(header))))


def interleave(lists: list[list[Request]]) -> list[Request]:
    """The lists' requests taken in turn (as many of each)."""
    shortest = min(len(x) for x in lists)
    return [x[i] for i in range(shortest) for x in lists]


async def exits_of(client: Client, app: str, digits: list[np.ndarray]) -> list[int]:
    """The exit each digit takes in the early-exit model (asked through the gateway)."""
    exits = []
    for digit in digits:
        status, text = await client.ask(app, encode(digit, "exit_index", binary=False), 5000)
        if status != 200:
            raise RuntimeError(f"{app}: {status} {text[:300]}")
        exits.append(int(json.loads(text)["outputs"][0]["data"][0]))
    return exits


async def classify(client: Client, workloads: list[Workload], requests: list[Request],
                   digits: list[np.ndarray]) -> dict[str, dict[str, list[Request]]]:
    """Each workload's requests per class: all of them for one class; for the early-exit
    model's ``easy`` and ``hard``, the digits that leave at its first exit and at its last."""
    out: dict[str, dict[str, list[Request]]] = {}
    for workload in workloads:
        if workload.classes == ("",):
            out[workload.key] = {"": requests}
            continue
        exits = await exits_of(client, f"probe-{workload.key}", digits)
        last = max(exits)
        by_exit = {"easy": 0, "hard": last}
        out[workload.key] = {c: [r for r, e in zip(requests, exits, strict=True)
                                 if e == by_exit[c]] for c in workload.classes}
        logging.info("%s: %s", workload.key, {c: len(r) for c, r in out[workload.key].items()})
    return out


async def measure(client: Client, workloads: list[Workload],
                  classes: dict[str, dict[str, list[Request]]], eight: Request
                  ) -> dict[str, dict[str, float]]:
    """Per workload: its requests' latency one at a time (p50, p99; the classes in turn) and a
    request of 8 digits' (the capacity at batch 8)."""
    figures = {}
    for workload in workloads:
        app = f"probe-{workload.key}"
        mixed = interleave(list(classes[workload.key].values()))
        await client.sequential(app, mixed, 50)  # warm-up
        alone: list[float] = []
        batch: list[float] = []
        every = MEASURE_REQUESTS // BATCH_PROBES
        for i in range(MEASURE_REQUESTS):  # the requests of 8 spread over the same seconds
            alone += await client.sequential(app, [mixed[i % len(mixed)]], 1)
            if i % every == every - 1:
                batch += await client.sequential(app, [eight], 1)
        figures[workload.key] = {"p50_s": float(np.percentile(alone, 50)),
                                 "p99_s": steady_p99(alone),
                                 "batch8_s": statistics.median(batch)}
        figures[workload.key]["capacity_rps"] = MAX_BATCH / figures[workload.key]["batch8_s"]
    return figures


async def prepare(url: str, workloads: list[Workload], requests: list[Request],
                  digits: list[np.ndarray], eight: Request
                  ) -> tuple[dict[str, dict[str, list[Request]]], dict[str, dict[str, float]]]:
    """Each workload's requests per class, then its execution times (on a gateway without
    schedulers)."""
    client = Client(url)
    classes = await classify(client, workloads, requests, digits)
    return classes, await measure(client, workloads, classes, eight)


def rates_at(load: float, max_rate: float, workloads: list[Workload],
             figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each workload's arrival rate at ``load`` times its capacity, at most ``max_rate``."""
    return {w.key: min(load * figures[w.key]["capacity_rps"], max_rate) for w in workloads}


async def bench(args: argparse.Namespace, gateway_url: str, workloads: list[Workload],
                slos: list[float], classes: dict[str, dict[str, list[Request]]],
                figures: dict[str, dict[str, float]], rates: dict[str, float],
                seed: int) -> dict[str, Any]:
    """One repeat: every workload, SLO and scheduler at its workload's rate in ``rates``."""
    client = Client(gateway_url)
    finish: dict[str, dict[str, dict[str, float]]] = {}
    outcomes: dict[str, Any] = {}
    by_class: dict[str, Any] = {}
    lags: dict[str, list[float]] = {}
    order = list(args.schedulers)
    shuffle = random.Random(seed)
    for workload in workloads:
        key = workload.key
        rate = rates[key]
        for slo in slos:
            slo_s = slo * figures[key]["p99_s"]
            streams = {scheduler: list(zip(workload.apps(scheduler, slo),
                                           classes[key].values(), strict=True))
                       for scheduler in order}
            for scheduler in order:  # the warm-up (a shared queue's: on all its apps in turn)
                await warm(client, streams[scheduler], WARMUP_REQUESTS)
            labels = list(classes[key]) if len(classes[key]) > 1 else None
            runs = {scheduler: Run() for scheduler in order}
            # in slices, the schedulers' turns interleaved: the machine's drifts (a background
            # job, a slow second) fall on all of them rather than on whichever ran then
            for piece in range(args.slices):
                shuffle.shuffle(order)
                for scheduler in order:
                    runs[scheduler].add(await poisson_run(
                        client, streams[scheduler], rate, args.seconds / args.slices, slo_s,
                        seed * 1000 + piece, labels, args.propagate_deadline))
            for scheduler, run in runs.items():
                lags.setdefault(key, []).extend(run.send_lag_s)
                rate_done = run.finished / max(run.sent, 1)
                finish.setdefault(key, {}).setdefault(scheduler, {})[f"{slo:g}x"] = round(
                    rate_done, 4)
                outcomes.setdefault(key, {}).setdefault(scheduler, {})[f"{slo:g}x"] = \
                    run.outcomes
                if run.by_class:
                    by_class.setdefault(key, {}).setdefault(scheduler, {})[f"{slo:g}x"] = \
                        run.by_class
                logging.info("%s %s %gx (%.2f ms): %.3f of %d %s %s", key, scheduler, slo,
                             slo_s * 1000, rate_done, run.sent, run.outcomes, run.by_class)
    return {"finish_rate": finish, "outcomes": outcomes, "outcomes_by_class": by_class,
            "send_lag_s": lags}


def parse_args() -> tuple[argparse.Namespace, list[Workload], list[float]]:
    """The options, the workloads to run and the SLO multiples."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per run")
    parser.add_argument("--load", type=float, default=0.4,
                        help="arrival rate as a fraction of the capacity at batch 8")
    parser.add_argument("--max-rate", type=float, default=400.0,
                        help="at most this many requests per second (the client and the "
                             "gateway share this machine's cores with the model)")
    parser.add_argument("--sweep-loads", default="0.7,1",
                        help="heavier loads (comma-separated; empty: none) at which the "
                             "early-exit workloads run again at the tight SLOs")
    parser.add_argument("--sweep-max-rate", type=float, default=1000.0,
                        help="at most this many requests per second in the load sweep")
    parser.add_argument("--slos", default="1,1.5,2,3,5", help="multiples of the p99")
    parser.add_argument("--slices", type=int, default=25,
                        help="each run's seconds in this many slices, the schedulers' turns "
                             "interleaved (the same arrivals for each in a slice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs of every point, seeds --seed, --seed + 1, ...; each finish "
                             "rate is their median")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="which to run (comma-separated, of " + ", ".join(WORKLOADS) +
                             "; those of the early-exit model only where the checkout has it)")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS),
                        help="which to run (comma-separated; also " + ", ".join(VARIANTS) + ")")
    parser.add_argument("--no-propagate-deadline", dest="propagate_deadline",
                        action="store_false",
                        help="send each request with a timeout of 10 x the SLO instead of the "
                             "time left to its SLO")
    parser.add_argument("--client-nice", type=int, default=-10,
                        help="the client's niceness while it sends (-20..19; the default "
                             "needs root, else it stays as it was): a load generator on a "
                             "machine of its own is not held up by the servers it loads")
    parser.add_argument("--keep-log", type=Path, default=None,
                        help="copy the gateway's log (calibration, schedulers) here at the end, "
                             "and its /metrics (batch sizes, decision CPU) next to it")
    args = parser.parse_args()
    if not -20 <= args.client_nice <= 19:
        parser.error("--client-nice: -20..19")
    if args.repeats < 1 or args.slices < 1:
        parser.error("--repeats and --slices: at least 1")
    try:
        args.sweep_loads = [float(x) for x in args.sweep_loads.split(",") if x]
    except ValueError:
        parser.error("--sweep-loads: numbers, comma-separated")
    if not all(0 < x <= 2 for x in [args.load, *args.sweep_loads]):
        parser.error("--load and --sweep-loads: in (0, 2]")
    if args.load in args.sweep_loads:  # its figures would be one run's or the other's
        parser.error(f"--sweep-loads: {args.load:g} is --load, run already")
    args.schedulers = [s for s in args.schedulers.split(",") if s]
    unknown = set(args.schedulers) - set(SCHEDULERS) - set(VARIANTS)
    if unknown:
        parser.error(f"--schedulers: unknown {sorted(unknown)}")
    if not args.schedulers:
        parser.error("--schedulers: none")
    names = [w for w in args.workloads.split(",") if w]
    if set(names) - set(WORKLOADS):
        parser.error(f"--workloads: unknown {sorted(set(names) - set(WORKLOADS))}")
    workloads = [WORKLOADS[w] for w in names
                 if WORKLOADS[w].model is STATIC or early_exit_available()]
    if not workloads:
        parser.error("--workloads: none (this checkout has no early-exit family)")
    return args, workloads, [float(s) for s in args.slos.split(",")]


def set_client_nice(nice: int) -> int:
    """Run this thread (the client's event loop) at ``nice``; the niceness it runs at.

    On one machine, the gateway and Triton take the cores the client needs to send on time;
    a client on a machine of its own would not wait for them. Without the privilege to
    raise its priority it stays as it was (logged).
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        logging.warning("client niceness %d not permitted; it stays at %d", nice,
                        os.getpriority(os.PRIO_PROCESS, 0))
    return os.getpriority(os.PRIO_PROCESS, 0)


def every_app(workloads: list[Workload], schedulers: list[str], slos: list[float]
              ) -> list[tuple[Workload, str, float, str]]:
    """(workload, scheduler, SLO multiple, app) of every app a run serves."""
    return [(w, scheduler, slo, app) for w in workloads for scheduler in schedulers
            for slo in slos for app in w.apps(scheduler, slo)]


def gateway_settings(workloads: list[Workload], schedulers: list[str], slos: list[float],
                     figures: dict[str, dict[str, float]]
                     ) -> tuple[dict[str, str], dict[str, float], list[str]]:
    """The gateway's schedulers and objectives per app, and its options (the batch size and
    each shared queue's apps)."""
    by_app: dict[str, str] = {}
    slo_ms: dict[str, float] = {}
    options = ["--max-batch", str(MAX_BATCH)]
    for workload, scheduler, slo, app in every_app(workloads, schedulers, slos):
        by_app[app] = scheduler
        slo_ms[app] = slo * figures[workload.key]["p99_s"] * 1000
        queue = workload.queue(scheduler, slo)
        if queue is not None:
            options += ["--model-queue", f"{app}={queue}"]
    return by_app, slo_ms, options


def main() -> None:
    args, workloads, slos = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orloj-bench-") as scratch:
        root = Path(scratch)
        models = list({w.model.model_name: w.model for w in workloads}.values())
        write_repository(root / "store", root / "repository", models)
        triton: Any = start_triton(root, root / "repository", models)
        gateway = None
        try:
            apps = {f"probe-{w.key}": w.model for w in workloads} | {
                app: w.model for w, _, _, app in every_app(workloads, args.schedulers, slos)}
            write_routes(root / "gateway", triton.config.http_url, triton.config.grpc_url,
                         apps)
            requests, digits, eight = bodies()
            # the SLOs are set once the execution times are known: measure on a gateway of
            # its own first
            probe = start_gateway(root / "gateway", {}, {})
            try:
                classes, figures = asyncio.run(prepare(probe.url, workloads, requests, digits,
                                                       eight))
            finally:
                probe.stop()
            by_app, slo_ms, options = gateway_settings(workloads, args.schedulers, slos, figures)
            gateway = start_gateway(root / "gateway", by_app, slo_ms, *options)
            client_nice = set_client_nice(args.client_nice)  # the servers keep their own
            main_rates = rates_at(args.load, args.max_rate, workloads, figures)
            result = combine([asyncio.run(bench(args, gateway.url, workloads, slos, classes,
                                                figures, main_rates, args.seed + repeat))
                              for repeat in range(args.repeats)])
            # the same apps (queues, profiles) again, heavier: how much of the gain is the load's
            swept = [w for w in workloads if w.key in DYNAMIC_WORKLOADS]
            tight = [s for s in slos if s <= TIGHT_MAX]
            sweep: dict[float, dict[str, Any]] = {}
            for load in args.sweep_loads if swept and tight else []:
                heavier = rates_at(load, args.sweep_max_rate, swept, figures)
                sweep[load] = combine([asyncio.run(bench(
                    args, gateway.url, swept, tight, classes, figures, heavier,
                    args.seed + repeat)) for repeat in range(args.repeats)])
                sweep[load]["rate_rps"] = {k: round(r, 1) for k, r in heavier.items()}
            overhead: dict[str, float | None] = {}
            overhead_mean: dict[str, float | None] = {}
            for scheduler in args.schedulers:
                labels = {workload.queue(scheduler, slo) or workload.apps(scheduler, slo)[0]
                          for workload in workloads for slo in slos}
                values = [gateway.sample("understudy_gateway_scheduler_decision_cpu_p50_seconds",
                                         app_id=label) for label in sorted(labels)]
                found = [v for v in values if v]
                overhead[scheduler] = round(statistics.median(found) * 1e6, 1) if found else None
                # the mean too: a median of decisions that are mostly a request sent alone
                # (no queue to weigh) hides what the queued ones cost
                spent = sum(gateway.sample("understudy_gateway_scheduler_decision_cpu_seconds_sum",
                                           app_id=label, scheduler=scheduler) or 0.0
                            for label in labels)
                decided = sum(gateway.sample(
                    "understudy_gateway_scheduler_decision_cpu_seconds_count", app_id=label,
                    scheduler=scheduler) or 0.0 for label in labels)
                overhead_mean[scheduler] = round(spent / decided * 1e6, 1) if decided else None
            pauses = gateway.collector_pauses()
        finally:
            if gateway is not None:
                if args.keep_log is not None:
                    args.keep_log.with_suffix(".metrics").write_text(gateway.metrics())
                gateway.stop()
            triton.stop()
            if args.keep_log is not None and (root / "gateway" / "gateway.log").exists():
                shutil.copyfile(root / "gateway" / "gateway.log", args.keep_log)
    finish = result["finish_rate"]
    by_load = gains_by_load({load: (r["finish_rate_by_repeat"], tight)
                             for load, r in sweep.items()} | {
        args.load: (result["finish_rate_by_repeat"], slos)})
    by_workload = by_load[args.load]
    headline = next((key for key in DYNAMIC_WORKLOADS if key in by_workload), None)
    heaviest = max(by_load)
    gain, gain_detail = by_load[heaviest][headline] if headline else (None, {})
    gap = static_gap([run["static"] for run in result["finish_rate_by_repeat"]
                      if "static" in run])
    for key, per in finish.items():
        for scheduler, rates in per.items():
            print(f"{key:8s} {scheduler:10s} " + " ".join(f"{s}:{r:.3f}" for s, r in
                                                          rates.items()))
    print(json.dumps({
        "finish_rate": finish,
        "gain_vs_best_baseline_tight_pct": gain, **gain_detail, "gain_workload": headline,
        "gain_load": heaviest,
        "gain_by_load_tight_pct": {f"{load:g}": {k: g for k, (g, _) in per.items()}
                                   for load, per in sorted(by_load.items())},
        "best_baseline_by_load": {f"{load:g}": {k: d.get("best_baseline_tight")
                                                for k, (_, d) in per.items()}
                                  for load, per in sorted(by_load.items())},
        "gain_by_workload_tight_pct": {k: g for k, (g, _) in by_workload.items()},
        "best_baseline_by_workload": {k: d.get("best_baseline_tight")
                                      for k, (_, d) in by_workload.items()},
        "gain_by_slo_pct_by_load": {f"{load:g}": {k: d.get("gain_by_slo_pct")
                                                  for k, (_, d) in per.items()}
                                    for load, per in sorted(by_load.items())},
        "load_sweep": {f"{load:g}": {
            "rate_rps": r["rate_rps"], "finish_rate": r["finish_rate"],
            "outcomes": r["outcomes"], "outcomes_by_class": r["outcomes_by_class"],
            "finish_rate_by_repeat": r["finish_rate_by_repeat"],
            "client_send_lag_ms": r["send_lag_ms"]} for load, r in sorted(sweep.items())},
        "static_gap_pct": None if gap is None else round(max(0.0, gap[0]) * 100, 1),
        "static_gap_unpaired_pct": None if gap is None else round(max(0.0, gap[1]) * 100, 1),
        "scheduler_overhead_us_p50": overhead.get("orloj"),
        "overhead_us_p50_by_scheduler": overhead,
        "scheduler_overhead_us_mean": overhead_mean.get("orloj"),
        "overhead_us_mean_by_scheduler": overhead_mean,
        "gateway_gc_pauses": pauses,
        "exec_p99_ms": {k: round(f["p99_s"] * 1000, 3) for k, f in figures.items()},
        "exec_p50_ms": {k: round(f["p50_s"] * 1000, 3) for k, f in figures.items()},
        "batch8_ms": {k: round(f["batch8_s"] * 1000, 3) for k, f in figures.items()},
        "rate_rps": {k: round(r, 1) for k, r in main_rates.items()},
        "capacity_rps": {k: round(f["capacity_rps"], 1) for k, f in figures.items()},
        "requests_per_class": {k: {c or "all": len(r) for c, r in v.items()}
                               for k, v in classes.items()},
        "load": args.load, "seconds_per_run": args.seconds, "slos": slos,
        "dynamic_model": any(w.model is DYNAMIC for w in workloads),
        "outcomes": result["outcomes"], "outcomes_by_class": result["outcomes_by_class"],
        "repeats": args.repeats, "deadline_propagated": args.propagate_deadline,
        "client_send_lag_ms": result["send_lag_ms"], "client_nice": client_nice,
        "finish_rate_by_repeat": result["finish_rate_by_repeat"],
        "wall_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
