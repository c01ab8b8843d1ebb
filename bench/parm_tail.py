"""Tail latency with parity models (ParM §6) against Equal-Resources, on a live testbed.

Usage: ``python bench/parm_tail.py [--rates 100,150,200] [--seconds 20] [--k 2]`` (run it under
``flock /tmp/understudy-bench.lock``: it starts a testbed; ``--help`` lists the options).

Set-up, as an operator does it (``deploy/parity_bed.py``): the digits family is trained and
imported, the parity model of ``digits_cnn`` for k is trained and written into the store, and a
testbed (Redis, controller, ``2 (k + 1)`` agents each with its own Triton, on this machine)
serves two apps of ``digits_cnn`` with the same number of servers:

- ``parm``: ``"protection": "parity:k"``: k instances and one parity model, placed by the
  controller on a server none of the instances uses;
- ``er`` (Equal-Resources, §6.1's baseline): ``"instances": k + 1`` plain instances.

One ``understudy gateway`` serves both: ``parm`` in its default mode (coding groups of k, a
prediction reconstructed as soon as the parity output and the k - 1 others are in while it is
not, §4.1's first rule; a group one of whose queries is not answered twice the median answer
time after its send filled with queries answered before, ``--group-fill-ms``), ``er`` balanced
over its instances. Each query goes to the instance with the fewest in flight (§6.1's single
queue).

**Background load** (``bench/parm_background.py``): §6.1 slows the servers that background
network shuffles run between, and only them ("we do not introduce computational
multitenancy"). Here every server shares this machine's cores, so anything that burns CPU on
one server slows all of them, the parity model and the other instances with it, which is not
the imbalance ParM is built for. The default background, ``stall``, slows one server without
burning CPU: ``--episodes`` workers each, again and again, wait an exponential time (mean
``--gap-ms``), pick one of the system's k + 1 servers at random (an instance or the parity
model) and, for a time drawn from ``--burst-ms``, pause its Triton (SIGSTOP) for
``--pause-ms`` and let it run for ``--run-ms`` in turn (by default 20 and 20: half speed, a
request held up to 20 ms, as a link shared with a shuffle; ``stall:episode``: paused for the
whole episode). ``inference`` (§6.2.4's multitenant inference) sends the chosen server bursts
of batch-8 requests straight to its Triton (``--burst-concurrency`` at once) instead; ``none``
adds nothing. ``--background`` takes several, comma-separated: the first gives the top-level
figures, each is in ``by_background``. Both systems get the same seeded schedule.

**Load**: an open-loop Poisson client at each rate of ``--rates`` for ``--seconds``, digits of
the held-out split, one query per request (batch size 1, as §6). Each query's latency is from
its scheduled send time to its answer, so a client that falls behind counts against the
system. Each system's seconds at a rate are cut into ``--slices`` slices (each after 1 s of
warm-up) taken in turn with the other system's (ParM first, then ER first, ...), so that both
meet the same machine as other work on it comes and goes. The rates go up to where the gateway
and the model instances of this machine saturate without redundancy, which ``--saturation``
reports: p99.9 of a third app of k plain instances at each rate.

**Failure case**: ParM at the middle rate, without background load; one instance's server is
SIGKILLed; every query sent from the kill until the controller has placed the instance again
(its instance_ready) is counted: answered (and how: by the model, reconstructed), or not.

Each measurement also reports how late the client sent its queries (``client_lag_*``: the
client shares the cores), the gateway's CPU time per query and how busy the machine was.

The sweeps are repeated ``--repeats`` times (default 3) on the same testbed with seeds
``--seed``, ``--seed + 1``, ...: one run's p99.9 on this shared machine moves by tens of percent.

Last line: one JSON object. ``parm`` and ``equal_resources`` hold ``p50_ms`` and ``p999_ms``
at the highest rate; ``p999_reduction_pct`` = 100 (1 - ParM p99.9 / ER p99.9) and
``median_change_pct`` = 100 (ParM p50 / ER p50 - 1), both at the highest rate; each is the
median over the repeats. ``by_background`` has both medians at every rate, ``by_repeat`` every
repeat's, ``by_rate`` the first repeat's full rows; ``failure`` has
``unanswered_during_failure``. What coding cost over the sweeps: ``parity_queries_per_query``
(parity queries sent per measured ParM query; the warm-up second of each slice sends parity
queries too, so about 1/k with every group filled by arrivals alone) and
``coding_groups`` by outcome (``filled``: sent with stand-ins for a late query).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from parm_background import KINDS, BackgroundSettings, background  # noqa: E402

from deploy.parity_bed import (  # noqa: E402
    FAMILY,
    GatewayProcess,
    prepare_store,
    register,
    servers_of,
    start_gateway,
    wait_protected,
)
from deploy.samples import LabelledSamples  # noqa: E402
from deploy.testbed import Testbed, wait_until  # noqa: E402
from deploy.topology import make_topology  # noqa: E402
from gateway.upstream import HttpUpstream, UpstreamError  # noqa: E402

VARIANT = "digits_cnn"
WARMUP_S = 1.0
"""Seconds of queries before each slice's measured ones (not counted)."""


