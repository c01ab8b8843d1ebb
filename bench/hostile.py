"""Hostile input against a real controller and Redis: every case counted, nothing may break.

Usage: ``python bench/hostile.py [--registrations 2000] [--outage-calls 200]
[--keep-logs DIR]``.

Starts a redis-server of its own and ``understudy controller`` on it (with a small artifact
store), then replays, group by group:

* ``capacities``: agent hellos with NaN, infinite, negative, tiny and huge capacities and
  heartbeat intervals (refused: close 1008, nothing written);
* ``ids``: empty, overlong, unicode and unsafe server, site and app ids, in hellos, in REST
  bodies and in paths (refused; 404/422, never a 5xx);
* ``bodies``: oversized bodies (with and without a length, without a credential), overlong
  fields, deep nesting, non-finite numbers, bodies that are not JSON, websocket frames over the
  protocol's limit (413/401/422, 1009);
* ``names``: glob and traversal names in the artifact route, sent as raw paths (no other
  variant's file, no store path in an answer);
* ``events``: bad query parameters and frames on the event stream;
* ``impersonation``: four simulated agents with their own credentials (they stay connected
  until the end); the second one's credential claiming the first one's server, then saying
  ``triton_down`` for it; the agent socket with no, a wrong, a forged or another role's
  credential (refused: 1008, 401, 403; the first server keeps its agent and its record);
* ``registrations``: ``--registrations`` apps registered by concurrent POSTs, and duplicates
  (201 each, 409 for a duplicate, every app listed afterwards, every app serving and every
  critical one, half of them, with a warm backup);
* ``redis``: the redis-server SIGKILLed, then ``--outage-calls`` API calls timed from the kill
  (each must be a 503 with Retry-After within a second, but a read answered from the records
  the controller held before it noticed), Redis restarted on the same data, nothing a call
  during the outage asked for applied, and every app where it was;
* ``restart``: SIGTERM (it must stop), a new controller on the same Redis must start, take
  every agent back, and serve every app where it was (same status, serving server and
  replicas), with nothing quarantined (``restart_ok``).

Every request, frame exchange and check is a case. ``crashes``: the controller exited or
/readyz was not 200 after a group. ``http_5xx``: an answer of 500 or more, except the 503s
expected while Redis is down. ``state_corruptions``: a refused input that changed a record in
Redis (compared before and after), an impostor that was accepted or believed, a record
quarantined at a start (something invalid was stored), an app lost or one applied that was
refused. The last line is one JSON object: ``cases``, ``crashes``, ``http_5xx``,
``state_corruptions``, ``restart_ok``, ``redis_down_fail_fast_p99_ms`` (the p99 time from
sending a call during the outage to its 503), per-group case counts and the first failures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import httpx  # noqa: E402
from hostile_harness import (  # noqa: E402
    PREFIX,
    Bench,
    Placement,
    declared,
    exchange,
    hello,
    last_declaration,
    listed_apps,
    placements,
    raw,
    servers,
    settled,
    wait,
)

from deploy.sim_driver import SimAgentProcesses  # noqa: E402
from understudy.wire.protocol import AGENT_WS_PATH, MAX_FRAME_BYTES  # noqa: E402


def capacities(bench: Bench) -> None:
    for value in ("NaN", "Infinity", "-Infinity", "-5", "-1e-300", "1e10", "1e308", "1e309",
                  '"16000"x', "null", "[]", '{"gpu": 1}'):
        for resource in ("memory_mb", "compute"):
            bench.refused_frames([hello(capacity=f'{{"{resource}": {value}}}')], {1008},
                                 f"hello {resource}={value}")
    for interval in ("5e-324", "0", "-1", "NaN", "Infinity", "1e9"):
        bench.refused_frames([hello(heartbeat_interval_ms=interval)], {1008},
                             f"hello heartbeat_interval_ms={interval}")
    many = json.dumps({f"r{i}": 1.0 for i in range(100)})
    bench.refused_frames([hello(capacity=many)], {1008}, "hello with 100 resources")


BAD_IDS = ["", " ", "x" * 129, "x" * 100_000, "сервер-1", "服务器", "🙂", "s\u202e1", "s\u00001",
           "a/b", "../etc", "*", "s 1", "_s", "a__b"]


def ids(bench: Bench) -> None:
    for bad in BAD_IDS[:-1]:  # "a__b" is a valid server id; only app ids may not hold "__"
        bench.refused_frames([hello(bad)], {1008}, f"hello server_id={bad[:20]!r}")
        bench.refused_frames([hello(site=json.dumps(bad))], {1008},
                             f"hello site_id={bad[:20]!r}")
    bench.refused_frames([hello("x" * (MAX_FRAME_BYTES + 1))], {1009}, "hello id over 4 MiB")
    for bad in BAD_IDS:
        bench.request("POST", "/v1/apps", {422}, f"POST app_id={bad[:20]!r}",
                      json={"app_id": bad, "family": "mobilenet_v3"})
        bench.request("POST", "/v1/apps", {422}, f"POST family={bad[:20]!r}",
                      json={"app_id": "ok-1", "family": bad})
        for method, path in (("GET", "/v1/apps/"), ("DELETE", "/v1/apps/"),
                             ("GET", "/v1/servers/"), ("POST", "/v1/servers/")):
            suffix = "/drain" if method == "POST" else ""
            before = bench.dump()
            target = path + quote(bad, safe="") + suffix
            status, _ = raw(bench, method, target)
            # An empty id is another path (307 to /v1/apps, 404); an overlong request
            # line is refused by the HTTP server itself (400).
            bench.tally.answer((status, b""), {307, 400, 404, 405, 414, 422},
                               f"{method} {path}{bad[:20]!r}{suffix}")
            bench.unchanged(before, f"{method} {path}{bad[:20]!r}")


def bodies(bench: Bench) -> None:
    http = bench.controller.http
    app = {"app_id": "body-1", "family": "mobilenet_v3"}
    bench.request("POST", "/v1/apps", {413}, "10 MB body",
                  json={**app, "pinned_site": "x" * 10_000_000})
    bench.request("POST", "/v1/apps", {422}, "900 KB field",
                  json={**app, "pinned_site": "x" * 900_000})
    before = bench.dump()
    anonymous = httpx.post(f"{bench.controller.url}/v1/apps", content=b"{" * 10_000_000,
                           headers={"Content-Type": "application/json"}, timeout=60)
    bench.tally.answer(anonymous, {401}, "10 MB malformed body without a credential")
    bench.unchanged(before, "anonymous body")

    def chunks() -> Any:
        for _ in range(40):
            yield b" " * 65536

    bench.request("PATCH", "/v1/config", {413}, "2.5 MB body without a length",
                  content=chunks(), headers={"Content-Type": "application/json"})
    bench.request("POST", "/v1/apps/batch", {413, 422}, "batch of 20,000 apps",
                  json={"apps": [{"app_id": f"b{i}", "family": "mobilenet_v3"}
                                 for i in range(20_000)]})
    for nesting in (1000, 100_000, 900_000):
        bench.request("POST", "/v1/apps", {400, 413, 422}, f"nested {nesting} deep",
                      content=b"[" * nesting, headers={"Content-Type": "application/json"})
    for name, value in (("latency_slo_ms", "Infinity"), ("latency_slo_ms", "NaN"),
                        ("latency_slo_ms", "1e309"), ("max_rate_rps", "-1"),
                        ("max_rate_rps", "Infinity")):
        bench.request("POST", "/v1/apps", {422}, f"{name}={value}",
                      content=f'{{"app_id": "nf-1", "family": "mobilenet_v3", '
                              f'"{name}": {value}}}'.encode(),
                      headers={"Content-Type": "application/json"})
    for name, value in (("heartbeat_interval_ms", "5e-324"), ("time_limit_s", "5e-324"),
                        ("alpha", "NaN"), ("alpha", "Infinity"), ("heartbeat_misses", "1e9")):
        bench.request("PATCH", "/v1/config", {422}, f"config {name}={value}",
                      content=f'{{"{name}": {value}}}'.encode(),
                      headers={"Content-Type": "application/json"})
    for content, kind in ((b"\xff\xfe\x00garbage", "application/json"),
                          (b"app_id=x", "application/x-www-form-urlencoded"),
                          (b'{"app_id": "t-1", "family": "mobilenet_v3"}', "text/plain")):
        bench.request("POST", "/v1/apps", {415, 422}, f"body as {kind}", content=content,
                      headers={"Content-Type": kind})
    bench.request("POST", "/v1/apps", {422}, "a family no artifact store holds",
                  json={"app_id": "no-weights", "family": "efficientnet"})
    bench.tally.check(http.get("/v1/apps/body-1").status_code == 404, "refused app stored",
                      corruption=True)
    bench.refused_frames(['{"v": 1, "type": "hello", "boot_id": "' + "b" * MAX_FRAME_BYTES
                          + '"}'], {1009}, "agent frame over 4 MiB")
    code, reason = exchange(f"{bench.ws}/v1/events/ws?since=1000000",
                             ["x" * (MAX_FRAME_BYTES + 1)], bench.admin)
    bench.tally.check(code == 1009, f"event stream frame over 4 MiB: {code} {reason}")


def names(bench: Bench) -> None:
    status, body = raw(bench, "GET", "/v1/artifacts/mobilenet_v3_small/manifest.json")
    bench.tally.check(status == 200 and b"mobilenet_v3_small" in body, "the real manifest")
    variants = ["*", "mobilenet_v3_*", "[a-z]*", "?obilenet_v3_small", "mobilenet_v3_smal?",
                "..", "...", "%2e%2e", "..%2f..%2fetc", "mobilenet_v3_small%2f..", "~",
                "%24HOME", "mobilenet_v3_small%00", "mobilenet_v3", "resnet50"]
    files = ["manifest.json", "../manifest.json", "*.json", "weights.pt%00", "..",
             "%2e%2e%2fmanifest.json", "manifest.json%2f..", "weights.*"]
    secrets = (str(bench.artifacts).encode(), str(bench.run_dir).encode())
    for variant in variants:
        for name in files:
            if variant == "mobilenet_v3_small" and name == "manifest.json":
                continue
            path = f"/v1/artifacts/{variant}/{name}"
            status, body = raw(bench, "GET", path)
            bench.tally.answer((status, body), {400, 404, 422}, f"GET {path}")
            bench.tally.check(b"weights_sha256" not in body and body != b"w"
                              and not any(s in body for s in secrets),
                              f"GET {path} leaked a file or a path: {body[:120]!r}")
    for path in ("/v1/artifacts/mobilenet_v3_small/../mobilenet_v3_large/manifest.json",
                 "/v1/artifacts/../../etc/passwd", "/v1/artifacts/mobilenet_v3_small/",
                 "/v1/artifacts//manifest.json"):
        status, body = raw(bench, "GET", path)
        bench.tally.answer((status, body), {400, 404, 422}, f"GET {path}")
        bench.tally.check(b"root:" not in body and b"mobilenet_v3_large" not in body,
                          f"GET {path} leaked a file: {body[:120]!r}")


def events(bench: Bench) -> None:
    for path in ("/v1/events", "/v1/declarations"):
        for since in ("-1", "9" * 40, "18446744073709551616", "1e3", "NaN"):
            bench.request("GET", f"{path}?since={since}", {422}, f"GET {path}?since={since}")
    for query in ("since=-1", "since=NaN", "since=1e309", "since=" + "9" * 40,
                  "app_id=" + "x" * 200, "app_id=%00", "since=abc", "limit=-1"):
        before = bench.dump()
        code, reason = exchange(f"{bench.ws}/v1/events/ws?{query}", ["hello?"], bench.admin)
        refused = code is None and reason == "403"
        closed = code == 1008 and reason == "the event stream takes no frames"
        bench.tally.check(refused or closed, f"event stream ?{query[:40]}: {code} {reason}")
        bench.unchanged(before, f"event stream ?{query[:40]}")
    for headers in ({}, {"Authorization": "Bearer wrong"}):  # every role may follow it
        code, reason = exchange(f"{bench.ws}/v1/events/ws?since=0", [], headers)
        bench.tally.check(code is None and reason == "401",
                          f"event stream with {headers or 'no credential'}: {code} {reason}")
    for frame in ("", "{}", '{"v": 1, "type": "hello"}', b"\x00" * 10, "x" * 100_000):
        code, reason = exchange(f"{bench.ws}/v1/events/ws?since=0", [frame], bench.admin)
        bench.tally.check(code == 1008, f"event stream frame {frame[:10]!r}: {code} {reason}")


async def _register(url: str, headers: dict[str, str], count: int) -> list[int]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                                 limits=limits) as client:
        gate = asyncio.Semaphore(16)

        async def one(i: int) -> int:
            async with gate:
                response = await client.post("/v1/apps", json={
                    "app_id": f"reg-{i:05d}", "family": "mobilenet_v3",
                    "variant": "mobilenet_v3_small", "critical": i % 2 == 0})
                return response.status_code

        return await asyncio.gather(*(one(i) for i in range(count)))


def registrations(bench: Bench, count: int) -> tuple[float, dict[str, Placement]]:
    """Register ``count`` apps at once; the rate, and where they are once all serve."""
    started = time.monotonic()
    statuses = asyncio.run(_register(bench.controller.url, bench.admin, count))
    elapsed = time.monotonic() - started
    for i, status in enumerate(statuses):
        bench.tally.answer((status, b""), {201}, f"registration {i}")
    duplicates = asyncio.run(_register(bench.controller.url, bench.admin, 50))
    for i, status in enumerate(duplicates):
        bench.tally.answer((status, b""), {409}, f"duplicate registration {i}")
    stored = bench.redis.hlen(f"{PREFIX}apps")
    bench.tally.check(stored == count, f"{stored} app records for {count} registrations",
                      corruption=True)
    listed = listed_apps(bench.controller.http)
    bench.tally.check(listed == count, f"{listed} apps listed for {count} registered")
    where = settled(bench.controller.http, count, SETTLE_S)
    serving = sum(p[0] == "serving" for p in where.values())
    bench.tally.check(serving == count, f"{serving} of {count} apps serving")
    backed = sum(any(r[2] == "warm" for r in p[2]) for app, p in where.items()
                 if int(app.removeprefix("reg-")) % 2 == 0)
    bench.tally.check(backed == count // 2 + count % 2,
                      f"{backed} of {count // 2 + count % 2} critical apps with a warm backup")
    return count / elapsed, where


FLEET = 4
"""Simulated servers: room for 2,000 apps and a warm backup of every other one."""
SETTLE_S = 300.0
"""How long the apps may take to be placed (and placed again after a restart)."""

FAIL_FAST_S = 1.0
"""The longest a call may take to fail while Redis is down."""

OUTAGE_CALLS = [("GET", "/v1/apps", None), ("GET", "/v1/servers", None),
                ("GET", "/v1/config", None), ("GET", "/v1/events", None),
                ("POST", "/v1/apps", {"app_id": "during-outage", "family": "mobilenet_v3"}),
                ("PATCH", "/v1/config", {"alpha": 0.3}), ("DELETE", "/v1/apps/reg-00001", None),
                ("POST", "/v1/plan/solve", None), ("GET", "/v1/apps/reg-00002", None)]


def redis_outage(bench: Bench, calls: int,
                 where: dict[str, Placement]) -> tuple[float, int]:
    """Kill Redis; time ``calls`` API calls from the kill; restart it.

    Every call must fail fast (503 with Retry-After), except a read the controller answers
    from the records it holds before it has noticed the outage (counted apart). Afterwards
    every app is where it was (``where``). Returns the p99 time to a 503 (ms) and how many
    reads were served.
    """
    http = bench.controller.http
    apps = len(where)
    config_before = http.get("/v1/config").json()
    bench.redis_server.kill()
    times, served = [], 0
    for i in range(calls):
        method, path, body = OUTAGE_CALLS[i % len(OUTAGE_CALLS)]
        started = time.monotonic()
        try:
            response = http.request(method, path, json=body, timeout=30)
        except httpx.HTTPError as exc:
            bench.tally.check(False, f"outage {method} {path}: {exc!r}")
            continue
        elapsed = time.monotonic() - started
        fast = response.status_code == 503 and "retry-after" in response.headers
        if fast:
            times.append(elapsed)
            bench.tally.check(elapsed <= FAIL_FAST_S, f"outage {method} {path}: a 503 after "
                                                      f"{elapsed:.2f} s")
        read = method == "GET" and response.status_code == 200
        served += read
        bench.tally.http_5xx += response.status_code >= 500 and not fast
        bench.tally.check(fast or read, f"outage {method} {path}: {response.status_code}")
    ready = http.get("/readyz", timeout=30).status_code
    bench.tally.check(ready == 503, f"/readyz during the outage: {ready}")
    bench.redis_server.start()
    deadline = time.monotonic() + 60
    while http.get("/readyz", timeout=30).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    bench.tally.check(http.get("/readyz").status_code == 200, "ready again after Redis")
    bench.tally.check(bench.redis.hlen(f"{PREFIX}apps") == apps and
                      bench.redis.hexists(f"{PREFIX}apps", "reg-00001"),
                      "apps after the outage", corruption=True)
    bench.tally.check(http.get("/v1/apps/during-outage").status_code == 404,
                      "a registration refused during the outage was applied", corruption=True)
    bench.tally.check(http.get("/v1/config").json() == config_before,
                      "a config patch refused during the outage was applied", corruption=True)
    _same_places(bench, where, "after the Redis outage")
    return 1000 * _p99(times), served


def _same_places(bench: Bench, before: dict[str, Placement], when: str) -> bool:
    """Every app serves where it did ``before`` (waiting for the controller to settle)."""
    after = settled(bench.controller.http, len(before), SETTLE_S)
    lost = sorted(before.keys() - after.keys())
    moved = sorted(app for app in before.keys() & after.keys() if after[app] != before[app])
    first = moved[0] if moved else None
    return all([
        bench.tally.check(not lost, f"{len(lost)} apps lost {when}: {lost[:5]}",
                          corruption=True),
        bench.tally.check(not moved, f"{len(moved)} apps not where they were {when}: "
                                     f"{first} {before.get(first or '')} -> "
                                     f"{after.get(first or '')}")])


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def restart(bench: Bench, where: dict[str, Placement]) -> bool:
    """SIGTERM the controller; start another on the same Redis; whether it serves it all,
    where it was, with every agent back and nothing quarantined."""
    apps = len(where)
    before = placements(bench.controller.http)
    old = bench.controller
    old.popen.send_signal(signal.SIGTERM)
    try:
        old.popen.wait(15)
        stopped = True
    except subprocess.TimeoutExpired:
        old.popen.kill()
        old.popen.wait()
        stopped = False
    bench.tally.check(stopped, "the controller did not stop on SIGTERM within 15 s")
    old.stop()
    try:
        bench.controller = bench._start_controller(old.port)
    except Exception as exc:  # noqa: BLE001 - reported as the case's failure
        bench.tally.crashes += 1
        bench.tally.check(False, f"the controller did not start again: {exc}")
        return False
    listed = listed_apps(bench.controller.http)
    quarantined = bench.redis.hlen(f"{PREFIX}quarantine")
    fleet = sorted(bench.agents.sites) if bench.agents else []
    back = wait("every agent back", lambda: all(
        s.get("state") == "up" and s.get("connected") for s in
        (servers(bench).get(server, {}) for server in fleet)))
    ok = [bench.tally.check(stopped, "stopped on SIGTERM"),
          bench.tally.check(listed == apps, f"{listed} apps served after the restart"),
          bench.tally.check(quarantined == 0, f"{quarantined} records quarantined at start",
                            corruption=True),
          bench.tally.check(back, "the agents did not come back to the new controller"),
          bench.tally.check(before == where, "placements changed before the restart"),
          _same_places(bench, before, "after the restart")]
    return all(ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registrations", type=int, default=2000)
    parser.add_argument("--outage-calls", type=int, default=200)
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="copy the controller's, Redis's and the agents' logs here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        bench = Bench(Path(tmp))
        tally = bench.tally
        rate = p99_ms = float("nan")
        restart_ok, served, began = False, 0, time.monotonic()
        try:
            for name, step in (("capacities", capacities), ("ids", ids), ("bodies", bodies),
                               ("names", names), ("events", events),
                               ("impersonation", impersonation)):
                tally.group = name
                started = time.monotonic()
                step(bench)
                bench.alive()
                print(f"{name}: {tally.groups[name]} cases in "
                      f"{time.monotonic() - started:.1f} s", flush=True)
            tally.group = "registrations"
            rate, where = registrations(bench, args.registrations)
            bench.alive()
            print(f"registrations: {args.registrations} at {rate:.0f} apps/s", flush=True)
            tally.group = "redis"
            p99_ms, served = redis_outage(bench, args.outage_calls, where)
            bench.alive()
            print(f"redis outage: p99 {p99_ms:.1f} ms to a 503; {served} reads answered from "
                  f"the records held before the outage was noticed", flush=True)
            tally.group = "restart"
            restart_ok = restart(bench, where)
        finally:
            if bench.agents is not None:
                bench.agents.close()
            log = bench.controller.log_path.read_text(errors="replace")
            bench.controller.stop()
            bench.redis_server.stop()
            if args.keep_logs is not None:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for found in (*bench.run_dir.glob("*.log"), bench.run_dir / "redis/redis.log"):
                    if found.is_file():
                        shutil.copy(found, args.keep_logs / found.name)
        tracebacks = log.count("Traceback")
        print(f"controller log: {tracebacks} tracebacks")
        for failure in tally.failures:
            print(f"failure: {failure}")
        print(json.dumps({
            "cases": tally.cases, "crashes": tally.crashes, "http_5xx": tally.http_5xx,
            "state_corruptions": tally.state_corruptions, "restart_ok": restart_ok,
            "redis_down_fail_fast_p99_ms": round(p99_ms, 1),
            "redis_down_reads_served": served, "registrations_per_s": round(rate, 1),
            "log_tracebacks": tracebacks, "elapsed_s": round(time.monotonic() - began, 1),
            "groups": dict(tally.groups), "failures": tally.failures}))


def impersonation(bench: Bench) -> None:
    """Simulated agents, each with its own credential (they stay, to serve the registrations);
    an impostor claims the first one's server with the second one's credential, and others try
    the agent socket with no, a wrong, a forged or another role's credential."""
    agents = SimAgentProcesses(bench.controller.url, FLEET, 1, sites=2, log_dir=bench.run_dir,
                               capacity={"memory_mb": 32000.0, "compute": 100.0},
                               credentials_dir=bench.controller.credentials,
                               load_time_scale=0.01)
    bench.agents = agents
    agents.wait_ready()
    agents.command("connect")
    fleet = sorted(agents.sites)
    up = wait("the simulated servers up", lambda: all(
        s.get("state") == "up" and s.get("connected")
        for s in (servers(bench).get(server, {}) for server in fleet)))
    bench.tally.check(up, "the simulated agents did not come up")
    _impostor(bench, fleet[0], fleet[1])


