"""Client-observed outage on a live 6-server testbed, through the gateway and through the SDK.

Usage: ``python bench/client_outage.py [--singles 24] [--site-failures 4] [--quick]``.

A 6-server, 3-site testbed (Redis, the controller, one agent with its own Triton per server,
the testbed's inference gateway) with 12 generated apps, half critical, their weights at
``--scale`` (0.1) of the profiled sizes. First, the latency the gateway adds: one app's
requests alternate, one at a time, between the gateway and the very Triton model that serves
the app, directly (``--pairs``; the medians, the p99 of the per-pair differences, the gateway's
CPU per request). Then every app gets two clients at 5 requests/s, one through the gateway and
one through the SDK (``understudy/client.py``), for the rest of the run; and around each
failure up to ``--fast-apps`` of the apps it hits, taken in turn, get two more at 50
requests/s (started before the kill, stopped before the revival). Failures: ``--singles``
SIGKILLs of one server (round robin) and ``--site-failures`` of a whole site, one at a time;
after each the bench waits until the apps serve elsewhere and nothing loads, watches
``--observe-s`` more, stops the fast clients, revives the servers and waits for fail-back and
the warm plan.

Every client stamps every request (``deploy.gateway_load.stamp``) and ``deploy.outage`` judges
them: per failure, affected app and client, the outage (the failure -> that client's first
successful response from a surviving server) and the longest gap between its successes, and
every request sent (answered, errors returned, lost: no answer and no error). The headline
outage figures are the 50 requests/s clients' (both paths): a 5 requests/s client sends every
200 ms, so its outage includes on average 100 ms of waiting for its own next request; the
5 requests/s figures are printed and in the JSON too. Whether an app was warm or progressive
comes from the controller's events; a progressive app's outage is set against its interim's
load time as the agent measured it in this run (the event's ``load_s``). The gateway's
requests per CPU-second come from its process's CPU time over the failure phase. The last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import logging
import os
import random
import re
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from deploy.declarations import classify, parse, tally  # noqa: E402
from deploy.gateway_load import encode_infer  # noqa: E402
from deploy.inject import fetch_declarations, injections, kill, revive  # noqa: E402
from deploy.outage import (  # noqa: E402
    LOOKBACK_S,
    client_outages,
    outage_figures,
    outages_json,
    percentile,
    print_outages,
    request_counts,
)
from deploy.report import analyse, load_requests, outcomes_json, serving_on  # noqa: E402
from deploy.testbed import Testbed, TestbedError, wait_until  # noqa: E402
from deploy.timeline import format_timeline, timeline  # noqa: E402
from deploy.topology import make_topology  # noqa: E402
from model_repo.artifacts import DEFAULT_SCALE  # noqa: E402
from model_repo.worker_priority import starting_boost_s  # noqa: E402

RUN_DIR = REPO / "runs" / "bench-client-outage"
SLOWEST_SHOWN = 4
"""Warm outages of the 50 requests/s clients printed with their timelines (all are saved)."""
SLOW_RPS, FAST_RPS = 5.0, 50.0
BENCH_SCALE = 0.1
"""Weights at a tenth of their profiled size: every request reads all of its model's weights,
and at the demo's scale the largest apps' 5 requests/s clients alone keep a 2-core machine
busy, so that the figures would measure the bench's own overload, not the failover."""


# --- the gateway's added latency -----------------------------------------------------------

def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot (``/proc/stat``)."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def busy_pct(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The machine's busy share between two :func:`machine_cpu` readings, percent."""
    total = after[1] - before[1]
    return round(100.0 * (after[0] - before[0]) / total, 1) if total else 0.0