def infer_body(images: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "image", "shape": list(images.shape),
                                   "datatype": "FP32",
                                   "data": images.ravel().tolist()}]}).encode()


JSON_HEADERS = (("Content-Type", "application/json"),)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    sources: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    """Queries sent, the warm-up's included."""
    lag_ms: list[float] = field(default_factory=list)
    """How late the client sent each query after its scheduled time (the client's own delay,
    counted in the latency)."""

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms)
        lag = np.asarray(self.lag_ms)
        return {"queries": int(lat.size) + self.errors, "errors": self.errors,
                "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "p999_ms": _pct(lat, 99.9),
                "max_ms": round(float(lat.max()), 3) if lat.size else None,
                "answers": dict(sorted(self.sources.items())),
                "client_lag_p50_ms": _pct(lag, 50), "client_lag_p999_ms": _pct(lag, 99.9)}


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values.size else None


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU jiffies of the whole machine so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return float(sum(fields) - idle), float(sum(fields))


async def one(client: HttpUpstream, hostport: str, path: str, body: bytes, due: float,
              outcome: Outcome | None, record: bool) -> None:
    loop = asyncio.get_running_loop()
    if outcome is not None and record:
        outcome.lag_ms.append((loop.time() - due) * 1000.0)
    try:
        reply = await client.request(hostport, "POST", path, JSON_HEADERS, body)
        ok = reply.status == 200
        source = reply.headers.get("understudy-answer", "model")
    except UpstreamError:
        ok, source = False, "error"
    if outcome is None or not record:
        return
    if ok:
        outcome.latencies_ms.append((loop.time() - due) * 1000.0)
        outcome.sources[source] = outcome.sources.get(source, 0) + 1
    else:
        outcome.errors += 1


async def open_loop(gateway_port: int, app_id: str, rate: float, seconds: float,
                    samples: LabelledSamples, rng: random.Random) -> Outcome:
    """Poisson arrivals at ``rate`` for ``WARMUP_S + seconds``; the warm-up is not counted."""
    client = HttpUpstream(connect_timeout_s=5.0)
    loop = asyncio.get_running_loop()
    outcome = Outcome()
    bodies = [infer_body(samples.next()[0]) for _ in range(256)]
    hostport, path = f"127.0.0.1:{gateway_port}", f"/v2/models/{app_id}/infer"
    tasks: set[asyncio.Task[None]] = set()
    start = loop.time()
    due = start
    n = 0
    while due < start + WARMUP_S + seconds:
        due += rng.expovariate(rate)
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(client, hostport, path, bodies[n % len(bodies)], due,
                                    outcome, due >= start + WARMUP_S))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    await client.close()
    outcome.sent = n
    return outcome


def targets_of(bed: Testbed, app_id: str) -> list[tuple[str, str]]:
    """(host:port, Triton model) of every model the app has on a server (instances, parity)."""
    view = bed.http.get(f"/v1/apps/{app_id}").json()
    servers = {s["server_id"]: s for s in bed.http.get("/v1/servers").json()}
    found = []
    for replica in view["replicas"]:
        if replica["state"] == "ready" and replica["role"] in ("primary", "instance", "parity"):
            http = servers[replica["server_id"]]["http"].removeprefix("http://")
            found.append((http, f"{app_id}__{replica['variant']}"))
    return sorted(found)


