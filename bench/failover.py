"""Failover on a live 6-server testbed: Understudy against Full-Size-Warm(K), same run.

Usage: ``python bench/failover.py [--failures 12] [--apps 12] [--seed 0]``. For each policy a
fresh testbed (Redis, controller, 6 agents with real Triton, 3 sites) is started, then servers
are SIGKILLed one at a time (each server at least once when failures >= 6). After each
failure the bench waits until every affected app is recovered (or declared unrecoverable),
restarts the server's agent, and waits for fail-back and the warm plan to converge before
the next failure. A websocket subscriber in this process stands in for the clients: the
"client notified" instant is when it receives the event.

Figures (FailLite §5.1/§5.2): warm notify = injected failure -> client receives the warm
switch; interim first serving = injected failure -> client told the interim variant serves
(judged against the interim variant's load time three ways: the profile's figure; a median of 5
loads measured by this run on a fresh Triton once the testbeds are down, for every interim and
for interims that loaded alone in their failure; and that very load's own duration as the agent
timed it, which isolates what the control plane adds: detection, planning, notification);
upgrade done = injected failure -> client told the target serves; MTTR = detection -> client
notification (the paper's definition); recovery rate = recovered / affected apps, counted
from the records: the apps served from the killed server just before the kill (``GET
/v1/apps``), and of those the ones serving again from another server when the bench stops
waiting (whether or not an event named the failed server; the event-based figure is printed
beside it when the two differ); accuracy
reduction = mean over recovered apps of 1 - accuracy(final) / accuracy(before). Every failure
declaration of each run is printed and counted, true or false (``deploy.declarations``: false
when its server was not killed by the bench, or had been revived), with the apps it moved: a
false one moves healthy apps, which the figures above would not show. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy.declarations import classify, describe, parse, tally  # noqa: E402
from deploy.inject import fetch_declarations, injections, kill, revive  # noqa: E402
from deploy.report import recovery_from_records, serving_elsewhere, serving_on  # noqa: E402
from deploy.testbed import Testbed, TestbedError, wait_until  # noqa: E402
from deploy.topology import make_topology  # noqa: E402
from model_repo.profiles import load_families  # noqa: E402
from understudy.wire.credentials import bearer  # noqa: E402

SERVING = ("warm_switch", "interim_serving", "serving", "upgraded")


class EventRecorder:
    """Follows every event on the controller's websocket; records receipt times.

    An asyncio client on its own thread: the receipt time is taken in the thread that reads
    the socket, as soon as the frame is decoded (the sync client handed each frame to a
    second thread, one more GIL hand-off before the clock was read).
    """

    def __init__(self, controller_url: str, headers: dict[str, str] | None = None) -> None:
        self.url = controller_url.replace("http://", "ws://") + "/v1/events/ws?since=0"
        self.headers = headers or {}
        self.received: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._follow()),
                                        daemon=True)
        self._thread.start()

    async def _follow(self) -> None:
        from websockets.asyncio.client import connect

        since = 0
        while not self._stop.is_set():
            try:
                url = self.url.replace("since=0", f"since={since}")
                async with connect(url, open_timeout=5, compression=None, proxy=None,
                                   additional_headers=self.headers) as ws:
                    while not self._stop.is_set():
                        try:
                            raw = await asyncio.wait_for(ws.recv(), 0.5)
                        except TimeoutError:
                            continue
                        received_at = time.time()
                        event = json.loads(raw)
                        since = max(since, event["seq"])
                        self.received.append((received_at, event))
            except Exception:  # noqa: BLE001 - the controller restarts: reconnect
                await asyncio.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def _settled(bed: Testbed, failed: str) -> bool:
    apps = bed.apps()
    for app in apps:
        loading = any(r["state"] == "loading" for r in app["replicas"])
        serving = app["serving"]
        if serving and serving["server_id"] == failed:
            return False
        if loading or app["status"] == "recovering":
            return False
    return True


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start a testbed with ``policy``, inject failures, return outcome records."""
    topology = make_topology(servers=6, sites=3, apps=args.apps, critical_fraction=0.5,
                             headroom=0.2)
    run_dir = REPO / "runs" / f"bench-failover-{policy}"
    bed = Testbed.up(run_dir, topology, seed=args.seed, policy=policy, clients=False,
                     artifacts=REPO / "runs" / "artifacts", timeout_s=600)
    recorder = EventRecorder(bed.state.controller_url, bearer(bed.token("read")))
    failures = []
    try:
        servers = [s.server_id for s in topology.servers]
        for index in range(args.failures):
            victim = servers[index % len(servers)]
            time.sleep(1.0)
            before = serving_on(bed.apps(), [victim])
            at = kill(bed, [victim])
            try:
                wait_until(f"recovery from {victim}", lambda v=victim: _settled(bed, v), 180, 0.2)
            except TestbedError as exc:
                logging.warning("%s", exc)
            failures.append({"server": victim, "at": at, "serving_before": before,
                             "recovered": serving_elsewhere(before, bed.apps(), [victim])})
            revive(bed, victim, 120)
            try:
                bed.wait_converged(90)
            except TestbedError as exc:
                logging.warning("%s", exc)
            print(f"[{policy}] failure {index + 1}/{args.failures}: {victim}", flush=True)
    finally:
        recorder.stop()
        events = list(recorder.received)
        try:
            declarations = fetch_declarations(bed.http)
        except Exception as exc:  # noqa: BLE001 - the run's figures still count
            logging.warning("cannot read the declarations: %s", exc)
            declarations = []
        bed.down()
    return {"failures": failures, "events": events, "declarations": declarations,
            "injections": injections(bed.state)}


