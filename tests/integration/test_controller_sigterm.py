"""A controller stopped with SIGTERM declares none of its servers failed on its way out.

uvicorn closes every websocket when it stops, before the application's own shutdown; the
agents' connections closing then looked like failed servers: each was declared, a failover
began in the stopping controller, and the next controller resumed it, moving the apps of every
server that never failed. Real controller processes (embedded Redis, per-role credentials) and
simulated agents.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.sim_driver import ControllerProcess, SimAgentProcesses
from deploy.testbed import wait_until
from tests.integration.hostile_fixtures import artifact_store

pytestmark = pytest.mark.timeout(180)
APPS = [{"app_id": f"a{i}", "family": "mobilenet_v3", "variant": "mobilenet_v3_small",
         "critical": i % 2 == 0} for i in range(6)]


def _start(run_dir: Path, artifacts: Path, port: int = 0) -> ControllerProcess:
    process = ControllerProcess(run_dir, log_level="INFO", port=port, extra=[
        "--artifacts", str(artifacts), "--startup-grace-s", "10"])
    process.wait_ready()
    return process


def _placements(controller: ControllerProcess) -> dict[str, Any]:
    return {app["app_id"]: (app["status"], sorted((r["server_id"], r["role"])
                                                  for r in app["replicas"]))
            for app in controller.http.get("/v1/apps").json()}


def _all_up(controller: ControllerProcess, servers: list[str]) -> bool:
    found = {s["server_id"]: s for s in controller.http.get("/v1/servers").json()}
    return all(found.get(s, {}).get("state") == "up" and found[s].get("connected")
               for s in servers)


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[tuple[Path, Path, list[ControllerProcess]]]:
    started: list[ControllerProcess] = []
    yield tmp_path, artifact_store(tmp_path / "artifacts"), started
    for process in started:
        process.stop()


def test_sigterm_declares_nothing_and_the_next_controller_keeps_every_placement(
        bed: tuple[Path, Path, list[ControllerProcess]]) -> None:
    run_dir, artifacts, started = bed
    first = _start(run_dir, artifacts)
    started.append(first)
    agents = SimAgentProcesses(first.url, 2, 1, sites=2, log_dir=run_dir,
                               capacity={"memory_mb": 16000.0, "compute": 100.0},
                               credentials_dir=first.credentials, load_time_scale=0.01)
    try:
        agents.wait_ready()
        agents.command("connect")
        servers = sorted(agents.sites)
        wait_until("both servers up", lambda: _all_up(first, servers), 30)
        for app in APPS:
            assert first.http.post("/v1/apps", json=app).status_code == 201
        wait_until("every app serving, the critical ones backed", lambda: all(
            status == "serving" and (len(replicas) == 2 or not APPS[int(app[1:])]["critical"])
            for app, (status, replicas) in _placements(first).items()), 60)
        before = _placements(first)

        first.popen.send_signal(signal.SIGTERM)
        first.popen.wait(15)  # it stops (uvicorn then raises the signal again: -15)
        log = first.log_path.read_text(errors="replace")
        assert "declared failed" not in log, log[-3000:]

        second = _start(run_dir, artifacts, port=first.port)  # where the agents look
        started.append(second)
        wait_until("the agents back", lambda: _all_up(second, servers), 30)
        assert second.http.get("/v1/declarations").json() == []
        wait_until("every app where it was", lambda: _placements(second) == before, 30)
        assert "resuming the failover" not in first.log_path.read_text(errors="replace")
    finally:
        agents.close()