@dataclass
class Tally:
    """One system's measurements at one rate, over its slices."""

    outcome: Outcome = field(default_factory=Outcome)
    episodes: int = 0
    gateway_cpu_s: float = 0.0
    busy: float = 0.0
    total: float = 0.0

    def add(self, outcome: Outcome) -> None:
        self.outcome.latencies_ms += outcome.latencies_ms
        self.outcome.lag_ms += outcome.lag_ms
        self.outcome.errors += outcome.errors
        self.outcome.sent += outcome.sent
        for source, count in outcome.sources.items():
            self.outcome.sources[source] = self.outcome.sources.get(source, 0) + count

    def summary(self) -> dict[str, Any]:
        return {**self.outcome.summary(), "background_episodes": self.episodes,
                "gateway_cpu_ms_per_query": round(1000.0 * self.gateway_cpu_s
                                                  / max(1, self.outcome.sent), 3),
                "machine_busy_pct": round(100.0 * self.busy / max(1.0, self.total), 1)}


async def measure(gateway: GatewayProcess, app_id: str, rate: float, seconds: float,
                  samples: LabelledSamples, bed: Testbed, settings: BackgroundSettings,
                  seed: int, tally: Tally) -> None:
    """One slice: the app at ``rate`` for ``seconds`` under the background; into ``tally``."""
    stop = asyncio.Event()
    cpu_before = cpu_seconds(gateway.process.pid)
    busy_before, total_before = machine_busy()
    noise = asyncio.ensure_future(background(targets_of(bed, app_id), settings, seed, stop))
    try:
        outcome = await open_loop(gateway.port, app_id, rate, seconds, samples,
                                  random.Random(seed))
    finally:
        stop.set()
        tally.episodes += await noise
    tally.gateway_cpu_s += cpu_seconds(gateway.process.pid) - cpu_before
    busy_after, total_after = machine_busy()
    tally.busy += busy_after - busy_before
    tally.total += total_after - total_before
    tally.add(outcome)


def failure_case(bed: Testbed, gateway_port: int, rate: float, samples: LabelledSamples,
                 seed: int) -> dict[str, Any]:
    """Kill one ParM instance's server under load; count what is answered until it is back."""
    view = bed.http.get("/v1/apps/parm").json()
    killed = servers_of(view)["instance"][0]
    state: dict[str, Any] = {}

    async def run() -> Outcome:
        outcome = Outcome()
        client = HttpUpstream(connect_timeout_s=5.0)
        loop = asyncio.get_running_loop()
        rng = random.Random(seed)
        bodies = [infer_body(samples.next()[0]) for _ in range(256)]
        tasks: set[asyncio.Task[None]] = set()
        await asyncio.sleep(1.0)
        state["killed_at"] = await asyncio.to_thread(bed.fail, [killed])
        start = loop.time()
        due, n = start, 0
        back = asyncio.ensure_future(asyncio.to_thread(replaced, bed, killed))
        while not back.done():
            due += rng.expovariate(rate)
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(one(client, f"127.0.0.1:{gateway_port}",
                                        "/v2/models/parm/infer", bodies[n % len(bodies)], due,
                                        outcome, True))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        state["failover_s"] = await back
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        await client.close()
        return outcome

    outcome = asyncio.run(run())
    summary = outcome.summary()
    return {"killed_server": killed, "queries_during_failure": summary["queries"],
            "unanswered_during_failure": outcome.errors,
            "reconstructed_during_failure": outcome.sources.get("reconstructed", 0),
            "answers": summary["answers"], "p50_ms": summary["p50_ms"],
            "p999_ms": summary["p999_ms"],
            "failover_s": round(state["failover_s"], 3), "rate_rps": rate}