def judge_declarations(policy: str, run: dict[str, Any]) -> dict[str, Any]:
    """Every declaration of the run, true or false, printed in full; their counts."""
    injected = run["injections"]
    verdicts = classify(parse(run["declarations"]), injected)
    origin = injected[0].at if injected else 0.0
    for verdict in verdicts:
        print(f"[{policy}] {'FALSE ' if verdict.false else ''}declaration "
              f"{describe(verdict, injected, origin)}", flush=True)
    return tally(verdicts, injected)


def outcomes(run: dict[str, Any], families: Any) -> list[dict[str, Any]]:
    """Per failure and affected app: notification instants and variants."""
    rows = []
    received = run["events"]
    for index, failure in enumerate(run["failures"]):
        at = failure["at"]
        until = run["failures"][index + 1]["at"] if index + 1 < len(run["failures"]) else 1e18
        window = [(t, e) for t, e in received if at <= t < until
                  and e.get("failed_server") == failure["server"]]
        for app_id in sorted({e["app_id"] for _, e in window}):
            mine = [(t, e) for t, e in window if e["app_id"] == app_id]
            serving = [(t, e) for t, e in mine if e["kind"] in SERVING]
            before = [e for t, e in received if t < at and e["app_id"] == app_id
                      and e["kind"] in SERVING + ("failback",)]
            first = serving[0] if serving else None
            final = serving[-1] if serving else None
            upgraded = next(((t, e) for t, e in serving if e["kind"] in ("upgraded", "serving")),
                            None)
            interim_load_ms, variant, own_load_ms = None, None, None
            if first is not None and first[1]["kind"] in ("interim_serving", "serving"):
                variant = first[1]["variant"]
                if first[1].get("load_s") is not None:
                    own_load_ms = first[1]["load_s"] * 1000
                family = next(f for f in families.values()
                              if any(v.name == variant for v in f.variants))
                load = family.variant(variant).load_time_s
                interim_load_ms = load * 1000 if load is not None else None
            rows.append({
                "failure": index, "server": failure["server"], "app_id": app_id,
                "how": ("unrecoverable" if first is None else
                        "warm" if first[1]["kind"] == "warm_switch" else "progressive"),
                "notify_ms": (first[0] - at) * 1000 if first else None,
                "mttr_ms": ((first[0] - first[1]["failure_at"]) * 1000
                            if first and first[1].get("failure_at") else None),
                "detect_ms": ((mine[0][1]["failure_at"] - at) * 1000
                              if mine and mine[0][1].get("failure_at") else None),
                "upgrade_ms": (upgraded[0] - at) * 1000 if upgraded else None,
                "delivery_ms": ((first[0] - first[1]["time"]) * 1000
                                if first and first[1].get("time") else None),
                "interim_variant": variant,
                "interim_load_ms": interim_load_ms,
                "interim_own_load_ms": own_load_ms,
                "accuracy_before": before[-1]["accuracy"] if before else None,
                "accuracy_after": final[1]["accuracy"] if final else None,
                "variant_after": final[1]["variant"] if final else None})
    for row in rows:  # loads that shared the (2-core) machine with this one's
        row["interims_in_failure"] = sum(r["failure"] == row["failure"] and
                                         r["how"] == "progressive" for r in rows)
    return rows


