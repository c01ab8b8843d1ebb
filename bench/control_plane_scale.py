"""The control plane at scale: 1,000 simulated servers beating every 20 ms, 10,000 apps, failures.

Usage: ``python bench/control_plane_scale.py [--quick] [--agents 1000] [--apps 10000]
[--minutes 5] [--processes 4]``. Wrap a real run in ``flock /tmp/understudy-bench.lock``.

It starts a real controller (``understudy controller``, its embedded Redis and heartbeat
monitor), measures its CPU with nothing connected (``idle``), then starts the simulated agents
(``deploy.sim_control``: the real protocol, no Triton) in ``--processes`` processes held back,
and tells them all to connect at once (the *connect storm*: until every server is up and
connected in ``GET /v1/servers`` and every agent beats on its channel). It registers the
generated apps (``POST /v1/apps/batch`` by 1,000, or concurrent single POSTs where there is no
batch route), waits until every app serves and the warm plan is loaded, and then measures a
steady window of ``--minutes``: the CPU of the controller's process tree (main process,
heartbeat monitor, Redis; ``/proc/<pid>/stat``), and the monitor's own CPU and heartbeats
(``/metrics``). It times ``GET /v1/apps`` at full size, then injects ``--failures`` single-server
failures (crash and silence alternately, on servers that serve warm-covered apps, each once the
warm re-plan after the one before is done) and one whole-site failure (``--site-kind``),
following ``/v1/events/ws`` as a client would.

Figures: ``controller_cpu_pct.heartbeats`` (% of one core, steady window) and ``.idle`` (the
same before any agent connects); ``heartbeat_cpu_us`` (monitor CPU / heartbeats received; the
whole tree's CPU per heartbeat is printed beside it); ``false_declarations`` (declarations of
servers not failed by the bench, or before their failure); ``list_apps_p50_ms`` (every app:
``limit=10000`` and the whole cursor walk where the server pages, until the last body is
in; the client's time to decode it and one default page are printed too);
``failover_plan_p50_ms`` (the controller's "planned in" log lines: snapshot and plan of one
cold round); ``warm_notify_p99_ms`` (receipt of each ``warm_switch`` − the event's
``failure_at``, the detection). Detection latencies (declaration − injection) are printed
per kind. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import re
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy.sim_driver import ControllerProcess, SimAgentProcesses  # noqa: E402

PAGE = 10_000
PLANNED = re.compile(r"failover of (\S+) planned in ([0-9.]+) ms")
DECLARED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ERROR controller\.lifecycle: "
                      r"server (\S+) declared failed \(([^,)]*)", re.M)
ANNOUNCED = re.compile(r"warm switches announced ([0-9.]+) ms after detection \(([0-9.]+) ms "
                       r"waiting for the apps' locks\)")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def say(text: str) -> None:
    print(text, flush=True)


def metrics(ctl: ControllerProcess) -> dict[str, float]:
    """The unlabelled samples of ``/metrics`` (and labelled ones with their labels)."""
    found = {}
    for line in ctl.http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def walk(ctl: ControllerProcess, path: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a list endpoint, following ``X-Next-Cursor``."""
    items: list[dict[str, Any]] = []
    query: dict[str, Any] = {"limit": PAGE, **params}
    while True:
        response = ctl.http.get(path, params=query)
        response.raise_for_status()
        items += response.json()
        cursor = response.headers.get("X-Next-Cursor")
        if not cursor:
            return items
        query = {**query, "cursor": cursor}


def cpu_window(ctl: ControllerProcess, seconds: float) -> dict[str, Any]:
    """CPU % of one core of each controller process over ``seconds``, and the monitor's counters."""
    pids = ctl.pids()
    before = {name: ctl.cpu_s(pid) for name, pid in pids.items()}
    m0, t0 = metrics(ctl), time.monotonic()
    time.sleep(seconds)
    after = {name: ctl.cpu_s(pid) for name, pid in pids.items()}
    m1, wall = metrics(ctl), time.monotonic() - t0
    used = {name: after[name] - before[name] for name in pids}
    beats = m1["understudy_monitor_heartbeats_total"] - m0["understudy_monitor_heartbeats_total"]
    monitor_cpu = m1["understudy_monitor_cpu_seconds_total"] - \
        m0["understudy_monitor_cpu_seconds_total"]
    return {"wall_s": wall, "pct": 100 * sum(used.values()) / wall,
            "by_process_pct": {name: 100 * cpu / wall for name, cpu in used.items()},
            "heartbeats": beats, "heartbeats_per_s": beats / wall,
            "monitor_cpu_s": monitor_cpu, "tree_cpu_s": sum(used.values()),
            "declarations": m1["understudy_monitor_declarations_total"] -
            m0["understudy_monitor_declarations_total"]}