def replaced(bed: Testbed, killed: str) -> float:
    """Seconds until the killed server's instance is placed again and ready."""
    started = time.monotonic()
    wait_until("the killed instance forgotten", lambda: killed not in {
        r["server_id"] for r in bed.http.get("/v1/apps/parm").json()["replicas"]}, 120, 0.02)
    wait_protected(bed, "parm", timeout_s=120)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="100,150,200",
                        help="query rates (requests/s), comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="measured seconds per rate and system")
    parser.add_argument("--slices", type=int, default=4,
                        help="each system's seconds at a rate in this many slices, taken in "
                             "turn with the other system's")
    parser.add_argument("--k", type=int, default=2, choices=(2, 3, 4))
    parser.add_argument("--background", default="stall",
                        help=f"background kinds, comma-separated ({', '.join(KINDS)}; "
                             "stall:PAUSE/RUN for a stall with its own --pause-ms and "
                             "--run-ms, stall:episode for whole-episode pauses); the first "
                             "gives the top-level figures, each is in by_background")
    parser.add_argument("--episodes", type=int, default=2,
                        help="background episodes running side by side")
    parser.add_argument("--gap-ms", type=float, default=300.0)
    parser.add_argument("--burst-ms", default="100,400",
                        help="an episode's length, drawn uniformly between the two")
    parser.add_argument("--pause-ms", type=float, default=20.0,
                        help="stall: each pause of the server")
    parser.add_argument("--run-ms", type=float, default=20.0,
                        help="stall: the server runs this long between pauses (0: paused for "
                             "the whole episode)")
    parser.add_argument("--burst-concurrency", type=int, default=8,
                        help="inference: requests at once")
    parser.add_argument("--saturation", action="store_true",
                        help="also measure k plain instances (no redundancy) at each rate")
    parser.add_argument("--straggler-ms", type=float, default=None,
                        help="ParM's straggler time (the gateway's --straggler-ms; default "
                             "its own: 0, reconstruct as soon as possible)")
    parser.add_argument("--group-fill-ms", type=float, default=None,
                        help="the gateway's --group-fill-ms (default its own: twice the median "
                             "answer time; 50, the group timeout: no group filled)")
    parser.add_argument("--no-failure", action="store_true", help="skip the failure case")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3,
                        help="sweeps of every background, seeds --seed, --seed + 1, ...; the "
                             "headline figures are their medians")
    parser.add_argument("--work", type=Path, default=None)
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: "
                                                      "%(message)s")
    rates = [float(r) for r in options.rates.split(",")]
    lo, hi = (float(x) for x in options.burst_ms.split(","))
    if options.slices < 1:
        parser.error("--slices: at least 1")
    if options.repeats < 1:
        parser.error("--repeats: at least 1")
    default = BackgroundSettings("stall", options.episodes, options.gap_ms, (lo, hi),
                                 options.burst_concurrency, options.pause_ms, options.run_ms)
    try:
        backgrounds = [default.parse(spec) for spec in options.background.split(",")]
    except ValueError as exc:
        parser.error(f"--background: {exc}")
    work = options.work or Path(tempfile.mkdtemp(prefix="parm-tail-"))
    started = time.monotonic()
    store = work / "artifacts"
    prepare_store(store, VARIANT, [options.k])
    setup_s = time.monotonic() - started
    servers = 2 * (options.k + 1) + (options.k if options.saturation else 0)
    topology = make_topology(servers=servers, sites=2, apps=0, families=(FAMILY,))
    bed = Testbed.up(work / "bed", topology, artifacts=store, clients=False, register=False,
                     timeout_s=300)
    gateway = None
    try:
        top = max(rates)
        register(bed, "parm", VARIANT, protection=f"parity:{options.k}", rate_rps=top)
        register(bed, "er", VARIANT, instances=options.k + 1, rate_rps=top)
        if options.saturation:
            register(bed, "plain", VARIANT, instances=options.k, rate_rps=top)
        extra = ["--max-in-flight", "1024", "--deadline-s", "30"]
        if options.straggler_ms is not None:
            extra += ["--straggler-ms", f"parm={options.straggler_ms:g}"]
        if options.group_fill_ms is not None:
            extra += ["--group-fill-ms", f"{options.group_fill_ms:g}"]
        gateway = start_gateway(work / "gateway", bed.state.controller_url, *extra,
                                token_file=bed.token_file("gateway"))
        samples = LabelledSamples.from_store(store, FAMILY, seed=options.seed)
        assert samples is not None  # noqa: S101 - the import copied the evaluation set
        systems = [("parm", "parm"), ("equal_resources", "er")]
        if options.saturation:
            systems.append(("no_redundancy", "plain"))
        sweeps = [{settings.name: sweep(gateway, bed, samples, systems, rates,
                                        options.seconds, options.slices, settings,
                                        options.seed + repeat)
                   for settings in backgrounds}
                  for repeat in range(options.repeats)]
        swept = gateway.metrics()  # the sweeps' parity queries, before the failure case's
        failure = None if options.no_failure else failure_case(
            bed, gateway.port, rates[len(rates) // 2], samples, options.seed)
        metrics = gateway.metrics()
    finally:
        if gateway is not None:
            gateway.stop()
        bed.down()
    first = backgrounds[0].name
    top = f"{max(rates):g}"
    top_rows = [by_background[first][top] for by_background in sweeps]
    result = {
        "k": options.k, "variant": VARIANT, "rates_rps": rates, "seconds": options.seconds,
        "slices": options.slices, "repeats": options.repeats,
        "straggler_ms": options.straggler_ms or 0.0,
        "group_fill_ms": "twice the median answer" if options.group_fill_ms is None
        else options.group_fill_ms,
        "background": backgrounds[0].describe(),
        "parm": {key: _median(row["parm"][key] for row in top_rows)
                 for key in ("p50_ms", "p999_ms")},
        "equal_resources": {key: _median(row["equal_resources"][key] for row in top_rows)
                            for key in ("p50_ms", "p999_ms")},
        "p999_reduction_pct": _median(row["p999_reduction_pct"] for row in top_rows),
        "median_change_pct": _median(row["median_change_pct"] for row in top_rows),
        "by_rate": sweeps[0][first],
        "by_background": {settings.name: {
            f"{rate:g}": {key: _median(s[settings.name][f"{rate:g}"][key] for s in sweeps)
                          for key in ("p999_reduction_pct", "median_change_pct")}
            for rate in rates} for settings in backgrounds},
        "by_repeat": [{kind: {rate: {key: row[key] for key in ("p999_reduction_pct",
                                                               "median_change_pct")}
                              for rate, row in rows.items()}
                       for kind, rows in by_background.items()} for by_background in sweeps],
        "failure": failure,
        "unanswered_during_failure": None if failure is None
        else failure["unanswered_during_failure"],
        "reconstructions_total": _metric_sum(metrics, "understudy_gateway_reconstructions_total"),
        **_parity_cost(swept, sweeps),
        "setup_s": round(setup_s, 1), "total_s": round(time.monotonic() - started, 1)}
    print(json.dumps(result))
    return 0


def sweep(gateway: GatewayProcess, bed: Testbed, samples: LabelledSamples,
          systems: list[tuple[str, str]], rates: list[float], seconds: float, slices: int,
          settings: BackgroundSettings, seed: int) -> dict[str, dict[str, Any]]:
    """Every system at every rate under one background.

    Each system's ``seconds`` are cut into ``slices`` taken in turn with the other systems'
    (the first system first, then the last first, ...), so that both meet the same machine
    (other work on it comes and goes); both systems get the same background schedule in a
    slice.
    """
    by_rate: dict[str, dict[str, Any]] = {}
    for index, rate in enumerate(rates):
        tallies = {name: Tally() for name, _ in systems}
        for part in range(slices):
            for name, app_id in systems if part % 2 == 0 else systems[::-1]:
                asyncio.run(measure(gateway, app_id, rate, seconds / slices, samples, bed,
                                    settings, seed * 1000 + index * 100 + part, tallies[name]))
        row = by_rate[f"{rate:g}"] = {name: {**tally.summary(), "rate_rps": rate}
                                      for name, tally in tallies.items()}
        for name, _ in systems:
            print(json.dumps({"background": settings.name, "rate_rps": rate, "system": name,
                              **row[name]}), flush=True)
        row["p999_reduction_pct"] = _reduction(row)
        row["median_change_pct"] = _median_change(row)
    return by_rate


def _median(values: Iterable[float]) -> float:
    return round(statistics.median(values), 3)


def _reduction(row: dict[str, Any]) -> float:
    return round(100.0 * (1.0 - row["parm"]["p999_ms"] / row["equal_resources"]["p999_ms"]), 1)


def _median_change(row: dict[str, Any]) -> float:
    return round(100.0 * (row["parm"]["p50_ms"] / row["equal_resources"]["p50_ms"] - 1.0), 1)


def _parity_cost(metrics: str, sweeps: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """What coding cost in the sweeps: parity queries per ParM query, groups by outcome."""
    queries = sum(row["parm"]["queries"] for by_background in sweeps
                  for rows in by_background.values() for row in rows.values())
    parity = _metric_sum(metrics, 'understudy_gateway_parity_queries_total{app_id="parm"')
    groups = {outcome: int(_metric_sum(metrics, "understudy_gateway_coding_groups_total"
                                       f'{{app_id="parm",outcome="{outcome}"}}'))
              for outcome in ("encoded", "filled", "timeout", "unencodable")}
    return {"parity_queries_per_query": round(parity / queries, 3) if queries else None,
            "coding_groups": groups}


def _metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


if __name__ == "__main__":
    sys.exit(main())
