"""The local testbed: Redis, the controller, one agent (with its Triton) per server, clients.

Every process runs in its own process group, logs to ``<run_dir>/logs`` and is recorded in
``<run_dir>/testbed.json``, so ``fail``/``report``/``down`` work from another command. ``fail``
SIGKILLs a server's whole process group (agent, Triton, torch runtime and stubs) at an instant it
records first.

The groups stay in the launcher's session on purpose. With the kernel's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``, on by default in desktop and many server
kernels) every session is a scheduling group that gets an equal share of the CPU, and niceness
only orders processes inside one group: with a session per process, the control plane's -5
and the data plane's +5 meant nothing across processes, and a server loading interim variants
got one share in eight of the machine while five other servers' inference took the rest
(measured: four nice-19 busy loops in their own sessions slowed a nice-0 job 2.7x; in the same
session, not at all). One session makes the niceness below order every testbed process, as it
would on machines of their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from agent.triton_access import model_control_headers
from controller.credentials import CredentialStore
from controller.redis_server import redis_config, with_password
from deploy.processes import (
    ProcessInfo,
    alive,
    signal_group,
    start_ticks,
    unpreempted,
)
from deploy.testbed_state import (
    TLS_DIR,
    TestbedError,
    TestbedState,
    clear_previous_run,
    make_credentials,
)
from deploy.topology import Topology, capacity_arg
from deploy.workload import (
    DEFAULT_RATE_RPS,
    DEFAULT_SEED,
    RegistrationError,
    Workload,
    generate_workload,
    list_all,
    register_batch,
    wait_converged,
)
from model_repo.artifacts import DEFAULT_SCALE, build_store
from model_repo.profiles import family_from_document, load_family_documents
from understudy.wire.credentials import bearer, client_ssl_context, read_token_file
from understudy.wire.ports import free_port
from understudy.wire.secret_files import new_secret, read_secret_file, write_secret_file

logger = logging.getLogger(__name__)

REDIS_PASSWORD_FILE = "redis.password"
REDIS_CONFIG_FILE = "redis.conf"
DATA_PLANE_NICE = 5
"""Triton and the load generators run at this niceness: on a small shared CPU the control
plane (heartbeats every 20 ms) must not queue behind inference."""
CONTROL_PLANE_NICE = -5
"""Redis, the controller and the agents run at this niceness where the testbed may raise
priority (root): detection and the failover's first steps take milliseconds, and must not wait
for the CPU behind inference or unrelated work on the machine. Without the privilege they keep
the launcher's niceness."""
GATEWAY_NICE = 0
"""The inference gateway sits between the two: clients see a failover only once it has learnt
of the move (control plane speed matters), and it forwards every request (data plane)."""
REPO = Path(__file__).resolve().parents[1]


