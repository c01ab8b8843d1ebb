"""Failovers that never leave an app worse off: random faults on the live 9-server testbed.

Usage: ``python bench/convergence.py [--faults 30] [--quick] [--apps 18] [--seed 0]``.

A 9-server, 3-site testbed (Redis, the controller, one agent with its own Triton per server)
with `--apps` generated apps (half critical, headroom 20 %) and a client on every app at
`--rate` requests/s. A few apps are changed at registration so that the placement rules have
something to keep: two pinned to a site (``pinned_site``), one to a server (``pinned_server``),
three registered with a middle variant of their family instead of its best (so a backup above
the registered variant is possible); the pinned apps are registered first, so their pin has
room. Then `--faults` faults (6 with ``--quick``), the kinds taken in shuffled rounds of five so
that each occurs about as often (``deploy.inject``): ``kill`` (SIGKILL of a server's process
group), ``triton`` (SIGKILL of its ``tritonserver`` alone; the agent restarts it), ``agent``
(SIGKILL of its agent process alone; the bench then starts a new agent, and records what of
the old process group was left running), ``stop`` (SIGSTOP for `--stop-s` s, then SIGCONT)
and ``site`` (SIGKILL of every server of a random site). After each: the wait for recovery
(no app served from a failed server, none recovering or loading), the revival (agents
restarted, a stopped server continued, a killed Triton's return awaited), the wait for
convergence (every app on its home variant, the warm plan in place), then at least
`--observe-s` s of observation that ends no earlier than `--settle-s` s + `--observe-s` s
after the last change (the fault's instant or its last revival, whichever is later). Before
each fault a server that is down with no Triton running (its agent gave up restarting one)
gets a new agent; the fault's line says so.

A thread polls ``GET /v1/apps`` and ``GET /v1/servers`` every 0.5 s for the whole run and keeps
every poll (``runs/bench-convergence/samples.jsonl``). The run is judged from those samples
(``deploy.convergence``, where the definitions are): app-seconds below the best placement more
than `--settle-s` s after the last change (an injection, a revival, or a failure declaration
of the controller's own, counted apart when false), backups and failover replicas above the
registered
variant, replicas outside a pin, recovery of the apps served from the failed servers; and at
the end every server's Triton is asked which models it holds READY (``POST
/v2/repository/index``, twice, 2 s apart) against the records: strays (held, in no record) and
missing (READY in the records, not held). Also printed: each fault with its timings, every
degraded stretch (with the declaration that moved the app just before it, true or false),
every app served again only after more than `--settle-s` s, every offence and stray in full,
the declarations judged
(``deploy.declarations``), the client requests and their failures. The last line is one JSON
object; the figures to meet are ``degraded_app_seconds_after_settle`` 0,
``strays_found_at_end`` 0, ``backups_above_primary`` 0, ``pinned_violations`` 0 and
``recovery_rate_from_records`` 1.0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from deploy import convergence as judge  # noqa: E402
from deploy.convergence import AppSpecObs, Sample  # noqa: E402
from deploy.declarations import (  # noqa: E402
    AGENT,
    ALL_KINDS,
    KILL,
    SITE,
    STOP,
    TRITON,
    Injection,
    Verdict,
    classify,
    parse,
)
from deploy.inject import (  # noqa: E402
    fetch_declarations,
    group_members,
    injections,
    kill,
    kill_agent,
    kill_triton,
    pause,
    resume,
    revive,
    triton_pid,
)
from deploy.report import load_requests, recovery_from_records  # noqa: E402
from deploy.testbed import Testbed, TestbedError, wait_until  # noqa: E402
from deploy.topology import Topology, make_topology  # noqa: E402
from deploy.workload import Workload, generate_workload, list_all  # noqa: E402
from model_repo.profiles import load_families  # noqa: E402
from understudy.wire.credentials import bearer  # noqa: E402

logger = logging.getLogger("bench.convergence")

SERVERS, SITES = 9, 3
RUN_DIR = REPO / "runs" / "bench-convergence"
SAMPLE_INTERVAL_S = 0.5
SMALL_SHARE = 0.25
"""Only apps whose registered variant takes at most this share of a server's memory are
pinned or given a middle variant (a pinned giant could find no room in its pin)."""


# --- the workload -------------------------------------------------------------------------------


def _accuracy_table() -> dict[tuple[str, str], float]:
    return {(name, v.name): v.accuracy for name, family in load_families().items()
            for v in family.variants}


def plan_workload(workload: Workload, topology: Topology, rng: random.Random) -> Workload:
    """The generated workload with two apps pinned to a site, one to a server and three
    registered with a middle variant; the pinned apps first in registration order."""
    families = load_families()
    memory = {(name, v.name): v.memory_mb for name, f in families.items() for v in f.variants}
    small = [s["app_id"] for s in workload.specs
             if memory[(s["family"], s["variant"])] <= SMALL_SHARE * workload.capacity["memory_mb"]]
    pinned = rng.sample(small, 3)
    sites = rng.sample(list(topology.sites), 2)
    pins = {pinned[0]: {"pinned_site": sites[0]}, pinned[1]: {"pinned_site": sites[1]},
            pinned[2]: {"pinned_server": rng.choice(topology.server_ids)}}
    several = [s["app_id"] for s in workload.specs if s["app_id"] not in pins
               and len(families[s["family"]].variants) >= 3
               and s["app_id"] in small]
    middle = {}
    for app_id in rng.sample(several, min(3, len(several))):
        spec = next(s for s in workload.specs if s["app_id"] == app_id)
        variants = families[spec["family"]].variants
        middle[app_id] = {"variant": variants[len(variants) // 2].name}
    specs = [{**s, **pins.get(s["app_id"], {}), **middle.get(s["app_id"], {})}
             for s in workload.specs]
    specs.sort(key=lambda s: s["app_id"] not in pins)  # stable: pinned first, else as generated
    return replace(workload, specs=tuple(specs))


# --- sampling -----------------------------------------------------------------------------------


class Sampler:
    """Polls ``GET /v1/apps`` and ``GET /v1/servers`` on its own thread and keeps every poll.

    Each sample is also written to ``path`` as a JSON line (its apps only when they changed).
    """

    def __init__(self, controller_url: str, path: Path, interval_s: float = SAMPLE_INTERVAL_S,
                 headers: dict[str, str] | None = None) -> None:
        self.samples: list[Sample] = []
        self.specs: dict[str, AppSpecObs] = {}
        self.errors = 0
        self._http = httpx.Client(base_url=controller_url, timeout=5.0, headers=headers)
        self._lock = threading.Lock()
        self._out = path.open("w", encoding="utf-8")
        self._last_apps: Any = None
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.take()
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - started)))

    def take(self) -> Sample | None:
        """Poll once now; the sample (None when the controller did not answer)."""
        at = time.time()
        try:
            apps = list_all(self._http, "/v1/apps")
            servers = list_all(self._http, "/v1/servers")
        except (httpx.HTTPError, ValueError) as exc:
            self.errors += 1
            logger.warning("sample at %.3f failed: %s", at, exc)
            return None
        sample = Sample.from_views(at, apps, servers)
        with self._lock:
            self.samples.append(sample)
            for view in apps:
                self.specs.setdefault(view["app_id"], AppSpecObs.from_view(view))
            self._write(sample)
        return sample

    def _write(self, sample: Sample) -> None:
        record: dict[str, Any] = {"at": sample.at,
                                  "servers": {k: v.up for k, v in sample.servers.items()}}
        apps = {k: asdict(v) for k, v in sample.apps.items()}
        if apps != self._last_apps:
            record["apps"] = apps
            self._last_apps = apps
        self._out.write(json.dumps(record) + "\n")

    def snapshot(self) -> list[Sample]:
        """The samples so far, in order."""
        with self._lock:
            return sorted(self.samples, key=lambda s: s.at)

    def stop(self) -> None:
        """Stop polling, close the file."""
        self._stop.set()
        self._thread.join(10)
        self._http.close()
        self._out.close()


# --- one fault ----------------------------------------------------------------------------------


@dataclass
class Fault:
    """What the bench did for one fault, and when (wall times)."""

    index: int
    kind: str
    victims: list[str]
    at: float
    what: str
    recovery_until: float = 0.0
    revived_at: float = 0.0
    converged_at: float = 0.0
    converged: bool = True
    leftovers: list[str] = field(default_factory=list)
    """For an agent kill: what of the old process group still ran after its revival."""
    notes: list[str] = field(default_factory=list)


def _settled(bed: Testbed, failed: set[str]) -> bool:
    """No app served on a failed server (unless unavailable), none recovering or loading."""
    for app in bed.apps():
        serving = app["serving"]
        if serving and serving["server_id"] in failed and app["status"] != "unavailable":
            return False
        if app["status"] == "recovering" or any(r["state"] == "loading"
                                                for r in app["replicas"]):
            return False
    return True


def _wait(what: str, check: Callable[[], Any], timeout_s: float) -> bool:
    try:
        wait_until(what, check, timeout_s, 0.25)
    except TestbedError as exc:
        logger.warning("%s", exc)
        return False
    return True


def _victims(bed: Testbed, kind: str, rng: random.Random) -> tuple[list[str], str]:
    servers = sorted(bed.state.servers)
    if kind == SITE:
        site = rng.choice(sorted({v["site_id"] for v in bed.state.servers.values()}))
        victims = bed.servers_of_site(site)
        return victims, site
    if kind == TRITON:
        running = [s for s in servers if triton_pid(bed, s) is not None]
        return [rng.choice(running or servers)], ""
    return [rng.choice(servers)], ""


def _inject(bed: Testbed, kind: str, victims: list[str], site: str, args: argparse.Namespace
            ) -> tuple[float, str]:
    """Inject the fault; (its instant, a description)."""
    victim = victims[0]
    if kind == SITE:
        return kill(bed, victims, site=site), f"site {site} ({', '.join(victims)})"
    if kind == KILL:
        return kill(bed, victims), victim
    if kind == TRITON:
        pid = triton_pid(bed, victim)
        return kill_triton(bed, victim), f"{victim}'s tritonserver (pid {pid})"
    if kind == AGENT:
        pid = bed.state.processes[f"agent-{victim}"].pid
        return kill_agent(bed, victim), f"{victim}'s agent (pid {pid})"
    at = pause(bed, victim)
    time.sleep(args.stop_s)
    resume(bed, victim)
    return at, f"{victim} for {args.stop_s:.0f} s"


def _revive(bed: Testbed, fault: Fault) -> None:
    for victim in fault.victims:
        try:
            revive(bed, victim, 180)
        except TestbedError as exc:
            fault.notes.append(f"revival of {victim}: {exc}")
            logger.warning("%s", exc)
            if fault.kind == TRITON:
                _restart_agent(bed, victim, fault)


def _restart_agent(bed: Testbed, server_id: str, fault: Fault) -> None:
    """A Triton that did not come back (its agent gave up restarting it): a fresh agent."""
    info = bed.state.processes[f"agent-{server_id}"]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info.pid, signal.SIGKILL)
    bed.start_agent(server_id)
    fault.notes.append(f"{server_id}'s agent restarted by the bench")
    with contextlib.suppress(TestbedError):
        wait_until(f"{server_id} back", lambda: _up(bed, server_id), 180, 0.25)


def _up(bed: Testbed, server_id: str) -> bool:
    with contextlib.suppress(Exception):
        return any(s["server_id"] == server_id and s["state"] == "up" and s["connected"]
                   for s in bed.servers())
    return False


def heal(bed: Testbed) -> list[str]:
    """Restart the agents of servers that are down with no Triton running (their agent gave
    up restarting it: a Triton that exits at once, e.g. on a port taken meanwhile, is
    restarted on the same ports until the agent's restart limit); what was restarted.

    A server down for any other reason is left as it is: that is the controller's to fix.
    """
    restarted = []
    with contextlib.suppress(httpx.HTTPError):
        for server in bed.servers():
            server_id = server["server_id"]
            if server["state"] == "up" or triton_pid(bed, server_id) is not None:
                continue
            logger.warning("%s is %s with no Triton running: restarting its agent", server_id,
                           server["state"])
            fault = Fault(-1, "heal", [server_id], time.time(), server_id)
            _restart_agent(bed, server_id, fault)
            restarted.append(server_id)
    return restarted


def run_fault(bed: Testbed, index: int, kind: str, rng: random.Random, sampler: Sampler,
              args: argparse.Namespace) -> Fault:
    """One fault: inject, wait for recovery, revive, wait for convergence, observe."""
    healed = heal(bed)
    if healed:
        with contextlib.suppress(TestbedError):
            bed.wait_converged(180)
    victims, site = _victims(bed, kind, rng)
    old_group = bed.state.processes[f"agent-{victims[0]}"].pid
    at, what = _inject(bed, kind, victims, site, args)
    fault = Fault(index, kind, victims, at, what)
    fault.notes += [f"before it, {server}'s agent restarted (down with no Triton)"
                    for server in healed]
    if kind in (KILL, SITE, AGENT):
        _wait(f"recovery from {what}", lambda: _settled(bed, set(victims)), 120)
        sampler.take()
        fault.recovery_until = time.time()
    _revive(bed, fault)
    fault.revived_at = time.time()
    if kind == AGENT:
        fault.leftovers = [f"{pid} {name}" for pid, name in group_members(old_group)]
    try:
        bed.wait_converged(180)
    except TestbedError as exc:
        fault.converged = False
        fault.notes.append(str(exc))
        logger.warning("%s", exc)
    fault.converged_at = time.time()
    sampler.take()
    if kind in (STOP, TRITON):
        fault.recovery_until = time.time()
    record = bed.state.failures[-1]
    record["recovery_until"] = fault.recovery_until
    bed.state.save()
    changed = judge.last_change(Injection.from_record(record))
    until = max(time.time(), changed + args.settle_s) + args.observe_s
    time.sleep(max(0.0, until - time.time()))
    return fault


# --- the end: Tritons, leftovers ----------------------------------------------------------------


def triton_ready(bed: Testbed, servers: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """Server -> models its Triton reports READY (servers whose Triton did not answer: absent).

    The repository index is model control, which each Triton answers only with its agent's key
    (read from the agent's run directory).
    """
    held: dict[str, set[str]] = {}
    with httpx.Client(timeout=10.0) as http:
        for server in servers:
            if not server.get("http"):
                continue
            try:
                response = http.post(f"http://{server['http']}/v2/repository/index", json={},
                                     headers=bed.triton_control_headers(server["server_id"]))
                response.raise_for_status()
            except (httpx.HTTPError, OSError) as exc:
                logger.warning("Triton of %s did not answer: %s", server["server_id"], exc)
                continue
            held[server["server_id"]] = {e["name"] for e in response.json()
                                         if e.get("state") == "READY"}
    return held


def final_check(bed: Testbed, sampler: Sampler) -> dict[str, Any]:
    """Strays and missing models, each found in two rounds 2 s apart (a load or unload in
    flight at one round is not counted)."""
    rounds = []
    for attempt in range(2):
        if attempt:
            time.sleep(2.0)
        before = sampler.take()
        held = triton_ready(bed, bed.servers())
        after = sampler.take()
        if before is None or after is None:
            continue
        rounds.append((held, before, after))
    stray: set[tuple[str, str]] | None = None
    lost: set[tuple[str, str]] | None = None
    for held, before, after in rounds:
        found = set(judge.strays(held, before.apps.values())) & set(
            judge.strays(held, after.apps.values()))
        gone = set(judge.missing(held, before.apps.values())) & set(
            judge.missing(held, after.apps.values()))
        stray = found if stray is None else stray & found
        lost = gone if lost is None else lost & gone
    return {"strays": sorted(stray or ()), "missing": sorted(lost or ()),
            "held": {k: sorted(v) for k, v in rounds[-1][0].items()} if rounds else {}}


def repairs(bed: Testbed) -> list[dict[str, Any]] | None:
    """The controller's repairs (``GET /v1/repairs``), when it has that route; else None."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = bed.http.get("/v1/repairs")
        if response.status_code == 200:
            body = response.json()
            return body if isinstance(body, list) else [body]
    return None


def reconcile_lines(bed: Testbed) -> list[str]:
    """Lines of the controller's log that speak of reconciling or strays."""
    path = Path(bed.state.processes["controller"].log)
    with contextlib.suppress(OSError):
        return [line for line in path.read_text(errors="replace").splitlines()
                if "reconcil" in line.lower() or "stray" in line.lower()]
    return []


def reap_leftovers(bed: Testbed) -> list[str]:
    """Kill what old agent process groups left running (agent kills); what was found."""
    found = []
    for record in bed.state.failures:
        if record.get("kind") != AGENT:
            continue
        members = group_members(record["pid"])
        if members:
            found += [f"{record['servers'][0]}: {pid} {name}" for pid, name in members]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record["pid"], signal.SIGKILL)
    return found


# --- the run ------------------------------------------------------------------------------------


def start(args: argparse.Namespace, rng: random.Random) -> Testbed:
    """The testbed with the planned workload registered and a client on every app."""
    topology = make_topology(SERVERS, SITES, args.apps, 0.5, 0.2)
    workload = plan_workload(generate_workload(topology, seed=args.seed), topology, rng)
    bed = Testbed.up(RUN_DIR, topology, seed=args.seed, register=False,
                     artifacts=REPO / "runs" / "artifacts", timeout_s=900)
    try:
        bed.register(workload, 900)
        bed.start_clients(args.rate)
    except BaseException:
        bed.down()
        raise
    return bed


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the testbed, inject the faults one after another, collect what is judged."""
    rng = random.Random(args.seed)
    bed = start(args, rng)
    sampler = Sampler(bed.state.controller_url, RUN_DIR / "samples.jsonl",
                      headers=bearer(bed.token("read")))
    started = time.time()
    faults: list[Fault] = []
    kinds: list[str] = []
    end: dict[str, Any] = {}
    try:
        time.sleep(args.settle_s)
        for index in range(args.faults):
            if not kinds:
                kinds = rng.sample(ALL_KINDS, len(ALL_KINDS))
            fault = run_fault(bed, index, kinds.pop(), rng, sampler, args)
            faults.append(fault)
            print(_fault_line(fault, started), flush=True)
        end = final_check(bed, sampler)
        end["repairs"] = repairs(bed)
        end["reconcile"] = reconcile_lines(bed)
        end["declarations"] = fetch_declarations(bed.http)
        end["leftovers"] = reap_leftovers(bed)
    finally:
        finished = time.time()
        sampler.stop()
        bed.down()
    return {"started": started, "finished": finished, "faults": faults,
            "records": list(bed.state.failures), "injections": injections(bed.state),
            "samples": sampler.snapshot(), "specs": dict(sampler.specs),
            "site_of": {s: v["site_id"] for s, v in bed.state.servers.items()},
            "sample_errors": sampler.errors,
            "requests": load_requests(RUN_DIR / "requests"), **end}


def _fault_line(fault: Fault, origin: float) -> str:
    recovery = (f"recovery wait {fault.recovery_until - fault.at:.1f} s, "
                if fault.kind in (KILL, SITE, AGENT) else "")
    extra = f"; left running: {', '.join(fault.leftovers)}" if fault.leftovers else ""
    notes = f"; {'; '.join(fault.notes)}" if fault.notes else ""
    return (f"[{(fault.at - origin) / 60:5.1f} min] #{fault.index + 1} {fault.kind:6} "
            f"{fault.what}: {recovery}revived after {fault.revived_at - fault.at:.1f} s, "
            f"{'converged' if fault.converged else 'NOT converged'} after "
            f"{fault.converged_at - fault.at:.1f} s{extra}{notes}")


# --- the report ---------------------------------------------------------------------------------


def recovery_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each injection's affected apps (those its pins let recover) and the recovered ones."""
    judged = []
    for record, injection in zip(result["records"], result["injections"], strict=True):
        affected = judge.recoverable(record.get("serving_before", []), result["specs"],
                                     result["site_of"], injection)
        until = record.get("recovery_until") or injection.at
        times = judge.recovery_times(result["samples"], affected, injection, until)
        judged.append({"serving_before": affected, "recovered": sorted(times),
                       "seconds": {app: round(s, 1) for app, s in times.items()},
                       "left_out": sorted(set(record.get("serving_before", [])) -
                                          set(affected))})
    return judged


def _below_top(spec: AppSpecObs, accuracy: dict[tuple[str, str], float]) -> bool:
    best = max(v for (f, _), v in accuracy.items() if f == spec.family)
    return judge.registered_accuracy(spec, accuracy) not in (None, best)


def _cause(episode: judge.Episode, verdicts: Sequence[Verdict], within_s: float = 5.0) -> str:
    """The declaration that moved the app just before the stretch began, if one did."""
    moved = [v for v in verdicts if episode.app_id in v.declaration.apps_moved
             and 0.0 <= episode.start - v.declaration.detected_at <= within_s]
    if not moved:
        return ""
    chosen = max(moved, key=lambda v: v.declaration.detected_at)
    last = chosen.declaration
    return (f" [moved by {'a false' if chosen.false else 'a true'} declaration of "
            f"{last.server_id} ({last.reason}) {episode.start - last.detected_at:.1f} s before]")


def _print_offences(title: str, offences: Sequence[judge.Offence], origin: float) -> None:
    print(f"{title} ({len(offences)}):")
    for o in offences:
        print(f"  {o.app_id} {o.variant} on {o.server_id} ({o.role}), seen "
              f"{o.first_seen - origin:+.1f} .. {o.last_seen - origin:+.1f} s: {o.detail}")


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Judge the samples; print every offence in full; the last line's figures."""
    origin = result["started"]
    samples: list[Sample] = result["samples"]
    specs: dict[str, AppSpecObs] = result["specs"]
    injected: list[Injection] = result["injections"]
    verdicts = classify(parse(result.get("declarations", [])), injected)
    judged_windows = judge.windows(injected, args.settle_s, result["finished"],
                                   [v.declaration.detected_at for v in verdicts])
    episodes = judge.degraded_episodes(samples, judged_windows, specs)
    accuracy = _accuracy_table()
    above = judge.backups_above_primary(samples, specs, accuracy)
    pinned = judge.pinned_violations(samples, specs, result["site_of"])
    recovery = recovery_records(result)
    affected, recovered = recovery_from_records(recovery)
    judged_s = sum(min(w.end, result["finished"]) - w.start for w in judged_windows
                   if w.end > w.start)
    print(f"\n{len(samples)} samples ({result['sample_errors']} polls failed), "
          f"{sum(any(w.holds(s.at) for w in judged_windows) for s in samples)} of them in the "
          f"judging windows ({judged_s:.0f} s); times below in s from the start of sampling")
    print("pinned apps and apps registered below their family's best: " + ", ".join(
        f"{s.app_id} ({s.variant}" + (f", site {s.pinned_site}" if s.pinned_site else "")
        + (f", server {s.pinned_server}" if s.pinned_server else "") + ")"
        for s in specs.values() if s.pinned_site or s.pinned_server or _below_top(s, accuracy)))
    print(f"below best more than {args.settle_s:.0f} s after the last change "
          f"({len(episodes)} stretches):")
    for e in episodes:
        print(f"  {'(home down) ' if e.home_down else ''}{e.app_id} after fault #{e.window + 1} "
              f"({injected[e.window].kind}), {e.start - origin:+.1f} .. {e.end - origin:+.1f} s "
              f"({e.seconds:.1f} s): {e.reason}{_cause(e, verdicts)}")
    _print_offences("backups above the registered variant", above, origin)
    _print_offences("replicas outside their pin", pinned, origin)
    print(f"recovery: {recovered}/{affected} affected apps served again")
    for index, item in enumerate(recovery):
        unrecovered = sorted(set(item["serving_before"]) - set(item["recovered"]))
        slow = {app: s for app, s in item["seconds"].items() if s > args.settle_s}
        if unrecovered or item["left_out"] or slow:
            print(f"  fault #{index + 1} ({injected[index].kind}): not recovered "
                  f"{unrecovered or 'none'}; left out by their pin {item['left_out'] or 'none'}"
                  f"; served again only after more than {args.settle_s:.0f} s: "
                  + (", ".join(f"{app} {s:.1f} s" for app, s in slow.items()) or "none"))
    slowest = max((s for item in recovery for s in item["seconds"].values()), default=None)
    for key, title in (("strays", "strays at the end"), ("missing", "missing at the end")):
        print(f"{title} ({len(result.get(key, []))}): "
              + (", ".join(f"{m} on {s}" for s, m in result.get(key, [])) or "none"))
    if result.get("repairs") is not None:
        print(f"controller repairs (GET /v1/repairs): {len(result['repairs'])}")
    print(f"controller log lines on reconciling or strays: {len(result.get('reconcile', []))}")
    for line in result.get("reconcile", [])[-10:]:
        print(f"  {line}")
    if result.get("leftovers"):
        print(f"left running by killed agents at the end: {', '.join(result['leftovers'])}")
    false = [v for v in verdicts if v.false]
    print(f"declarations: {len(verdicts)} ({len(false)} false)")
    for verdict in false:
        print(f"  false: {verdict.declaration.model_dump_json()}")
    requests = result["requests"]
    failed = sum(not r["ok"] for r in requests)
    print(f"client requests: {len(requests)}, {failed} failed after their retries")
    (RUN_DIR / "result.json").write_text(json.dumps({
        "faults": [asdict(f) for f in result["faults"]], "recovery": recovery,
        "episodes": [asdict(e) for e in episodes], "backups_above_primary": [asdict(o)
                                                                           for o in above],
        "pinned_violations": [asdict(o) for o in pinned], "strays": result.get("strays"),
        "missing": result.get("missing"), "held": result.get("held"),
        "declarations": result.get("declarations", [])}, indent=2))
    return {
        "faults": len(result["faults"]), "apps": args.apps,
        "degraded_app_seconds_after_settle": round(judge.degraded_seconds(episodes), 1),
        "strays_found_at_end": len(result.get("strays", [])),
        "backups_above_primary": len(above),
        "pinned_violations": len(pinned),
        "recovery_rate_from_records": judge.rate(recovered, affected),
        "missing_at_end": len(result.get("missing", [])),
        "home_down_app_seconds": round(judge.degraded_seconds(episodes, home_down=True), 1),
        "judged_seconds": round(judged_s),
        "affected_apps": affected, "recovered_apps": recovered,
        "slowest_recovery_s": slowest,
        "not_converged": sum(not f.converged for f in result["faults"]),
        "false_declarations": len(false),
        "agent_kill_leftovers": len(result.get("leftovers", [])),
        "requests": len(requests), "requests_failed": failed,
        "minutes": round((result["finished"] - origin) / 60, 1),
        "injections": {kind: sum(f.kind == kind for f in result["faults"])
                       for kind in ALL_KINDS},
    }


def main() -> int:
    """Run, judge the samples, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="6 faults")
    parser.add_argument("--apps", type=int, default=18)
    parser.add_argument("--rate", type=float, default=5.0, help="client requests/s per app")
    parser.add_argument("--stop-s", type=float, default=3.0, help="how long a stop lasts")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="after the last change, an app below its best counts as degraded")
    parser.add_argument("--observe-s", type=float, default=10.0,
                        help="judged observation after each fault, at least")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.faults = 6
    logging.basicConfig(level=logging.WARNING)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    print(json.dumps(report(run(args), args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
