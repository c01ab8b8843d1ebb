"""``understudy testbed up|fail|revive|report|status|down|register|client|sim-agents``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_RUN_DIR = Path("runs/testbed")
TOKEN_HELP = "(default $UNDERSTUDY_TOKEN_FILE, else $UNDERSTUDY_TOKEN)"


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``testbed`` options and actions to its command parser."""
    actions = parser.add_subparsers(dest="testbed_command", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start everything and register generated apps")
    _workload_arguments(up)
    up.add_argument("--scale", type=float, default=None, help="artifact scale")
    up.add_argument("--artifacts", type=Path, default=Path("runs/artifacts"),
                    help="artifact store (built if missing)")
    up.add_argument("--policy", choices=["understudy", "full-size-warm-k"],
                    default="understudy")
    up.add_argument("--rate", type=float, default=5.0, help="client requests/s per app")
    up.add_argument("--via", choices=["gateway", "sdk"], default="gateway",
                    help="the clients go through the testbed's inference gateway (default) or "
                    "follow failovers with the SDK")
    up.add_argument("--no-clients", action="store_true")
    up.add_argument("--no-artifact-mirror", action="store_true",
                    help="agents download every weight over HTTP instead of linking it from "
                    "the local store")
    up.add_argument("--tls", action="store_true",
                    help="the controller serves HTTPS/WSS with a certificate of a CA made in "
                    "RUN_DIR/tls; every process verifies it with that CA")
    fail = actions.add_parser("fail", help="SIGKILL a server (agent + Triton) or a site")
    fail.add_argument("server", nargs="?")
    fail.add_argument("--site", default=None)
    revive = actions.add_parser("revive", help="restart a failed server's agent and wait "
                                "until the controller sees it up")
    revive.add_argument("server")
    revive.add_argument("--timeout-s", type=float, default=180.0)
    report = actions.add_parser("report", help="failure outcomes, recovery rate and a plot")
    report.add_argument("--json", action="store_true", help="also print the JSON summary")
    demo = actions.add_parser("demo", help="up, steady load, fail one server, report, down")
    demo.add_argument("--steady-s", type=float, default=8.0)
    demo.add_argument("--recovery-s", type=float, default=15.0)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--artifacts", type=Path, default=Path("runs/artifacts"))
    actions.add_parser("status", help="processes and their logs")
    actions.add_parser("down", help="stop everything")
    registration = actions.add_parser(
        "register", help="register the generated apps with a running controller (the compose "
        "register job); idempotent")
    registration.add_argument("--controller-url", required=True)
    _credential_arguments(registration, "an admin credential")
    _workload_arguments(registration)
    registration.add_argument("--timeout-s", type=float, default=300.0,
                              help="for the servers to connect, and again for convergence")
    registration.add_argument("--no-wait", action="store_true",
                              help="return once each app serves, without waiting for the warm "
                              "backups")
    client = actions.add_parser("client", help="run load-generating clients (foreground)")
    client.add_argument("--controller-url", default=None, help="required with --via sdk")
    _credential_arguments(client, "a client credential")
    client.add_argument("--app", required=True, help="app id(s), comma-separated")
    client.add_argument("--rate", type=float, default=5.0)
    client.add_argument("--via", choices=["sdk", "gateway"], default="sdk",
                        help="follow failovers with the SDK, or send through a gateway")
    client.add_argument("--gateway-url", default=None, help="required with --via gateway")
    client.add_argument("--out", type=Path, default=Path("runs/requests"))
    client.add_argument("--store", type=Path, default=None,
                        help="artifact store: apps of a family with an evaluation set there "
                        "(digits) send its real inputs and check the predictions")
    _sim_agents_arguments(actions.add_parser(
        "sim-agents", help="simulated agents (no Triton) driven by commands on stdin: "
        "crash, silence, stall, revive, restart (deploy/sim_control.py)"))
    for sub in (up, fail, revive, report, client):
        sub.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    demo.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    for name in ("status", "down"):
        actions.choices[name].add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)