def connect_storm(ctl: ControllerProcess, sims: SimAgentProcesses, agents: int,
                  timeout_s: float) -> float:
    """Tell every agent to connect at once; seconds until all are up, connected and beating.

    The agents' own counters are polled first (no load on the controller); the servers' records
    once every agent beats on its channel.
    """
    started = time.monotonic()
    sims.command("connect")
    up = 0
    while time.monotonic() - started < timeout_s:
        if sims.status()["beating"] >= agents:
            servers = walk(ctl, "/v1/servers")
            up = sum(1 for s in servers if s["state"] == "up" and s["connected"])
            if up >= agents:
                return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"only {up} of {agents} servers connected in {timeout_s:.0f} s")


def register(ctl: ControllerProcess, specs: list[dict[str, Any]]) -> tuple[float, str]:
    """Register every app; (apps per second, how)."""
    started = time.monotonic()
    probe = ctl.http.post("/v1/apps/batch", json={"apps": specs[:1000]}, timeout=600)
    if probe.status_code in (404, 405):
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda s: ctl.http.post("/v1/apps", json=s).status_code,
                                  specs))
        bad = [c for c in codes if c != 201]
        how = "concurrent single POSTs (16 at once)"
    else:
        bad = [probe.status_code] if probe.status_code != 200 else []
        for first in range(1000, len(specs), 1000):
            response = ctl.http.post("/v1/apps/batch", json={"apps": specs[first:first + 1000]},
                                     timeout=600)
            bad += [response.status_code] if response.status_code != 200 else []
        how = "POST /v1/apps/batch, 1000 apps a call"
    if bad:
        raise RuntimeError(f"registration failed: {Counter(bad)}")
    return len(specs) / (time.monotonic() - started), how