def _set_niceness(nice: int) -> None:
    """Absolute niceness of the calling (child) process; a refused raise keeps the current one."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)


def _spawn(state: TestbedState, name: str, args: list[str], nice: int = 0) -> ProcessInfo:
    log_dir = Path(state.run_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - our own CLI
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            process_group=0, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=(lambda: _set_niceness(nice)) if nice else None)
    info = ProcessInfo(name, process.pid, str(log_path), args, start_ticks(process.pid))
    state.processes[name] = info
    state.save()
    return info


def _understudy(*args: str) -> list[str]:
    return [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", *args]


def wait_until(what: str, check: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """Poll ``check()`` until it returns a truthy value; TestbedError after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class Testbed:
    """Drive one testbed: ``up``, ``fail``, ``revive``, ``down`` (report: ``deploy.report``)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, state: TestbedState) -> None:
        self.state = state
        self.http = httpx.Client(base_url=state.controller_url, timeout=10.0,
                                 headers=bearer(self.token("admin")),
                                 verify=client_ssl_context(state.ca_file))

    def token_file(self, name: str) -> Path:
        """The file of a credential ``up`` made.

        ``name``: ``admin``, ``read``, ``client`` or ``gateway``.
        """
        return CredentialStore(self.state.credentials).token_path(name)

    def agent_token_file(self, server_id: str) -> Path:
        """The file of a server's agent credential."""
        return CredentialStore(self.state.credentials).agent_token_path(server_id)

    def token(self, name: str) -> str:
        """The credential in :meth:`token_file`."""
        return read_token_file(self.token_file(name))

    # --- start ----------------------------------------------------------------------------

    @classmethod
    def up(cls, run_dir: Path, topology: Topology, *, seed: int = DEFAULT_SEED,
           scale: float = DEFAULT_SCALE, artifacts: Path | None = None,
           policy: str = "understudy", heartbeat_ms: float = 20.0,
           rate_rps: tuple[float, float] = DEFAULT_RATE_RPS, clients: bool = True,
           client_rate: float = 5.0, timeout_s: float = 300.0, register: bool = True,
           artifact_mirror: bool = True, tls: bool = False, gateway: bool = True,
           client_via: str = "sdk") -> Testbed:
        """Start everything, register the apps, wait until all serve with their backups.

        With ``register=False`` only the processes start (servers sized for the generated
        apps), for a caller that registers them itself (``understudy testbed register``).
        Agents fetch manifests over HTTP from the controller, as agents on other hosts do; with
        ``artifact_mirror`` (default) they link the weights from the store on this machine once
        the served sha256 matches, instead of all downloading gigabytes at once while they
        register (which starved heartbeats into false alarms on a small machine).

        Credentials are made afresh in ``<run_dir>/credentials`` (one per role, one per agent;
        :meth:`token_file`); with ``tls`` a CA and the controller's certificate in
        ``<run_dir>/tls``, and every process verifies the controller with that CA.
        With ``gateway`` (default) an inference gateway runs too; the clients go through it
        with ``client_via="gateway"``, through the SDK with ``"sdk"``.
        """
        run_dir = run_dir.resolve()
        clear_previous_run(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        make_credentials(run_dir, topology, tls)
        store = (artifacts or run_dir / "artifacts").resolve()
        docs = load_family_documents(stores=[store])
        missing = sorted(set(topology.families) - set(docs))
        if missing:
            raise TestbedError(f"families {', '.join(missing)} are neither packaged nor in the "
                               f"store {store} (`understudy models build` imports digits)")
        # Imported families are in the store already; the synthetic ones are built (cached).
        synthetic = [family_from_document(docs[f]) for f in topology.families
                     if docs[f].origin == "synthetic"]
        build_store(store, synthetic, scale=scale)
        workload = generate_workload(topology, seed=seed, rate_rps=rate_rps, stores=[store])
        state = TestbedState(run_dir=str(run_dir), controller_url="", redis_port=free_port(),
                             artifacts=str(store), policy=policy,
                             artifact_mirror=artifact_mirror, tls=tls)
        testbed = cls(state)
        try:
            testbed = cls._start_processes(state, workload.sized(topology), heartbeat_ms,
                                           timeout_s)
            if gateway:
                testbed.start_gateway()
            if register:
                testbed.register(workload, timeout_s)
                if clients:
                    testbed.start_clients(client_rate, via=client_via)
        except BaseException:
            testbed.down()  # nothing half-started is left running
            raise
        return testbed

    @classmethod
    def _start_processes(cls, state: TestbedState, topology: Topology, heartbeat_ms: float,
                         timeout_s: float) -> Testbed:
        port = free_port()
        state.controller_url = f"{'https' if state.tls else 'http'}://127.0.0.1:{port}"
        state.save()
        testbed = cls(state)
        testbed.start_redis()
        testbed.start_controller(heartbeat_ms)
        for spec in topology.servers:
            state.servers[spec.server_id] = {"site_id": spec.site_id,
                                             "capacity": spec.capacity}
            testbed.start_agent(spec.server_id)
        state.save()
        wait_until("every agent to connect", lambda: testbed._servers_up(len(topology.servers)),
                   timeout_s, 0.25)
        return testbed

    def start_redis(self) -> ProcessInfo:
        """Start Redis with a new password.

        The password reaches redis-server in its config file and the controller in a file of
        its own (both 0600 in the run directory), never on a command line.
        """
        run_dir = Path(self.state.run_dir)
        password = new_secret()
        self.state.redis_password_file = str(write_secret_file(run_dir / REDIS_PASSWORD_FILE,
                                                               password + "\n"))
        config = write_secret_file(run_dir / REDIS_CONFIG_FILE, redis_config(
            bind="127.0.0.1", port=self.state.redis_port, data_dir=run_dir, password=password))
        return _spawn(self.state, "redis", ["redis-server", str(config)],
                      nice=CONTROL_PLANE_NICE)

    def start_controller(self, heartbeat_ms: float = 20.0) -> ProcessInfo:
        """Start (or restart) the controller and wait until it is ready."""
        port = self.state.controller_url.rsplit(":", 1)[1]
        tls_dir = Path(self.state.run_dir) / TLS_DIR
        tls = (["--tls-cert", str(tls_dir / "server.pem"), "--tls-key",
                str(tls_dir / "server.key")] if self.state.tls else [])
        info = _spawn(self.state, "controller", _understudy(
            "controller", "--port", port, "--run-dir", str(Path(self.state.run_dir) / "ctl"),
            "--redis-url", f"redis://127.0.0.1:{self.state.redis_port}/0",
            "--redis-password-file", self.state.redis_password_file,
            "--credentials-dir", str(self.state.credentials), *tls,
            "--artifacts", self.state.artifacts,
            "--heartbeat-ms", str(heartbeat_ms), "--policy", self.state.policy),
            nice=CONTROL_PLANE_NICE)
        wait_until("the controller to be ready", self._ready, 60, 0.1)
        return info

    def start_agent(self, server_id: str) -> ProcessInfo:
        """Start (or restart) one server's agent."""
        server = self.state.servers[server_id]
        capacity = capacity_arg(server["capacity"])
        return _spawn(self.state, f"agent-{server_id}", _understudy(
            "agent", "--server-id", server_id, "--site", server["site_id"],
            "--controller-url", self.state.controller_url, "--capacity", capacity,
            # Over HTTP from the controller, as agents on other hosts would fetch them; the
            # weights linked from the local store once their sha256 matches (see up()).
            "--artifacts", f"{self.state.controller_url}/v1/artifacts",
            *(["--artifacts-mirror", self.state.artifacts] if self.state.artifact_mirror else []),
            "--run-dir", str(Path(self.state.run_dir) / "agents" / server_id),
            "--token-file", str(self.agent_token_file(server_id)), *self._ca_args(),
            "--triton-nice", str(DATA_PLANE_NICE)),
            nice=CONTROL_PLANE_NICE)

    def _ca_args(self) -> list[str]:
        ca_file = self.state.ca_file
        return ["--ca-file", str(ca_file)] if ca_file is not None else []
    def redis_url(self) -> str:
        """The testbed Redis's URL with its password (for tools and tests; never log it)."""
        url = f"redis://127.0.0.1:{self.state.redis_port}/0"
        if not self.state.redis_password_file:
            return url
        return with_password(url, read_secret_file(Path(self.state.redis_password_file)))

    def triton_control_headers(self, server_id: str) -> dict[str, str]:
        """The header that lets a check control ``server_id``'s Triton (its current key)."""
        work_dir = Path(self.state.run_dir) / "agents" / server_id / "triton"
        return model_control_headers(work_dir)
    def start_gateway(self) -> ProcessInfo:
        """Start (or restart) the inference gateway and wait until it routes."""
        port = self.state.gateway_url.rsplit(":", 1)[1] if self.state.gateway_url else \
            str(free_port())
        self.state.gateway_url = f"http://127.0.0.1:{port}"
        info = _spawn(self.state, "gateway", _understudy(
            "gateway", "--controller-url", self.state.controller_url, "--port", port,
            "--token-file", str(self.token_file("gateway")), *self._ca_args(),
            "--run-dir", str(Path(self.state.run_dir) / "gateway")), nice=GATEWAY_NICE)
        url = f"{self.state.gateway_url}/v2/health/ready"

        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(url, timeout=2.0).status_code == 200
            return False

        wait_until("the gateway to be ready", ready, 60, 0.1)
        return info

    def _ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.http.get("/readyz").status_code == 200
        return False

    def servers(self) -> list[dict[str, Any]]:
        """The controller's server records."""
        return list_all(self.http, "/v1/servers")

    def apps(self) -> list[dict[str, Any]]:
        """The controller's app views."""
        return list_all(self.http, "/v1/apps")

    def apps_by_id(self) -> dict[str, dict[str, Any]]:
        """The controller's app views by app id."""
        return {a["app_id"]: a for a in self.apps()}

    def serving_off(self, app_ids: Iterable[str], server_id: str) -> bool:
        """Whether every one of ``app_ids`` serves, on a server other than ``server_id``."""
        current = self.apps_by_id()
        return all(current[a]["serving"] and current[a]["serving"]["server_id"] != server_id
                   for a in app_ids)

    def _servers_up(self, count: int) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            servers = self.servers()
            return sum(1 for s in servers if s["state"] == "up" and s["connected"]) >= count
        return False

    def register(self, workload: Workload, timeout_s: float) -> None:
        """Register the generated apps (``deploy.workload``) and wait until they converge.

        One batch: every primary is placed where the generator sized the servers for it,
        before warm backups take the headroom.
        """
        try:
            register_batch(self.http, workload.specs)
        except RegistrationError as exc:
            raise TestbedError(str(exc)) from exc
        self.state.apps.extend(workload.specs)
        self.state.save()
        self.wait_converged(timeout_s)

    def wait_converged(self, timeout_s: float) -> None:
        """Wait until every app serves its home variant and every planned backup is ready."""
        try:
            wait_converged(self.http, timeout_s)
        except RegistrationError as exc:
            raise TestbedError(str(exc)) from exc

    def start_clients(self, rate: float, via: str = "sdk", app_ids: list[str] | None = None,
                      name: str = "clients") -> ProcessInfo:
        """One load-generating process (``name``) with a client thread per app (every app).

        ``via="gateway"``: the clients go through the testbed's gateway; else the SDK.
        """
        apps = ",".join(app_ids if app_ids is not None else
                        [a["app_id"] for a in self.state.apps])
        gateway = ["--via", "gateway", "--gateway-url", self.state.gateway_url] \
            if via == "gateway" else []
        return _spawn(self.state, name, _understudy(
            "testbed", "client", "--controller-url", self.state.controller_url,
            "--token-file", str(self.token_file("client")), *self._ca_args(),
            "--app", apps, "--rate", str(rate), *gateway,
            "--out", str(Path(self.state.run_dir) / "requests"),
            "--store", self.state.artifacts), nice=DATA_PLANE_NICE)

    # --- failures -------------------------------------------------------------------------

    def fail(self, server_ids: list[str]) -> float:
        """SIGKILL the servers' process groups; returns (and records) the instant.

        The record also names the apps served from those servers just before
        (``serving_before``): reports count the affected apps from it, not from the events.
        """
        groups = []
        for server_id in server_ids:
            info = self.state.processes.get(f"agent-{server_id}")
            if info is None:
                raise TestbedError(f"unknown server {server_id!r}")
            groups.append(info)
        record: dict[str, Any] = {"servers": server_ids}
        record.update(self.serving_before(server_ids))
        at = time.time()
        signalled: dict[str, float] = {}
        with unpreempted():  # a site's servers die together, as in a power cut
            for server_id, info in zip(server_ids, groups, strict=True):
                signalled[server_id] = time.time()
                if not signal_group(info, signal.SIGKILL):
                    logger.warning("%s: no process group to kill (already gone)", server_id)
        record["at"] = at
        record["signalled"] = signalled
        self.state.failures.append(record)
        self.state.save()
        logger.info("failed %s at %.3f", ",".join(server_ids), at)
        return at

    def serving_before(self, server_ids: list[str]) -> dict[str, list[str]]:
        """``{"serving_before": apps served from the servers}``, or {} if the list failed."""
        from deploy.report import serving_on

        try:
            return {"serving_before": serving_on(self.apps(), server_ids)}
        except httpx.HTTPError as exc:
            logger.warning("apps served from %s not recorded: %s", ",".join(server_ids), exc)
            return {}

    def servers_of_site(self, site_id: str) -> list[str]:
        """Server ids in a site."""
        found = [s for s, v in self.state.servers.items() if v["site_id"] == site_id]
        if not found:
            raise TestbedError(f"unknown site {site_id!r}")
        return found

    def kill_process(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one recorded process group (controller, redis, clients ...)."""
        info = self.state.processes[name]
        signal_group(info, sig)
        wait_until(f"{name} to exit", lambda: not alive(info.pid, info.started), 30, 0.05)

    def down(self) -> None:
        """Stop everything (clients first, Redis last) and keep the logs.

        Each tier (clients, gateway, agents, controller, Redis) is signalled at once and then
        waited for together: an agent's stop (its Triton's unloads) takes seconds, and stopping
        the agents one after another made a testbed's shutdown grow with its size.
        """
        names = list(self.state.processes)
        tiers = ([n for n in names if n.startswith("clients")], ["gateway"],
                 [n for n in names if n.startswith("agent-")], ["controller"], ["redis"])
        for tier in tiers:
            self._stop_together([self.state.processes[n] for n in tier if n in names])
        self.http.close()

    @staticmethod
    def _stop_together(infos: list[ProcessInfo], grace_s: float = 15.0) -> None:
        """SIGTERM the process groups at once, wait for all; SIGKILL those left after grace_s."""
        running = [info for info in infos if alive(info.pid, info.started)]
        for info in running:
            signal_group(info, signal.SIGTERM)
        try:
            wait_until("processes to stop",
                       lambda: not any(alive(i.pid, i.started) for i in running), grace_s, 0.05)
        except TestbedError:
            for info in running:
                if alive(info.pid, info.started):
                    signal_group(info, signal.SIGKILL)
