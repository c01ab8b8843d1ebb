"""Start a controller and processes of simulated agents, and drive them from a bench or a test.

:class:`SimAgentProcesses` spawns ``understudy testbed sim-agents`` processes (each a share of
the servers, ``--first`` apart), sends each command only to the processes that hold a server it
names, and gathers their one-line JSON replies (``deploy.sim_control``).
:class:`ControllerProcess` runs ``understudy controller`` (with its embedded Redis) on a free
port and reads the CPU time of its whole process tree from ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import httpx

from understudy.wire.ports import free_port

READY_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class SimDriverError(RuntimeError):
    """A process did not start, answer, or accept a command."""


def _understudy(*args: str) -> list[str]:
    return [sys.executable, "-m", "understudy.cli.main", *args]


def _capacity_arg(capacity: dict[str, float]) -> str:
    return ",".join(f"{key}={float(value)!r}" for key, value in capacity.items())


class _Process:
    """One sim-agents process: its pipes, its servers and sites, and its replies."""

    def __init__(self, args: list[str], log: IO[bytes]) -> None:
        self.popen = subprocess.Popen(  # noqa: S603 - our own CLI
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.sites: dict[str, str] = {}
        threading.Thread(target=self._read, daemon=True, name="sim-replies").start()

    def _read(self) -> None:
        assert self.popen.stdout is not None  # noqa: S101 - piped
        for line in self.popen.stdout:
            with contextlib.suppress(ValueError):
                self.replies.put(json.loads(line))
        self.replies.put(None)

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None  # noqa: S101 - piped
        try:
            self.popen.stdin.write(line + "\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise SimDriverError(f"sim-agents process {self.popen.pid} is gone") from exc

    def reply(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        try:
            message = self.replies.get(timeout=timeout_s)
        except queue.Empty as exc:
            raise SimDriverError(f"sim-agents process {self.popen.pid} did not answer in "
                                 f"{timeout_s:.0f} s") from exc
        if message is None:
            raise SimDriverError(f"sim-agents process {self.popen.pid} exited "
                                 f"(code {self.popen.poll()})")
        return message

    def holds(self, target: str) -> bool:
        if target == "all":
            return True
        if target.startswith("site:"):
            return target.removeprefix("site:") in self.sites.values()
        return any(name in self.sites for name in target.split(","))

    def only_mine(self, target: str) -> str:
        if target == "all" or target.startswith("site:"):
            return target
        return ",".join(name for name in target.split(",") if name in self.sites)


class SimAgentProcesses:
    """``agents`` simulated servers in ``processes`` processes (see the module docstring)."""

    def __init__(self, controller_url: str, agents: int, processes: int, *, sites: int,
                 capacity: dict[str, float], log_dir: Path, credentials_dir: Path | None = None,
                 hold: bool = True, load_time_scale: float = 1.0, seed: int = 0) -> None:
        if agents < 1 or not 1 <= processes <= agents:
            raise ValueError("need at least one agent and 1 <= processes <= agents")
        log_dir.mkdir(parents=True, exist_ok=True)
        self._logs: list[IO[bytes]] = []
        self.processes: list[_Process] = []
        share, extra = divmod(agents, processes)
        first = 0
        for index in range(processes):
            count = share + (1 if index < extra else 0)
            args = _understudy("--log-level", "WARNING", "testbed", "sim-agents",
                               "--controller-url", controller_url, "--agents", str(count),
                               "--first", str(first), "--sites", str(sites),
                               "--capacity", _capacity_arg(capacity),
                               "--load-time-scale", str(load_time_scale),
                               "--seed", str(seed))
            args += ["--credentials-dir", str(credentials_dir)] if credentials_dir else []
            args += ["--hold"] if hold else []
            log = (log_dir / f"sim-agents-{index}.log").open("ab")
            self._logs.append(log)
            self.processes.append(_Process(args, log))
            first += count

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for every process's ``ready`` line (imports done, agents built)."""
        for process in self.processes:
            ready = process.reply(timeout_s)
            if ready.get("op") != "ready":
                raise SimDriverError(f"expected a ready line, got {ready}")
            process.sites = dict(ready["sites"])

    @property
    def sites(self) -> dict[str, str]:
        """Every server -> its site."""
        return {server: site for p in self.processes for server, site in p.sites.items()}

    def command(self, op: str, target: str = "all", *extra: str) -> list[dict[str, Any]]:
        """Send ``op TARGET EXTRA...`` to every process holding a target; their replies.

        The command is written to all of them before any reply is read, so a fault reaches
        every process at (nearly) the same instant.
        """
        chosen = [p for p in self.processes if p.holds(target)]
        if not chosen:
            raise SimDriverError(f"no process holds {target!r}")
        for process in chosen:
            process.send(" ".join([op, process.only_mine(target), *extra]))
        replies = [process.reply() for process in chosen]
        failed = [r for r in replies if not r.get("ok")]
        if failed:
            raise SimDriverError(f"{op} {target}: {failed[0].get('error')}")
        return replies

    def status(self) -> dict[str, float]:
        """The processes' counters, summed (their ``..._ms`` figures: the largest)."""
        totals: dict[str, float] = {}
        for reply in self.command("status"):
            for key, value in reply.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                totals[key] = max(totals.get(key, value), value) if key.endswith("_ms") \
                    else totals.get(key, 0) + value
        return totals

    def close(self) -> None:
        """``quit`` every process; kill those still running after a while."""
        for process in self.processes:
            with contextlib.suppress(SimDriverError):
                process.send("quit")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        for log in self._logs:
            log.close()