def added_latency(bed: Testbed, pairs: int, warmup: int) -> dict[str, Any]:
    """One app's request, alternately through the gateway and to its Triton model directly."""
    app = next(a for a in bed.apps() if a["serving"])
    serving = app["serving"]
    direct = serving["endpoint"]["http"].removeprefix("http://")
    gateway = bed.state.gateway_url.removeprefix("http://")
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    body, headers = encode_infer(image)
    paths = {"gateway": (gateway, f"/v2/models/{app['app_id']}/infer"),
             "direct": (direct, f"/v2/models/{serving['model_name']}/infer")}
    connections = {key: http.client.HTTPConnection(*_host_port(where), timeout=30)
                   for key, (where, _) in paths.items()}
    times: dict[str, list[float]] = {"gateway": [], "direct": []}
    gateway_pid = bed.state.processes["gateway"].pid
    order = list(paths)
    cpu_before, machine_before = 0.0, machine_cpu()
    for i in range(warmup + pairs):
        if i == warmup:
            cpu_before, machine_before = cpu_s(gateway_pid), machine_cpu()
        random.shuffle(order)  # neither path always goes first
        for key in order:
            connection = connections[key]
            started = time.perf_counter()
            connection.request("POST", paths[key][1], body, headers)
            response = connection.getresponse()
            response.read()
            elapsed = (time.perf_counter() - started) * 1000.0
            if response.status != 200:
                raise RuntimeError(f"{key}: HTTP {response.status}")
            if i >= warmup:
                times[key].append(elapsed)
    cpu = cpu_s(gateway_pid) - cpu_before
    for connection in connections.values():
        connection.close()
    gateway_ms, direct_ms = times["gateway"], times["direct"]
    return {"app_id": app["app_id"], "variant": serving["variant"], "pairs": pairs,
            "gateway_p50_ms": statistics.median(gateway_ms),
            "direct_p50_ms": statistics.median(direct_ms),
            "added_p50_ms": statistics.median(gateway_ms) - statistics.median(direct_ms),
            "added_pair_p50_ms": statistics.median(
                g - d for g, d in zip(gateway_ms, direct_ms, strict=True)),
            "added_pair_p99_ms": percentile(
                [g - d for g, d in zip(gateway_ms, direct_ms, strict=True)], 99),
            "gateway_p99_ms": percentile(gateway_ms, 99),
            "direct_p99_ms": percentile(direct_ms, 99),
            "gateway_cpu_ms_per_request": cpu * 1000.0 / pairs,
            "machine_busy_pct": busy_pct(machine_before, machine_cpu())}


def _host_port(where: str) -> tuple[str, int]:
    host, _, port = where.rpartition(":")
    return host, int(port)


# --- clients -------------------------------------------------------------------------------

def answered_since(bed: Testbed, app_ids: list[str], via: str, rate: float, since: float,
                   count: int) -> bool:
    """Whether each app's ``via@rate`` client got ``count`` answers since ``since``."""
    directory = Path(bed.state.run_dir) / "requests"
    for app_id in app_ids:
        path = directory / f"{app_id}.{via}-{rate:g}rps.jsonl"
        if not path.exists():
            return False
        lines = path.read_text(encoding="utf-8").splitlines()
        if sum(1 for line in lines[-400:] if line.strip()
               and (r := json.loads(line))["ok"] and r["done_at"] > since) < count:
            return False
    return True


def start_fast_clients(bed: Testbed, app_ids: list[str]) -> list[str]:
    """50 requests/s clients of ``app_ids`` through both paths; waits until they are answered."""
    since = time.time()
    names = []
    for via in ("gateway", "sdk"):
        name = f"clients-fast-{via}"
        bed.start_clients(FAST_RPS, via=via, app_ids=app_ids, name=name)
        names.append(name)
    for via in ("gateway", "sdk"):
        try:
            wait_until(f"the fast {via} clients", lambda v=via: answered_since(
                bed, app_ids, v, FAST_RPS, since, 10), 30, 0.2)
        except TestbedError as exc:
            logging.warning("%s", exc)
    return names


def stop_clients(bed: Testbed, names: list[str]) -> None:
    """SIGTERM the client processes and wait until they exit (their last records written)."""
    for name in names:
        try:
            bed.kill_process(name, signal.SIGTERM)
        except TestbedError as exc:
            logging.warning("%s", exc)
            bed.kill_process(name, signal.SIGKILL)


# --- failures ------------------------------------------------------------------------------

def schedule(bed: Testbed, singles: int, sites: int) -> list[tuple[list[str], str]]:
    """(servers, site) per failure: singles round robin, the site failures spread among them."""
    servers = sorted(bed.state.servers, key=lambda s: int(s.lstrip("s")))
    site_ids = sorted({v["site_id"] for v in bed.state.servers.values()})
    plan: list[tuple[list[str], str]] = [([servers[i % len(servers)]], "")
                                         for i in range(singles)]
    for k in range(sites):
        site = site_ids[k % len(site_ids)]
        at = round((k + 1) * len(plan) / (sites + 1)) + k
        plan.insert(min(at, len(plan)), (bed.servers_of_site(site), site))
    return plan