def _impostor(bench: Bench, victim: str, other: str) -> None:
    url = bench.ws + AGENT_WS_PATH
    record = servers(bench)[victim]
    seq = last_declaration(bench)
    claim = hello(victim, capacity='{"memory_mb": 1.0}', site='"site-evil"')
    triton_down = '{"v": 1, "type": "triton_down", "at": 1.0}'
    code, reason = exchange(url, [claim, triton_down, "not json"], bench.agent(other))
    refused_hello = code == 1008 and not reason.startswith("bad frame")
    bench.tally.check(refused_hello, f"a connection with {other}'s credential spoke for "
                                     f"{victim} ({code} {reason!r})", corruption=True)
    believed = wait(f"a declaration of {victim}", lambda: declared(bench, victim, seq),
                    timeout_s=3.0, expected=False)
    bench.tally.check(not believed, f"the impostor's frames or its close declared {victim} "
                                    f"failed", corruption=True)
    after = servers(bench).get(victim, {})
    bench.tally.check((after.get("site_id"), after.get("capacity"), after.get("state"),
                       after.get("connected")) == (record["site_id"], record["capacity"],
                                                   "up", True),
                      f"the impostor changed {victim}'s record: {after}", corruption=True)
    code, reason = exchange(url, [triton_down], bench.agent(other))
    bench.tally.check(code == 1008, f"a triton_down before any hello: {code} {reason!r}")
    forged = "agent.0." + victim + "." + "0" * 64
    for headers, status, what in (
            ({}, "401", "no credential"), ({"Authorization": "Bearer wrong"}, "401", "a wrong one"),
            ({"Authorization": f"Bearer {forged}"}, "401", "a forged agent credential"),
            (bench.admin, "403", "the admin credential"), (bench.named("read"), "403", "read"),
            (bench.named("client"), "403", "client"), (bench.named("gateway"), "403", "gateway")):
        code, reason = exchange(url, [hello(victim)], headers)
        bench.tally.check(code is None and reason == status,
                          f"agent socket with {what}: {code} {reason!r}",
                          corruption=code is not None)
    still = servers(bench).get(victim, {})
    bench.tally.check(still.get("state") == "up" and still.get("connected") is True,
                      f"{victim} lost its agent to an impostor: {still}", corruption=True)


if __name__ == "__main__":
    main()
