"""False alarms under steady load and real failures, on the live 9-server testbed.

Usage: ``python bench/false_alarms.py [--minutes 20] [--quick] [--apps 18] [--seed 0]``.

A 9-server, 3-site testbed (Redis, the controller, one agent with its own Triton per server)
with `--apps` generated apps (half critical, headroom 20 %) and a client on every app at 5
requests/s. Under that load, for `--minutes` (5 with ``--quick``), it injects real failures of
random servers, one every 60-90 s (30-45 s with ``--quick``), the kinds taken in shuffled rounds
of three so that each occurs about as often: ``kill`` (SIGKILL of one server's process group:
agent, Triton, runtime), ``stop`` (SIGSTOP of one server's process group for `--stop-s` s, then
SIGCONT: silent, not dead) and ``site`` (SIGKILL of every server of a random site). Each is
followed by recovery, the servers' revival (a killed agent restarted, a stopped one continued;
complete when the controller sees it up and connected), convergence (fail-back, warm plan) and
`--settle-s` s before the next. Every injection's instant and kind is recorded.

At the end every failure declaration the controller made since it started
(``GET /v1/declarations``) is judged (``deploy.declarations``): true when its server was failed
by an injection and not yet revived at the declaration time (a stopped server is a true
declaration), false otherwise. Reported: declarations true and false, the apps the false ones
moved, crash detection (declaration - the SIGKILL instant of that server, kills and sites; a
site's servers are killed from the real-time class, so together) and silent detection
(declaration - SIGSTOP instant) percentiles, per-kind counts, every false declaration in full
and every missed detection (an injected server never declared). Targets: 0 false declarations,
0 apps moved by them, crash detection p99 <= 30 ms, silent detection p99 <= 150 ms, no missed
detection. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy.declarations import (  # noqa: E402
    KILL,
    KINDS,
    SITE,
    STOP,
    Injection,
    Verdict,
    classify,
    describe,
    detection_ms,
    missed,
    parse,
    percentile,
    tally,
)
from deploy.inject import fetch_declarations, injections, kill, pause, resume, revive  # noqa: E402
from deploy.report import load_requests  # noqa: E402
from deploy.testbed import Testbed, TestbedError, wait_until  # noqa: E402
from deploy.topology import make_topology  # noqa: E402

SERVERS, SITES = 9, 3
RUN_DIR = REPO / "runs" / "bench-false-alarms"


def _settled(bed: Testbed, failed: set[str]) -> bool:
    """No app served on a failed server, and none still recovering or loading."""
    for app in bed.apps():
        serving = app["serving"]
        if serving and serving["server_id"] in failed:
            return False
        if app["status"] == "recovering" or any(r["state"] == "loading"
                                                for r in app["replicas"]):
            return False
    return True


def _wait(what: str, check: Any, timeout_s: float) -> None:
    try:
        wait_until(what, check, timeout_s, 0.5)
    except TestbedError as exc:
        logging.warning("%s", exc)


def inject(bed: Testbed, kind: str, rng: random.Random, args: argparse.Namespace) -> str:
    """One injection of ``kind`` on random servers, its recovery and the revival."""
    servers = sorted(bed.state.servers)
    if kind == SITE:
        site = rng.choice(sorted({v["site_id"] for v in bed.state.servers.values()}))
        victims = bed.servers_of_site(site)
        kill(bed, victims, site=site)
        what = f"site {site} ({', '.join(victims)})"
    elif kind == KILL:
        victims = [rng.choice(servers)]
        kill(bed, victims)
        what = victims[0]
    else:
        victims = [rng.choice(servers)]
        pause(bed, victims[0])
        time.sleep(args.stop_s)
        resume(bed, victims[0])
        what = f"{victims[0]} for {args.stop_s:.0f} s"
    if kind != STOP:
        _wait(f"recovery from {what}", lambda: _settled(bed, set(victims)), 120)
    for victim in victims:
        try:
            revive(bed, victim, 180)
        except TestbedError as exc:
            logging.warning("%s", exc)
    try:
        bed.wait_converged(180)
    except TestbedError as exc:
        logging.warning("%s", exc)
    return what


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the testbed, keep the load and inject failures for the run's length."""
    topology = make_topology(SERVERS, SITES, args.apps, 0.5, 0.2)
    bed = Testbed.up(RUN_DIR, topology, seed=args.seed, clients=True, client_rate=args.rate,
                     artifacts=REPO / "runs" / "artifacts", timeout_s=900)
    rng = random.Random(args.seed)
    low, high = (30.0, 45.0) if args.quick else (60.0, 90.0)
    started = time.time()
    end = started + args.minutes * 60.0
    kinds: list[str] = []
    next_at = started + rng.uniform(low, high) / 2
    try:
        while next_at < end:
            time.sleep(max(0.0, next_at - time.time()))
            if not kinds:
                kinds = rng.sample(KINDS, len(KINDS))
            kind = kinds.pop()
            at = time.time()
            what = inject(bed, kind, rng, args)
            done = time.time()
            print(f"[{(at - started) / 60:5.1f} min] {kind:4} {what}: revived and converged "
                  f"after {done - at:.1f} s", flush=True)
            next_at = max(at + rng.uniform(low, high), done + args.settle_s)
        time.sleep(max(0.0, end - time.time()))
        finished = time.time()
        declarations = fetch_declarations(bed.http)
    finally:
        bed.down()
    return {"started": started, "finished": finished, "declarations": declarations,
            "injections": injections(bed.state),
            "requests": load_requests(RUN_DIR / "requests")}


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Print the per-kind counts, every false declaration and missed detection; the figures."""
    injected: list[Injection] = result["injections"]
    verdicts: list[Verdict] = classify(parse(result["declarations"]), injected)
    origin = result["started"]
    counts = tally(verdicts, injected)
    print(f"\ninjections ({(result['finished'] - origin) / 60:.1f} min of steady load; times "
          "below in s from its start):", flush=True)
    for kind in KINDS:
        mine = [v for v in verdicts if v.injection is not None
                and injected[v.injection].kind == kind]
        times = [ms for v in mine if (ms := detection_ms(v, injected)) is not None]
        print(f"  {kind:4}: {counts['injections'][kind]} injected, {len(mine)} true "
              f"declarations, detection p50 {percentile(times, 50)} ms, "
              f"max {percentile(times, 100)} ms", flush=True)
    print(f"declarations: {counts['declarations']} ({counts['declarations_true']} true, "
          f"{counts['false_declarations']} false)")
    for verdict in verdicts:
        print(f"  {'!' if verdict.false else ' '} {describe(verdict, injected, origin)}")
    false = [v for v in verdicts if v.false]
    print(f"false declarations in full ({len(false)}):")
    for verdict in false:
        print(f"  {verdict.declaration.model_dump_json()}")
    gaps = missed(injected, verdicts)
    print(f"missed detections ({len(gaps)}):")
    for index, server in gaps:
        print(f"  {injected[index].kind} #{index} of {server} at "
              f"{injected[index].at - origin:+.3f} s: never declared")
    requests = result["requests"]
    failed = sum(not r["ok"] for r in requests)
    print(f"client requests: {len(requests)}, {failed} failed after their retries")
    (RUN_DIR / "result.json").write_text(json.dumps({
        "injections": [vars(i) | {"revived": dict(i.revived)} for i in injected],
        "declarations": [v.declaration.model_dump() | {"false": v.false,
                                                        "injection": v.injection}
                         for v in verdicts]}, indent=2))
    return {
        "minutes": round((result["finished"] - origin) / 60, 1),
        "servers": SERVERS, "sites": SITES, "apps": args.apps, "rate_rps": args.rate,
        "injections": counts["injections"],
        "declarations": counts["declarations"],
        "declarations_true": counts["declarations_true"],
        "false_declarations": counts["false_declarations"],
        "apps_moved_by_false_declarations": counts["apps_moved_by_false_declarations"],
        "missed_detections": counts["missed_detections"],
        "crash_detection_p50_ms": counts["crash_detection_p50_ms"],
        "crash_detection_p99_ms": counts["crash_detection_p99_ms"],
        "silent_detection_p50_ms": counts["silent_detection_p50_ms"],
        "silent_detection_p99_ms": counts["silent_detection_p99_ms"],
        "requests": len(requests), "requests_failed": failed,
    }


def main() -> int:
    """Run, judge every declaration, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="5 minutes, injections closer")
    parser.add_argument("--apps", type=int, default=18)
    parser.add_argument("--rate", type=float, default=5.0, help="client requests/s per app")
    parser.add_argument("--stop-s", type=float, default=3.0, help="how long a stop lasts")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="at least this long between convergence and the next injection")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.minutes = 5.0
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(report(run(args), args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