def settled(bed: Testbed, failed: list[str]) -> bool:
    """No app served from a failed server, none recovering, no replica loading."""
    for app in bed.apps():
        serving = app["serving"]
        if serving and serving["server_id"] in failed:
            return False
        if app["status"] == "recovering" or any(r["state"] == "loading"
                                                for r in app["replicas"]):
            return False
    return True


def fast_apps(affected: list[str], index: int, count: int) -> list[str]:
    """``count`` of a failure's apps for the fast clients, taken in turn (not by outcome)."""
    if len(affected) <= count:
        return affected
    start = index % len(affected)
    return sorted((affected + affected)[start:start + count])


def inject(bed: Testbed, servers: list[str], site: str, observe_s: float,
           fast: list[str] | None = None) -> float:
    """One failure, fast clients on ``fast`` of its apps; returns where its window ends."""
    affected = serving_on(bed.apps(), servers)
    chosen = [a for a in affected if fast is None or a in fast]
    names = start_fast_clients(bed, chosen) if chosen else []
    time.sleep(0.5)
    kill(bed, servers, site=site)
    try:
        wait_until(f"recovery from {','.join(servers)}", lambda: settled(bed, servers), 180,
                   0.2)
    except TestbedError as exc:
        logging.warning("%s", exc)
    time.sleep(observe_s)
    end = time.time()
    stop_clients(bed, names)
    for server in servers:
        try:
            revive(bed, server, 180)
        except TestbedError as exc:
            logging.warning("%s", exc)
    try:
        bed.wait_converged(120)
    except TestbedError as exc:
        logging.warning("%s", exc)
    return end


# --- figures -------------------------------------------------------------------------------

MOVE_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO gateway\.board: "
                       r"route (\S+): (\S+) -> (\S+)")


def gateway_moves(log: Path) -> list[tuple[float, str, str]]:
    """(when, app, server it left) of every route change the gateway logged."""
    moves = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        found = MOVE_LINE.match(line)
        if found:
            stamp, app_id, before = found.group(1), found.group(2), found.group(3)
            when = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            moves.append((when, app_id, before.split("/")[0]))
    return moves


def breakdown(failures: list[dict[str, Any]], outcomes: list[Any], outages: list[Any],
              requests: list[dict[str, Any]], moves: list[tuple[float, str, str]]
              ) -> dict[str, Any]:
    """Where a 50 requests/s client's outage went: the controller's notification, the
    gateway learning of the move, and the rest (the request to the new replica, which includes
    its inference on a machine shared with everything else); the clients' latency just before
    the failure, for scale."""
    notify = {(o.failure, o.app_id): o.notification_ms for o in outcomes}
    how = {(o.failure, o.app_id): o.how for o in outcomes}
    learned: dict[tuple[int, str], float] = {}
    for index, failure in enumerate(failures):
        at, failed = failure["at"], set(failure["servers"])
        for when, app_id, left in moves:
            if when >= at - 0.001 and left in failed and (index, app_id) not in learned:
                learned[(index, app_id)] = (when - at) * 1000.0
    fast = [o for o in outages if o.rate == FAST_RPS and o.outage_ms is not None]
    before = []
    for o in fast:
        at = failures[o.failure]["at"]
        mine = [(r["done_at"] - r["sent_at"]) * 1000.0 for r in requests
                if r["app_id"] == o.app_id and r.get("via") == o.via and r.get("rate") == o.rate
                and r["ok"] and at - LOOKBACK_S <= r["sent_at"] and r["done_at"] <= at]
        if mine:
            before.append(statistics.median(mine))
    figures = {}
    for kind in ("warm", "progressive"):
        keys = [k for k, v in how.items() if v == kind]
        figures[f"{kind}_notify_p50_ms"] = _pct([notify[k] for k in keys
                                                 if notify.get(k) is not None], 50)
        figures[f"{kind}_gateway_moved_p50_ms"] = _pct([learned[k] for k in keys
                                                        if k in learned], 50)
        figures[f"{kind}_after_notify_p50_ms"] = _pct(
            [o.outage_ms - notify[(o.failure, o.app_id)] for o in fast
             if how.get((o.failure, o.app_id)) == kind
             and notify.get((o.failure, o.app_id)) is not None], 50)
    figures["client_latency_before_p50_ms"] = _pct(before, 50)
    return figures