class ControllerProcess:
    """``understudy controller`` on a free port, with its embedded Redis.

    Its credential store (``credentials``) is made here before it starts, so ``http`` carries
    the admin credential from the first call; ``insecure`` starts it without authentication.
    ``port`` (default: a free one) lets a restarted controller take its predecessor's, so that
    its agents find it again.
    """

    def __init__(self, run_dir: Path, *, insecure: bool = False, heartbeat_ms: float = 20.0,
                 log_level: str = "INFO", extra: Iterable[str] = (), port: int = 0) -> None:
        from controller.credentials import CredentialStore
        from understudy.wire.credentials import bearer, read_token_file

        run_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = run_dir / "controller.log"
        self._log = self.log_path.open("ab")
        self.credentials = None if insecure else run_dir / "credentials"
        auth = ["--insecure"]
        headers: dict[str, str] = {}
        if self.credentials is not None:
            store = CredentialStore(self.credentials)
            store.init()
            auth = ["--credentials-dir", str(self.credentials)]
            headers = bearer(read_token_file(store.token_path("admin")))
        args = _understudy("--log-level", log_level, "controller", "--port", str(self.port),
                           "--run-dir", str(run_dir / "ctl"), "--heartbeat-ms",
                           str(heartbeat_ms), *auth, *extra)
        self.popen = subprocess.Popen(  # noqa: S603 - our own CLI
            args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.auth = headers
        """The admin credential's header ({} with ``insecure``)."""
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until ``/readyz`` answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise SimDriverError(f"the controller exited (code {self.popen.returncode}); "
                                     f"see {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/readyz", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise SimDriverError(f"the controller was not ready in {timeout_s:.0f} s")

    def pids(self) -> dict[str, int]:
        """The controller's process and its descendants (heartbeat monitor, Redis), by name."""
        found = {"controller": self.popen.pid}
        parents = {self.popen.pid}
        for _ in range(3):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in found.values():
                    continue
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (entry / "stat").read_text()
                    name, rest = stat[stat.index("(") + 1:stat.rindex(")")], \
                        stat[stat.rindex(")") + 2:].split()
                    if int(rest[1]) in parents:
                        cmdline = (entry / "cmdline").read_bytes()
                        label = "monitor" if b"heartbeat_monitor" in cmdline else name
                        found[label] = int(entry.name)
                        parents.add(int(entry.name))
        return found

    @staticmethod
    def cpu_s(pid: int) -> float:
        """User + system CPU seconds of one process (0 when it is gone)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self) -> None:
        """SIGINT, then SIGKILL after a while (its Redis and monitor go with it)."""
        self.http.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