def _credential_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--token-file", type=Path, default=None,
                        help=f"file holding {what} {TOKEN_HELP}")
    parser.add_argument("--ca-file", type=Path, default=None,
                        help="CA that verifies an https:// controller (default "
                             "$UNDERSTUDY_CA_FILE)")


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The topology and generator arguments; ``up`` and ``register`` must agree on them."""
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--apps", type=int, default=12)
    parser.add_argument("--headroom", type=float, default=0.2)
    parser.add_argument("--critical", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)


def _sim_agents_arguments(parser: argparse.ArgumentParser) -> None:
    from understudy.cli.agent import parse_capacity

    parser.add_argument("--controller-url", required=True)
    parser.add_argument("--credentials-dir", type=Path, default=None,
                        help="the controller's credential store: each simulated agent presents "
                        "its own server's credential, derived from it (default: none, for a "
                        "controller started with --insecure)")
    parser.add_argument("--ca-file", type=Path, default=None,
                        help="CA that verifies an https:// controller")
    parser.add_argument("--agents", type=int, default=250, help="simulated servers here")
    parser.add_argument("--first", type=int, default=0,
                        help="number of the first server (sim-NNNN), for several processes")
    parser.add_argument("--sites", type=int, default=10, help="sites, round-robin")
    parser.add_argument("--capacity", type=parse_capacity,
                        default=parse_capacity("memory_mb=4000,compute=100"),
                        help="each server's capacity, NAME=NUMBER,... (default "
                        "memory_mb=4000,compute=100)")
    parser.add_argument("--load-time-scale", type=float, default=1.0,
                        help="multiply every profiled load time by this")
    parser.add_argument("--hold", action="store_true",
                        help="do not connect until a 'connect' command")
    parser.add_argument("--seed", type=int, default=0, help="seed of the reconnect jitter")


def run(options: argparse.Namespace) -> int:
    """Dispatch a testbed action."""
    from deploy.testbed_state import TestbedError

    try:
        return int(_ACTIONS[options.testbed_command](options) or 0)
    except TestbedError as exc:
        logger.error("%s", exc)
        return 1


def _up(options: argparse.Namespace) -> int:
    from deploy.testbed import Testbed
    from deploy.topology import make_topology
    from model_repo.artifacts import DEFAULT_SCALE

    topology = make_topology(options.servers, options.sites, options.apps, options.critical,
                             options.headroom)
    testbed = Testbed.up(options.run_dir, topology, seed=options.seed,
                         scale=options.scale or DEFAULT_SCALE, policy=options.policy,
                         artifacts=options.artifacts,
                         clients=not options.no_clients, client_rate=options.rate,
                         client_via=options.via, tls=options.tls,
                         artifact_mirror=not options.no_artifact_mirror)
    _print_apps(testbed)
    sys.stdout.write(f"testbed up in {options.run_dir}; controller {testbed.state.controller_url}"
                     f"\ncredentials in {testbed.state.credentials}"
                     + (f"; CA {testbed.state.ca_file}" if testbed.state.ca_file else "") + "\n")
    return 0


def _print_apps(testbed: Any) -> None:
    for app in testbed.apps():
        serving = app["serving"] or {}
        backups = ", ".join(f"{b['variant']}@{b['server_id']}" for b in app["backups"]) or "-"
        sys.stdout.write(f"  {app['app_id']:8} {'K' if app['spec']['critical'] else ' '} "
                         f"{app['status']:11} {serving.get('variant', '-'):22} "
                         f"@{serving.get('server_id', '-'):4} backups: {backups}\n")


def _load(options: argparse.Namespace) -> Any:
    from deploy.testbed import Testbed
    from deploy.testbed_state import TestbedState

    return Testbed(TestbedState.load(options.run_dir))


def _fail(options: argparse.Namespace) -> int:
    from deploy.inject import kill

    testbed = _load(options)
    if options.site:
        servers = testbed.servers_of_site(options.site)
    elif options.server:
        servers = [options.server]
    else:
        sys.stderr.write("give a SERVER or --site SITE\n")
        return 2
    at = kill(testbed, servers, site=options.site or "")
    sys.stdout.write(f"killed {', '.join(servers)} at {at:.3f}\n")
    return 0


def _revive(options: argparse.Namespace) -> int:
    import time

    from deploy.inject import revive

    testbed = _load(options)
    started = time.time()
    revive(testbed, options.server, options.timeout_s)
    sys.stdout.write(f"restarted the agent of {options.server}: up and connected after "
                     f"{time.time() - started:.1f} s\n")
    return 0


def _report(options: argparse.Namespace) -> int:
    from deploy.declarations import classify, parse
    from deploy.inject import fetch_declarations, injections
    from deploy.outage import outages_json
    from deploy.report import (
        analyse,
        load_requests,
        origin_of,
        outcomes_json,
        plot,
        print_clients,
        print_declarations,
        print_table,
        summary,
        verdicts_json,
    )

    testbed = _load(options)
    events = testbed.http.get("/v1/events", params={"limit": 10000}).json()
    requests = load_requests(Path(testbed.state.run_dir) / "requests")
    outcomes = analyse(testbed.state.failures, events, requests)
    print_table(outcomes, sys.stdout.write)
    figures = summary(outcomes)
    rate, named = figures["recovery_rate"], figures["recovery_rate_from_events"]
    sys.stdout.write(f"recovery rate: {rate * 100:.1f} % of {figures['affected']} affected apps\n"
                     if rate is not None else "no failure injected yet\n")
    if rate is not None and named != rate:
        counted = "none" if named is None else f"{named * 100:.1f} %"
        sys.stdout.write(f"  (counting only the {figures['affected_named_by_events']} apps an "
                         f"event named: {counted})\n")
    outages, seen = print_clients(testbed.state.failures, outcomes, requests, sys.stdout.write)
    figures.update(seen)
    injected = injections(testbed.state)
    verdicts = classify(parse(fetch_declarations(testbed.http)), injected)
    figures.update(print_declarations(verdicts, injected,
                                      origin_of(injected, verdicts, requests), sys.stdout.write))
    path = plot(testbed.state.failures, outcomes, requests,
                Path(testbed.state.run_dir) / "report.png", verdicts=verdicts,
                outages=outages)
    if path is not None:
        sys.stdout.write(f"plot: {path}\n")
    (Path(testbed.state.run_dir) / "report.json").write_text(json.dumps(
        {"summary": figures, "outcomes": outcomes_json(outcomes),
         "client_outages": outages_json(outages),
         "declarations": verdicts_json(verdicts, injected)}, indent=2))
    if options.json:
        sys.stdout.write(json.dumps(figures) + "\n")
    return 0


def _status(options: argparse.Namespace) -> int:
    from deploy.processes import alive

    testbed = _load(options)
    for name, info in testbed.state.processes.items():
        state = "up" if alive(info.pid, info.started) else "down"
        sys.stdout.write(f"{name:12} pid {info.pid:7} {state:5} {info.log}\n")
    return 0


def _down(options: argparse.Namespace) -> int:
    _load(options).down()
    sys.stdout.write("testbed down\n")
    return 0


def _register(options: argparse.Namespace) -> int:
    """Register the apps ``testbed up`` would, with the controller at ``--controller-url``."""
    import httpx

    from deploy.topology import make_topology
    from deploy.workload import (
        RegistrationError,
        generate_workload,
        register_apps,
        wait_converged,
        wait_for_servers,
    )
    from understudy.wire.credentials import (
        CredentialFileError,
        bearer,
        ca_file_of,
        client_ssl_context,
        load_token,
    )

    topology = make_topology(options.servers, options.sites, options.apps, options.critical,
                             options.headroom)
    workload = generate_workload(topology, seed=options.seed)
    try:
        headers = bearer(load_token(options.token_file))
        tls = client_ssl_context(ca_file_of(options.ca_file))
    except CredentialFileError as exc:
        logger.error("%s", exc)
        return 2
    with httpx.Client(base_url=options.controller_url, headers=headers, timeout=10.0,
                      verify=tls) as http:
        try:
            wait_for_servers(http, len(topology.servers), options.timeout_s)
            created = register_apps(http, workload.specs, load_timeout_s=options.timeout_s)
            if not options.no_wait:
                wait_converged(http, options.timeout_s)
        except (RegistrationError, httpx.HTTPError) as exc:
            logger.error("%s", exc)
            return 1
    sys.stdout.write(f"{len(created)} apps registered, {len(workload.specs) - len(created)} "
                     f"already there: {', '.join(workload.app_ids)}\n")
    return 0


def _sim_agents(options: argparse.Namespace) -> int:
    """Run simulated agents until stdin closes (or ``quit``)."""
    import asyncio

    from deploy.sim_control import FleetSpec, run_fleet

    if options.agents < 1 or options.first < 0 or options.sites < 1:
        sys.stderr.write("--agents and --sites must be at least 1, --first at least 0\n")
        return 2
    spec = FleetSpec(controller_url=options.controller_url, capacity=options.capacity,
                     count=options.agents, first=options.first, sites=options.sites,
                     credentials_dir=options.credentials_dir, ca_file=options.ca_file,
                     load_time_scale=options.load_time_scale, seed=options.seed)
    return asyncio.run(run_fleet(spec, hold=options.hold))


def _client(options: argparse.Namespace) -> int:
    """Run the clients until SIGTERM or SIGINT; stops within 2 s, controller reachable or not."""
    from deploy.loadgen import run_clients
    from understudy.sdk import run_until_signal
    from understudy.wire.credentials import CredentialFileError, ca_file_of, load_token

    needed = "gateway_url" if options.via == "gateway" else "controller_url"
    if not getattr(options, needed):
        sys.stderr.write(f"--via {options.via} needs --{needed.replace('_', '-')}\n")
        return 2
    try:
        token = load_token(options.token_file)
    except CredentialFileError as exc:
        logger.error("%s", exc)
        return 2
    ca_file = ca_file_of(options.ca_file)
    app_ids = [a for a in options.app.split(",") if a]
    run_until_signal(lambda stop: run_clients(options.controller_url, app_ids, token,
                                              options.rate, options.out, stop,
                                              ca_file=str(ca_file) if ca_file else None,
                                              store=options.store, via=options.via,
                                              gateway_url=options.gateway_url))
    return 0


def _say(text: str) -> None:
    sys.stdout.write(f"\n== {text}\n")
    sys.stdout.flush()


DEMO_FAMILIES = ("digits", "mobilenet_v3", "shufflenet_v2")
"""The demo's apps: the real digits family (trained and imported by ``understudy models
build``; its clients send held-out digits and check the answers) and two synthetic ones."""


def _print_predictions(requests_dir: Path) -> None:
    from deploy.samples import prediction_summary

    summary = prediction_summary(requests_dir)
    if not summary["predictions_checked"]:
        return
    _say(f"real predictions: {summary['apps']} digits apps, {summary['predictions_checked']} "
         f"answers checked against their labels, top-1 {summary['top1']:.4f}")
    for variant, counts in summary["by_variant"].items():
        sys.stdout.write(f"  {variant:24} {counts['checked']:6d} answers  top-1 "
                         f"{counts['top1']:.4f}\n")


def _demo(options: argparse.Namespace) -> int:
    """The end-to-end demo a person can follow on screen."""
    import shutil
    import time

    from deploy.inject import kill
    from deploy.testbed import Testbed, wait_until
    from deploy.topology import make_topology

    shutil.rmtree(options.run_dir, ignore_errors=True)
    _say("starting Redis, the controller and 6 agents (each with its own Triton) in 3 sites; "
         f"registering 12 apps (half critical) of the families {', '.join(DEMO_FAMILIES)} ...")
    topology = make_topology(6, 3, 12, 0.5, 0.2, families=DEMO_FAMILIES)
    testbed = Testbed.up(options.run_dir, topology, seed=options.seed,
                         artifacts=options.artifacts, client_rate=5.0, client_via="gateway")
    try:
        _print_apps(testbed)
        plan = testbed.http.get("/v1/plan").json()
        stats = plan["stats"]
        sys.stdout.write(f"warm plan: {len(plan['assignments'])} backups, "
                         f"{len(plan['uncovered'])} uncovered, {stats['status']} in "
                         f"{stats['total_s'] * 1000:.0f} ms ({stats['solver']})\n")
        _say(f"steady load: one client per app at 5 req/s through the gateway "
             f"({testbed.state.gateway_url}) for {options.steady_s:.0f} s")
        time.sleep(options.steady_s)
        apps = testbed.apps()
        counts: dict[str, int] = {}
        for app in apps:
            if app["serving"]:
                server = app["serving"]["server_id"]
                counts[server] = counts.get(server, 0) + 1 + 10 * bool(app["backups"])
        victim = max(sorted(counts), key=lambda s: counts[s])
        _say(f"SIGKILL of server {victim} (its agent and its Triton) ...")
        kill(testbed, [victim])

        def settled() -> bool:
            return all(not (a["serving"] and a["serving"]["server_id"] == victim)
                       and a["status"] != "recovering" for a in testbed.apps())

        wait_until("recovery", settled, 120, 0.2)
        time.sleep(options.recovery_s)
        _say("after the failure")
        _print_apps(testbed)
        _say("report (every failure declaration is listed: one of a server the demo did not "
             "kill is a false alarm, marked ! here and in orange on the plot)")
        report = argparse.Namespace(run_dir=options.run_dir, json=True)
        _report(report)
        _print_predictions(options.run_dir / "requests")
    finally:
        _say("stopping the testbed")
        testbed.down()
    return 0


_ACTIONS = {"up": _up, "demo": _demo, "fail": _fail, "revive": _revive, "report": _report,
            "status": _status, "down": _down, "register": _register, "client": _client,
            "sim-agents": _sim_agents}