def _pct(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return round(value, 1) if value is not None else None


def judge(failures: list[dict[str, Any]], events: list[dict[str, Any]],
          requests: list[dict[str, Any]], ends: list[float]) -> dict[str, Any]:
    """The run's figures from the records (printed as they are found)."""
    outcomes = analyse(failures, events, requests)
    how = {(o.failure, o.app_id): o.how for o in outcomes}
    load_ms = {(o.failure, o.app_id): o.interim_load_ms for o in outcomes}
    outages = client_outages(failures, requests, ends=ends)
    print_outages(outages, how, lambda text: print(text, end=""))
    groups = outage_figures(outages, how)
    for name, figures in groups.items():
        print(f"{name}: {json.dumps(figures)}")

    def of(kind: str, rate: float | None = FAST_RPS, via: str | None = None) -> list[Any]:
        return [o for o in outages if how.get((o.failure, o.app_id)) == kind
                and (rate is None or o.rate == rate) and (via is None or o.via == via)]

    def outage(members: list[Any]) -> list[float]:
        return [o.outage_ms for o in members if o.outage_ms is not None]

    progressive = of("progressive")
    loads = [load_ms[(o.failure, o.app_id)] for o in progressive
             if load_ms.get((o.failure, o.app_id)) is not None]
    excess = [o.outage_ms - load_ms[(o.failure, o.app_id)] for o in progressive
              if o.outage_ms is not None and load_ms.get((o.failure, o.app_id)) is not None]
    figures: dict[str, Any] = {
        "warm_outage_p50_ms": _pct(outage(of("warm")), 50),
        "warm_outage_p99_ms": _pct(outage(of("warm")), 99),
        "progressive_outage_p50_ms": _pct(outage(progressive), 50),
        "interim_load_p50_ms": _pct(loads, 50),
        "progressive_outage_minus_load_p50_ms": _pct(excess, 50),
        "warm_samples": len(of("warm")), "progressive_samples": len(progressive),
        "not_recovered": sum(o.outage_ms is None for o in outages),
    }
    for via in ("gateway", "sdk"):
        for rate in (FAST_RPS, SLOW_RPS):
            tag = f"{via}_{rate:g}rps"
            figures[f"warm_outage_{tag}_p50_ms"] = _pct(outage(of("warm", rate, via)), 50)
            figures[f"warm_outage_{tag}_p99_ms"] = _pct(outage(of("warm", rate, via)), 99)
            figures[f"progressive_outage_{tag}_p50_ms"] = _pct(
                outage(of("progressive", rate, via)), 50)
            figures[f"warm_longest_gap_{tag}_p50_ms"] = _pct(
                [o.longest_gap_ms for o in of("warm", rate, via)], 50)
    moves = gateway_moves(RUN_DIR / "logs" / "gateway.log")
    figures.update(breakdown(failures, outcomes, outages, requests, moves))
    warm = sorted((o for o in of("warm", None) if o.outage_ms is not None),
                  key=lambda o: -(o.outage_ms or 0.0))
    timelines = [timeline(o, failures[o.failure], events, requests, moves) for o in warm]
    slow = [t for t in timelines if t["client"].endswith("@50")][:SLOWEST_SHOWN]
    print(f"the {len(slow)} slowest warm outages of the 50 requests/s clients:")
    for line in slow:
        print(format_timeline(line))
    (RUN_DIR / "client_outages.json").write_text(json.dumps(
        {"outages": outages_json(outages), "outcomes": outcomes_json(outcomes),
         "groups": groups, "warm_timelines": timelines}, indent=2))
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the testbed, measure, stop it; what was measured (also kept in ``bench.json``)."""
    started = time.monotonic()
    topology = make_topology(servers=6, sites=3, apps=args.apps, critical_fraction=0.5,
                             headroom=0.2)
    # A store of its own: build_store rewrites weights built at another scale.
    artifacts = REPO / "runs" / ("artifacts" if args.scale == DEFAULT_SCALE
                                 else f"artifacts-{args.scale:g}")
    bed = Testbed.up(RUN_DIR, topology, seed=args.seed, clients=False, scale=args.scale,
                     artifacts=artifacts, timeout_s=600)
    try:
        latency = added_latency(bed, args.pairs, warmup=100)
        print(f"gateway added latency: {json.dumps(latency)}", flush=True)
        slow = []
        for via in ("gateway", "sdk"):
            slow.append(f"clients-{via}")
            bed.start_clients(SLOW_RPS, via=via, name=slow[-1])
        app_ids = [a["app_id"] for a in bed.state.apps]
        since = time.time()
        for via in ("gateway", "sdk"):
            wait_until(f"the {via} clients", lambda v=via: answered_since(
                bed, app_ids, v, SLOW_RPS, since, 2), 60, 0.5)
        gateway_pid = bed.state.processes["gateway"].pid
        cpu_before, load_started, machine_before = cpu_s(gateway_pid), time.time(), \
            machine_cpu()
        ends = []
        plan = schedule(bed, args.singles, args.site_failures)
        for index, (servers, site) in enumerate(plan):
            affected = serving_on(bed.apps(), servers)
            ends.append(inject(bed, servers, site, args.observe_s,
                               fast_apps(affected, index, args.fast_apps)))
            print(f"failure {index + 1}/{len(plan)}: {site or servers[0]} (load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        measured = {
            "latency": latency, "ends": ends, "load_started": load_started,
            "gateway_cpu_s": cpu_s(gateway_pid) - cpu_before,
            "machine_busy_pct": busy_pct(machine_before, machine_cpu()),
            # The runtimes inherit this environment: how long a worker that starts to serve
            # (a warm switch's) kept the loads' priority in this run.
            "starting_boost_s": starting_boost_s(os.environ)}
        stop_clients(bed, slow)
        measured["events"] = bed.http.get("/v1/events", params={"limit": 10000}).json()
        measured["declarations"] = tally(classify(parse(fetch_declarations(bed.http)),
                                                  injections(bed.state)), injections(bed.state))
    finally:
        bed.down()
    measured["failures"] = bed.state.failures
    measured["minutes"] = round((time.monotonic() - started) / 60.0, 1)
    measured["artifact_scale"] = args.scale
    (RUN_DIR / "bench.json").write_text(json.dumps(measured))
    return measured


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run (``run``'s result and the clients' records), printed."""
    requests = load_requests(RUN_DIR / "requests")
    counts = request_counts(requests)
    print(f"requests by client: {json.dumps(counts['by_client'])}")
    failures = measured["failures"]
    figures = judge(failures, measured["events"], requests, measured["ends"])
    latency = measured["latency"]
    through_gateway = sum(1 for r in requests if r.get("via") == "gateway"
                          and r["sent_at"] >= measured["load_started"])
    gateway_cpu = measured["gateway_cpu_s"]

    def ms(value: float | None) -> float | None:
        return round(value, 3) if value is not None else None

    return {
        **figures,
        "requests": counts["requests"], "lost_requests": counts["lost_requests"],
        "errors_returned": counts["errors_returned"],
        "gateway_added_latency_p50_ms": ms(latency["added_p50_ms"]),
        "gateway_added_latency_p99_ms": ms(latency["added_pair_p99_ms"]),
        "gateway_added_latency_pair_p50_ms": ms(latency["added_pair_p50_ms"]),
        "direct_p50_ms": ms(latency["direct_p50_ms"]),
        "gateway_cpu_ms_per_request": ms(latency["gateway_cpu_ms_per_request"]),
        "gateway_rps_per_core": round(through_gateway / gateway_cpu, 1) if gateway_cpu else None,
        "latency_machine_busy_pct": latency["machine_busy_pct"],
        "failures_machine_busy_pct": measured["machine_busy_pct"],
        "failures": len(failures),
        "site_failures": sum(1 for f in failures if f.get("site")),
        "false_declarations": measured["declarations"]["false_declarations"],
        "minutes": measured["minutes"],
        "artifact_scale": measured.get("artifact_scale"),
        "starting_boost_s": measured.get("starting_boost_s"),
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=24, help="single-server failures")
    parser.add_argument("--site-failures", type=int, default=4, help="whole-site failures")
    parser.add_argument("--apps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=1000,
                        help="requests per path for the gateway's added latency")
    parser.add_argument("--observe-s", type=float, default=2.0,
                        help="watching the clients after a recovery settled")
    parser.add_argument("--fast-apps", type=int, default=2,
                        help="per failure, how many of its apps get the 50 requests/s clients")
    parser.add_argument("--scale", type=float, default=BENCH_SCALE,
                        help=f"artifact scale (the demo's: {DEFAULT_SCALE})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="4 single-server failures, 1 site failure, 300 pairs")
    parser.add_argument("--rejudge", action="store_true",
                        help="no run: judge the last run again from its saved records")
    args = parser.parse_args()
    if args.quick:
        args.singles, args.site_failures, args.pairs = 4, 1, 300
    logging.basicConfig(level=logging.WARNING)
    measured = (json.loads((RUN_DIR / "bench.json").read_text()) if args.rejudge
                else run(args))
    print(json.dumps(summarise(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
