"""Simulated agents against a real controller: 300 connect at once, and faults are judged right.

One controller (its embedded Redis and heartbeat monitor) and 300 simulated agents in two
processes (``deploy.sim_control``). The bounds on detection times are loose (a shared 2-core
machine); ``bench/control_plane_scale.py`` measures them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.sim_driver import ControllerProcess, SimAgentProcesses
from deploy.testbed import wait_until

pytestmark = pytest.mark.timeout(120)

AGENTS = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ControllerProcess, SimAgentProcesses]]:
    run_dir: Path = tmp_path_factory.mktemp("sim-agents")
    controller = ControllerProcess(run_dir, log_level="WARNING")
    sims = None
    try:
        controller.wait_ready()
        sims = SimAgentProcesses(controller.url, AGENTS, 2, sites=3,
                                 capacity={"memory_mb": 4000.0, "compute": 100.0},
                                 log_dir=run_dir, credentials_dir=controller.credentials,
                                 hold=True)
        sims.wait_ready()
        yield controller, sims
    finally:
        if sims is not None:
            sims.close()
        controller.stop()


def _up(controller: ControllerProcess) -> int:
    servers = controller.http.get("/v1/servers", params={"limit": 1000}).json()
    return sum(1 for s in servers if s["state"] == "up" and s["connected"])


def _declarations(controller: ControllerProcess, since: int = 0) -> list[dict[str, Any]]:
    return list(controller.http.get("/v1/declarations", params={"since": since}).json())


def _last_seq(controller: ControllerProcess) -> int:
    found = _declarations(controller)
    return found[-1]["seq"] if found else 0


def _declaration_of(controller: ControllerProcess, server: str, since: int
                    ) -> dict[str, Any] | None:
    return next((d for d in _declarations(controller, since) if d["server_id"] == server), None)


def test_300_agents_connect_at_once_and_are_watched_without_false_alarms(
        cluster: tuple[ControllerProcess, SimAgentProcesses]) -> None:
    controller, sims = cluster
    sims.command("connect")
    wait_until("300 servers up and connected", lambda: _up(controller) == AGENTS, 45)
    wait_until("every agent beating on its channel",
           lambda: sims.status()["beating"] == AGENTS, 15)
    before = sims.status()["sent"]
    watched = time.monotonic()
    while time.monotonic() - watched < 3.0:  # an observation window, not a wait
        assert _declarations(controller) == []
        time.sleep(0.25)
    # 300 agents x 3 s / 20 ms = 45,000 beats; allow for a loaded machine.
    assert sims.status()["sent"] - before > 20_000
    assert _up(controller) == AGENTS


def test_a_crash_is_declared_at_once(
        cluster: tuple[ControllerProcess, SimAgentProcesses]) -> None:
    controller, sims = cluster
    since = _last_seq(controller)
    at = sims.command("crash", "sim-0000")[0]["at"]
    found = wait_until("the crash's declaration",
                   lambda: _declaration_of(controller, "sim-0000", since), 5)
    # Two immediate signals race: the websocket's close and the liveness stream's.
    assert found["reason"] in ("connection closed", "agent processes died")
    assert found["detected_at"] - at < 0.5


def test_a_silence_is_declared_after_suspicion_and_unanswered_probes(
        cluster: tuple[ControllerProcess, SimAgentProcesses]) -> None:
    controller, sims = cluster
    since = _last_seq(controller)
    at = sims.command("silence", "sim-0001")[0]["at"]
    found = wait_until("the silence's declaration",
                   lambda: _declaration_of(controller, "sim-0001", since), 5)
    assert found["reason"] == "missed heartbeats, probes unanswered"
    assert 0.04 < found["detected_at"] - at < 0.15 + 0.35  # 4.5 T + 2 T, plus slack
    sims.command("revive", "sim-0001")  # alive all along: a false alarm, taken back
    wait_until("the revived server's declaration marked alive again",
           lambda: (_declaration_of(controller, "sim-0001", since) or {}).get("alive_again"),
           10)
    wait_until("the revived server up again", lambda: _up(controller) == AGENTS - 1, 10)


def test_a_short_stall_is_not_declared(
        cluster: tuple[ControllerProcess, SimAgentProcesses]) -> None:
    controller, sims = cluster
    since = _last_seq(controller)
    sims.command("stall", "sim-0002", "40")
    watched = time.monotonic()
    while time.monotonic() - watched < 1.0:  # an observation window, not a wait
        assert _declaration_of(controller, "sim-0002", since) is None
        time.sleep(0.05)


def test_a_restarted_agent_returns_with_a_new_boot(
        cluster: tuple[ControllerProcess, SimAgentProcesses]) -> None:
    controller, sims = cluster
    boot = controller.http.get("/v1/servers/sim-0000").json()["boot_id"]
    sims.command("restart", "sim-0000")
    wait_until("the crashed server back up",
           lambda: controller.http.get("/v1/servers/sim-0000").json()["state"] == "up", 10)
    assert controller.http.get("/v1/servers/sim-0000").json()["boot_id"] != boot
    wait_until("every server up", lambda: _up(controller) == AGENTS, 10)