def measure_load_times(variants: set[str]) -> dict[str, float]:
    """Median load time (s) of each variant on a fresh Triton on this machine, now.

    The profiles' figures were measured by an earlier build; the interim target is judged
    against both them and this same-run measurement (5 loads each, the profiler's method).
    """
    from agent.profiler import ProfileSettings, profile_store

    if not variants:
        return {}
    results, _ = profile_store(REPO / "runs" / "artifacts",
                               REPO / "runs" / "bench-failover-profile", sorted(variants),
                               ProfileSettings(repeats=5, latency_requests=5))
    return {variant: measurement.load_s for variant, (_, measurement) in results.items()}


def add_fresh_load_times(rows: list[dict[str, Any]], load_s: dict[str, float]) -> None:
    """Each progressive row gets the same-run load time of its interim variant."""
    for row in rows:
        variant = row.get("interim_variant")
        row["interim_load_now_ms"] = (round(load_s[variant] * 1000, 1)
                                      if variant in load_s else None)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)


def figures(rows: list[dict[str, Any]], failures: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate one policy's rows (and its failures' records, for the recovery rate)."""
    warm = [r["notify_ms"] for r in rows if r["how"] == "warm"]
    interim = [r["notify_ms"] for r in rows if r["how"] == "progressive"]
    excess = [r["notify_ms"] - r["interim_load_ms"] for r in rows
              if r["how"] == "progressive" and r["interim_load_ms"] is not None]
    excess_now = [r["notify_ms"] - r["interim_load_now_ms"] for r in rows
                  if r["how"] == "progressive" and r.get("interim_load_now_ms") is not None]
    own = [r["notify_ms"] - r["interim_own_load_ms"] for r in rows
           if r["how"] == "progressive" and r.get("interim_own_load_ms") is not None]
    lone = [r["notify_ms"] - r["interim_load_now_ms"] for r in rows
            if r["how"] == "progressive" and r.get("interim_load_now_ms") is not None
            and r["interims_in_failure"] == 1]
    upgrades = [r["upgrade_ms"] for r in rows if r["how"] == "progressive" and r["upgrade_ms"]]
    mttr = [r["mttr_ms"] for r in rows if r["mttr_ms"] is not None]
    detect = [r["detect_ms"] for r in rows if r["detect_ms"] is not None]
    delivery = [r["delivery_ms"] for r in rows if r.get("delivery_ms") is not None]
    reductions = [100 * (1 - r["accuracy_after"] / r["accuracy_before"]) for r in rows
                  if r["accuracy_before"] and r["accuracy_after"] is not None]
    affected, recovered = recovery_from_records(failures)
    return {
        "affected": affected,
        "warm_switches": len(warm),
        "recovery_rate": recovered / affected if affected else None,
        "affected_named_by_events": len(rows),
        "recovery_rate_from_events": (sum(r["how"] != "unrecoverable" for r in rows)
                                      / len(rows) if rows else None),
        "warm_notify_p50_ms": _pct(warm, 50), "warm_notify_p99_ms": _pct(warm, 99),
        "interim_first_serving_p50_ms": _pct(interim, 50),
        "interim_minus_load_time_p50_ms": _pct(excess, 50),
        "interim_minus_load_time_now_p50_ms": _pct(excess_now, 50),
        "interim_minus_own_load_p50_ms": _pct(own, 50),
        "lone_interims": len(lone),
        "lone_interim_minus_load_time_now_p50_ms": _pct(lone, 50),
        "upgrade_done_p50_ms": _pct(upgrades, 50),
        "detection_p50_ms": _pct(detect, 50),
        "delivery_p50_ms": _pct(delivery, 50),
        "mttr_mean_ms": round(statistics.fmean(mttr), 1) if mttr else None,
        "accuracy_reduction_pct": round(statistics.fmean(reductions), 3) if reductions
        else None,
    }


def main() -> int:
    """Run both policies and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=int, default=12)
    parser.add_argument("--apps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # This process polls the controller (main thread) while the recorder thread waits for
    # events: with CPython's default 5 ms GIL switch interval a frame that arrives while the
    # main thread parses a reply waits up to 5 ms before its receipt time is taken.
    sys.setswitchinterval(0.0005)
    families = load_families()
    runs = {policy: run_policy(policy, args) for policy in ("understudy", "full-size-warm-k")}
    all_rows = {policy: outcomes(run, families) for policy, run in runs.items()}
    judged = {policy: judge_declarations(policy, run) for policy, run in runs.items()}
    # Measured after both testbeds are down, so nothing else loads the machine meanwhile.
    load_now = measure_load_times({r["interim_variant"] for rows in all_rows.values()
                                   for r in rows if r["interim_variant"]})
    print(f"interim load times measured now (s): {json.dumps(load_now)}", flush=True)
    results = {}
    for policy, rows in all_rows.items():
        add_fresh_load_times(rows, load_now)
        results[policy] = figures(rows, runs[policy]["failures"])
        mine = results[policy]
        if mine["recovery_rate"] != mine["recovery_rate_from_events"]:
            print(f"[{policy}] recovery rate {mine['recovery_rate']} from the records "
                  f"({mine['affected']} apps served from the killed servers), "
                  f"{mine['recovery_rate_from_events']} from the events "
                  f"({mine['affected_named_by_events']} apps an event named)", flush=True)
        (REPO / "runs" / f"bench-failover-{policy}" / "outcomes.json").write_text(
            json.dumps(rows, indent=2))
        print(f"{policy}: {json.dumps(results[policy])}", flush=True)
    ours, base = results["understudy"], results["full-size-warm-k"]
    summary = {
        "failures": args.failures,
        "warm_notify_p50_ms": ours["warm_notify_p50_ms"],
        "warm_notify_p99_ms": ours["warm_notify_p99_ms"],
        "interim_first_serving_p50_ms": ours["interim_first_serving_p50_ms"],
        "interim_minus_load_time_p50_ms": ours["interim_minus_load_time_p50_ms"],
        "interim_minus_load_time_now_p50_ms": ours["interim_minus_load_time_now_p50_ms"],
        "interim_minus_own_load_p50_ms": ours["interim_minus_own_load_p50_ms"],
        "lone_interims": ours["lone_interims"],
        "lone_interim_minus_load_time_now_p50_ms":
            ours["lone_interim_minus_load_time_now_p50_ms"],
        "upgrade_done_p50_ms": ours["upgrade_done_p50_ms"],
        "detection_p50_ms": ours["detection_p50_ms"],
        "delivery_p50_ms": ours["delivery_p50_ms"],
        "recovery_rate": ours["recovery_rate"],
        **({"recovery_rate_from_events": ours["recovery_rate_from_events"]}
           if ours["recovery_rate_from_events"] != ours["recovery_rate"] else {}),
        "mttr_mean_ms": ours["mttr_mean_ms"],
        "baseline_recovery_rate": base["recovery_rate"],
        "baseline_mttr_mean_ms": base["mttr_mean_ms"],
        "mttr_ratio": (round(base["mttr_mean_ms"] / ours["mttr_mean_ms"], 2)
                       if base["mttr_mean_ms"] and ours["mttr_mean_ms"] else None),
        "accuracy_reduction_pct": ours["accuracy_reduction_pct"],
        "baseline_accuracy_reduction_pct": base["accuracy_reduction_pct"],
        # Every declaration, not only the injected failures': a false one moves healthy apps.
        "declarations": judged["understudy"]["declarations"],
        "false_declarations": judged["understudy"]["false_declarations"],
        "apps_moved_by_false_declarations":
            judged["understudy"]["apps_moved_by_false_declarations"],
        "missed_detections": judged["understudy"]["missed_detections"],
        "baseline_false_declarations": judged["full-size-warm-k"]["false_declarations"],
        "baseline_apps_moved_by_false_declarations":
            judged["full-size-warm-k"]["apps_moved_by_false_declarations"],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