def converge(ctl: ControllerProcess, apps: int, since: float, timeout_s: float) -> bool:
    """Wait until every app serves with ready replicas and a warm plan newer than ``since``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(2.0)
        serving = metrics(ctl).get('understudy_apps{status="serving"}', 0)
        plan = ctl.http.get("/v1/plan")
        planned = plan.status_code == 200 and plan.json()["solved_at"] > since
        say(f"  {serving:.0f} of {apps} apps serving; warm plan {'solved' if planned else '-'}")
        if serving < apps or not planned:
            continue
        loading = sum(1 for a in walk(ctl, "/v1/apps") for r in a["replicas"]
                      if r["state"] != "ready")
        if not loading:
            return True
        say(f"  {loading} replicas still loading")
    return False


def time_list_apps(ctl: ControllerProcess, calls: int
                   ) -> tuple[float, float, float, int]:
    """Listing every app: p50 ms until the last page's body is in, p50 ms to decode it, and
    p50 ms of one default page with its size.

    The first figure is the API's latency (the controller's work and the transfer); decoding
    megabytes of JSON is the client's own CPU and is reported beside it.
    """
    full, decode, page = [], [], []
    size = 0
    for _ in range(calls):
        started = time.perf_counter()
        bodies = []
        query: dict[str, Any] = {"limit": PAGE}
        while True:
            response = ctl.http.get("/v1/apps", params=query)
            response.raise_for_status()
            bodies.append(response.content)
            cursor = response.headers.get("X-Next-Cursor")
            if not cursor:
                break
            query = {**query, "cursor": cursor}
        full.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        for body in bodies:
            json.loads(body)
        decode.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        size = len(ctl.http.get("/v1/apps").json())
        page.append(1000 * (time.perf_counter() - started))
    return (statistics.median(full), statistics.median(decode), statistics.median(page), size)


class EventRecorder:
    """Follows ``/v1/events/ws`` (live events only) on its own thread; receipt times."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url = url.replace("http://", "ws://") + "/v1/events/ws"
        self.headers = headers or {}
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._follow()),
                                        daemon=True)
        self._thread.start()

    async def _follow(self) -> None:
        from websockets.asyncio.client import connect

        async with connect(self.url, open_timeout=10, compression=None, proxy=None,
                           max_size=None, additional_headers=self.headers) as ws:
            self.connected.set()
            while not self._stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), 0.5)
                except TimeoutError:
                    continue
                self.received.append((time.time(), json.loads(raw)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def choose_victims(apps: list[dict[str, Any]], sites: dict[str, str], count: int,
                   spare_site: str) -> list[str]:
    """Servers serving the most warm-covered apps, spread over the sites but ``spare_site``."""
    covered = Counter(a["serving"]["server_id"] for a in apps
                      if a.get("serving") and a.get("backups"))
    by_site: dict[str, list[str]] = {}
    for server, _ in covered.most_common():
        if sites.get(server) not in (None, spare_site):
            by_site.setdefault(sites[server], []).append(server)
    chosen: list[str] = []
    while len(chosen) < count and any(by_site.values()):
        for servers in by_site.values():
            if servers and len(chosen) < count:
                chosen.append(servers.pop(0))
    return chosen


def wait_declared(ctl: ControllerProcess, servers: set[str], since: int,
                  timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        declared = {d["server_id"] for d in ctl.http.get(
            "/v1/declarations", params={"since": since}).json()}
        if servers <= declared:
            return
        time.sleep(0.05)
    say(f"  not all declared within {timeout_s:.0f} s")


def last_seq(ctl: ControllerProcess) -> int:
    declarations = all_declarations(ctl)
    return declarations[-1]["seq"] if declarations else 0


def all_declarations(ctl: ControllerProcess) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        page = ctl.http.get("/v1/declarations", params={"since": found[-1]["seq"] if found
                                                        else 0, "limit": 1000}).json()
        if not page:
            return found
        found += page


def settle(ctl: ControllerProcess, quiet_s: float, limit_s: float) -> None:
    """Wait for the warm re-plan a failover asks for, then for ``quiet_s`` without another.

    Each failure then finds a controller that has finished with the one before, so that each
    one's figures are its own.
    """
    deadline = time.monotonic() + limit_s
    start = metrics(ctl)
    count = start.get("understudy_ilp_solve_seconds_count", 0)
    changed, solve_s = time.monotonic(), 0.0
    solved = False
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = metrics(ctl)
        latest = now.get("understudy_ilp_solve_seconds_count", 0)
        if latest != count:
            solve_s = (now["understudy_ilp_solve_seconds_sum"] -
                       start["understudy_ilp_solve_seconds_sum"]) / max(1, latest - count)
            count, changed, solved = latest, time.monotonic(), True
            start = now
        if solved and time.monotonic() - changed > max(quiet_s, 1.5 * solve_s):
            return
    say(f"  still re-planning after {limit_s:.0f} s")


def inject(ctl: ControllerProcess, sims: SimAgentProcesses, victims: list[str], site: str,
           args: argparse.Namespace) -> dict[str, tuple[str, float]]:
    """Fail each victim (crash, silence, ...), then the whole site; server -> (kind, at)."""
    injected: dict[str, tuple[str, float]] = {}
    for index, server in enumerate(victims):
        kind = ("crash", "silence")[index % 2]
        since = last_seq(ctl)
        at = sims.command(kind, server)[0]["at"]
        injected[server] = (kind, at)
        wait_declared(ctl, {server}, since, 5.0)
        say(f"  {kind} {server}")
        settle(ctl, args.settle_s, args.settle_limit_s)
    members = {s for s, at_site in sims.sites.items() if at_site == site}
    since = last_seq(ctl)
    for reply in sims.command(args.site_kind, f"site:{site}"):
        for server in reply["servers"]:
            injected[server] = (f"site {args.site_kind}", reply["at"])
    say(f"  {args.site_kind} of the whole {site} ({len(members)} servers)")
    wait_declared(ctl, members, since, 60.0)
    settle(ctl, args.settle_s, args.settle_limit_s)
    return injected


def _stamp(line: str) -> float | None:
    """The epoch time of a controller log line (None for a line without one)."""
    try:
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def logged_declarations(log: str, until: float) -> list[dict[str, Any]]:
    """The declarations the controller logged (the detector's instant, ms resolution).

    A declaration reaches ``/v1/declarations`` once its warm switches are out; a run that ends
    while failovers still wait for their apps' locks has logged declarations not recorded yet.
    """
    found = []
    for stamp, server, reason in DECLARED.findall(log):
        at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at <= until:
            found.append({"server_id": server, "detected_at": at, "reason": reason})
    return found


def merge(recorded: list[dict[str, Any]], logged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded declarations, plus the logged ones not recorded (marked so)."""
    extra = [{**d, "reason": f"{d['reason']} (logged, not yet in /v1/declarations)"}
             for d in logged if not any(r["server_id"] == d["server_id"] and
                                        abs(r["detected_at"] - d["detected_at"]) < 2.0
                                        for r in recorded)]
    return sorted([*recorded, *extra], key=lambda d: d["detected_at"])


def judge(declarations: list[dict[str, Any]], injected: dict[str, tuple[str, float]]
          ) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """False declarations, and detection latencies (ms) of the injected failures by kind."""
    false: list[dict[str, Any]] = []
    detection: dict[str, list[float]] = {}
    seen: set[str] = set()
    for d in declarations:
        kind_at = injected.get(d["server_id"])
        if kind_at is None or d["detected_at"] < kind_at[1]:
            false.append(d)
        elif d["server_id"] not in seen:
            seen.add(d["server_id"])
            detection.setdefault(kind_at[0], []).append(1000 * (d["detected_at"] - kind_at[1]))
    return false, detection


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--apps", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=5.0, help="steady window")
    parser.add_argument("--quick", action="store_true", help="a 1-minute steady window")
    parser.add_argument("--processes", type=int, default=4, help="sim-agents processes")
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--heartbeat-ms", type=float, default=20.0)
    parser.add_argument("--failures", type=int, default=10, help="single-server failures")
    parser.add_argument("--site-kind", choices=["crash", "silence"], default="silence")
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="quiet time after a failure's warm re-plan before the next one")
    parser.add_argument("--settle-limit-s", type=float, default=120.0)
    parser.add_argument("--converge-timeout-s", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench-control-plane-scale")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.idle_s = 1.0, 10.0
    return args


def workload(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The generated apps (specs, largest first) and the server capacity that fits them."""
    from model_repo.profiles import load_families
    from sim.generator import generate_cluster

    cluster = generate_cluster(load_families(), servers=args.agents, sites=args.sites,
                               apps=args.apps, headroom=0.2, critical_fraction=0.5,
                               seed=args.seed, rate_rps=(1.0, 5.0))
    apps = sorted(cluster.apps, key=lambda a: -cluster.primary_variant(a).memory_mb)
    specs = [{"app_id": a.app_id, "family": a.family, "critical": a.critical,
              "max_rate_rps": a.max_rate_rps, "latency_slo_ms": a.latency_slo_ms,
              "variant": cluster.primary_variant(a).name} for a in apps]
    return specs, {k: float(v) for k, v in cluster.servers[0].capacity.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:  # noqa: PLR0915 - one linear script
    shutil.rmtree(args.out, ignore_errors=True)
    specs, capacity = workload(args)
    say(f"{args.apps} apps generated; server capacity {capacity}")
    ctl = ControllerProcess(args.out, heartbeat_ms=args.heartbeat_ms)
    sims = None
    recorder = None
    try:
        ctl.wait_ready()
        idle = cpu_window(ctl, args.idle_s)
        say(f"idle controller (nothing connected, no apps), {idle['wall_s']:.0f} s: "
            f"{idle['pct']:.1f} % of a core {_by(idle)}")
        sims = SimAgentProcesses(ctl.url, args.agents, args.processes, sites=args.sites,
                                 capacity=capacity, log_dir=args.out,
                                 credentials_dir=ctl.credentials, hold=True,
                                 seed=args.seed)
        sims.wait_ready()
        storm_s = connect_storm(ctl, sims, args.agents, 120.0)
        say(f"connect storm: {args.agents} agents up, connected and beating in {storm_s:.2f} s "
            f"({sims.status()['refusals']} hellos refused with 1013)")
        registered_at = time.time()
        per_s, how = register(ctl, specs)
        say(f"registered {args.apps} apps at {per_s:.0f} apps/s ({how})")
        converged = converge(ctl, args.apps, registered_at, args.converge_timeout_s)
        say(f"converged: {converged} ({time.time() - registered_at:.0f} s after registration)")
        before = sims.status()
        steady = cpu_window(ctl, args.minutes * 60)
        after = sims.status()
        agents = sum(1 for s in walk(ctl, "/v1/servers") if s["state"] == "up" and s["connected"])
        sent = after["sent"] - before["sent"]
        say(f"steady window {steady['wall_s']:.0f} s: controller tree {steady['pct']:.1f} % of a "
            f"core {_by(steady)}; {steady['heartbeats_per_s']:.0f} heartbeats/s received, "
            f"{sent / steady['wall_s']:.0f}/s sent; monitor declarations in the window: "
            f"{steady['declarations']:.0f}; heartbeat senders: {after['late_ticks']:.0f} ticks "
            f"a period late, at worst {after['sender_max_late_ms']:.1f} ms late")
        beats = max(1.0, steady["heartbeats"])
        heartbeat_us = 1e6 * steady["monitor_cpu_s"] / beats
        say(f"CPU per heartbeat: monitor {heartbeat_us:.2f} us, whole controller tree "
            f"{1e6 * steady['tree_cpu_s'] / beats:.2f} us")
        list_ms, decode_ms, page_ms, page_size = time_list_apps(ctl, 20)
        say(f"GET /v1/apps, every app: p50 {list_ms:.1f} ms until the body is in (then "
            f"{decode_ms:.1f} ms to decode it in the client); one default page ({page_size} "
            f"apps): p50 {page_ms:.1f} ms")
        recorder = EventRecorder(ctl.url, ctl.auth)
        recorder.connected.wait(10)
        apps = walk(ctl, "/v1/apps")
        spare = f"site-{args.sites - 1:02d}"
        victims = choose_victims(apps, sims.sites, args.failures, spare)
        injected = inject(ctl, sims, victims, spare, args)
        recorder.stop()
        collected_at = time.time()
        recorded = all_declarations(ctl)
    finally:
        if recorder is not None:
            recorder.stop()
        if sims is not None:
            sims.close()
        ctl.stop()
    log = ctl.log_path.read_text(errors="replace")
    declarations = merge(recorded, logged_declarations(log, collected_at))
    say(f"declarations: {len(recorded)} in /v1/declarations, {len(declarations) - len(recorded)} "
        f"more logged whose failover had not switched its apps yet")
    false, detection = judge(declarations, injected)
    for d in false:
        say(f"FALSE declaration: {d['server_id']} ({d['reason']}) at {d['detected_at']:.3f}")
    for kind, values in sorted(detection.items()):
        say(f"detection after {kind}: n={len(values)} p50 {percentile(values, 50):.0f} ms, "
            f"p99 {percentile(values, 99):.0f} ms, max {max(values):.0f} ms")
    missed = sorted(set(injected) - {d["server_id"] for d in declarations})
    if missed:
        say(f"never declared: {len(missed)} ({', '.join(missed[:5])})")
    warm = [(t, e) for t, e in recorder.received if e["kind"] == "warm_switch"
            and e.get("failed_server") in injected and e.get("failure_at")]
    notify = [1000 * (t - e["failure_at"]) for t, e in warm]
    from_injection = [1000 * (t - injected[e["failed_server"]][1]) for t, e in warm]
    say(f"warm switches received: {len(warm)}; detection -> client p50 "
        f"{percentile(notify, 50)} ms, p99 {percentile(notify, 99)} ms; injection -> client "
        f"p50 {percentile(from_injection, 50)} ms, p99 {percentile(from_injection, 99)} ms")
    within = "\n".join(line for line in log.splitlines()
                       if (at := _stamp(line)) is not None and at <= collected_at)
    waits = [float(wait) for _, wait in ANNOUNCED.findall(within)]
    say(f"warm switches' wait for their apps' locks: "
        f"p50 {percentile(waits, 50)} ms, max {max(waits, default=None)} ms")
    planned = [float(ms) for _, ms in PLANNED.findall(within)]
    say(f"failover plans: n={len(planned)} p50 {percentile(planned, 50)} ms, "
        f"p99 {percentile(planned, 99)} ms, max {max(planned, default=None)} ms")
    return {"agents": agents, "false_declarations": len(false),
            "controller_cpu_pct": {"heartbeats": round(steady["pct"], 1),
                                   "idle": round(idle["pct"], 1)},
            "heartbeat_cpu_us": round(heartbeat_us, 2), "connect_storm_s": round(storm_s, 2),
            "register_apps_per_s": round(per_s, 1), "list_apps_p50_ms": round(list_ms, 1),
            "failover_plan_p50_ms": _round(percentile(planned, 50)),
            "warm_notify_p99_ms": _round(percentile(notify, 99))}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _by(window: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{name} {pct:.1f}" for name, pct in
                           window["by_process_pct"].items()) + ")"


def main(argv: list[str] | None = None) -> int:
    result = run(parse_args(argv))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
