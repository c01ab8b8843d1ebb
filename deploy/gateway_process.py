"""An ``understudy gateway`` process started for a test bed or a bench, and its /metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from deploy.testbed import wait_until
from understudy.wire.ports import free_port

REPO = Path(__file__).resolve().parents[1]


@dataclass
class GatewayProcess:
    """An ``understudy gateway`` process."""

    process: subprocess.Popen[bytes]
    port: int
    run_dir: Path

    @property
    def url(self) -> str:
        """Its HTTP endpoint."""
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """Its /metrics text."""
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def total(self, name: str, label: str = "") -> float:
        """The sum of a metric's samples whose labels contain ``label``."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in self.metrics().splitlines()
                   if line.startswith(name) and label in line)

    def sample(self, name: str, **labels: str) -> float | None:
        """One sample of /metrics whose labels include ``labels`` (None: absent)."""
        return _sample_of(self.metrics(), name, **labels)

    def collector_pauses(self) -> dict[str, dict[str, float]]:
        """Per generation, the garbage collector's passes in the gateway.

        How many, their total and how many took 10 ms or more
        (``understudy_gateway_gc_pause_seconds``), from one reading of /metrics (passes go
        on between two readings).
        """
        name = "understudy_gateway_gc_pause_seconds"
        text = self.metrics()
        found: dict[str, dict[str, float]] = {}
        for generation in ("0", "1", "2"):
            passes = _sample_of(text, f"{name}_count", generation=generation)
            if not passes:
                continue
            total = _sample_of(text, f"{name}_sum", generation=generation) or 0.0
            short = _sample_of(text, f"{name}_bucket", generation=generation, le="0.01") or 0.0
            found[generation] = {"passes": passes, "total_ms": round(total * 1000, 1),
                                 "over_10ms": passes - short}
        return found

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _sample_of(text: str, name: str, **labels: str) -> float | None:
    """The first sample of metrics ``text`` named ``name`` with ``labels`` (None: absent)."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name):len(name) + 1] in (" ", "{")) \
                and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    return None


def start_gateway(run_dir: Path, controller_url: str, *extra: str,
                  nice: int = 0, token_file: Path | None = None) -> GatewayProcess:
    """Start ``understudy gateway`` on a free port and wait until it routes.

    ``token_file``: the gateway credential for the controller (a testbed's ``gateway`` one).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (run_dir / "gateway.log").open("ab")
    command = [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", "gateway",
               "--controller-url", controller_url, "--port", str(port), "--run-dir",
               str(run_dir), *extra]
    if token_file is not None:
        command += ["--token-file", str(token_file)]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    gateway = GatewayProcess(process, port, run_dir)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {(run_dir / 'gateway.log').read_text()}")
        try:
            return httpx.get(f"{gateway.url}/v2/health/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until("the gateway to be ready", ready, 60, 0.05)
    return gateway
