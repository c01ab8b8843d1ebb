"""A false alarm during an in-flight recovery, on a real controller (issue 21, "Show it").

The controller process (its embedded Redis, its heartbeat monitor) and two simulated agents
speaking the real websocket and heartbeat protocols (``deploy.sim_agents``), run in this
process so that the test can read what each agent holds and set how long each load takes.

One app, p, served by its home server H. H crashes; p recovers on the other server R: its
interim (small) serves, its target (large, a slow load) is loading. R then falls silent (a
stopped box: no heartbeats, connection open), is declared failed, and its failover finds no
room for p; R is heard from again while the target is still loading. p must end on that
target, and every model an agent holds must be one the records account for: the interim
never made p's primary, the target never unloaded as a stray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.credentials import CredentialStore
from deploy.sim_agents import LoadTimes, SimAgent, SimAgentConfig
from deploy.sim_driver import ControllerProcess
from deploy.sim_heartbeats import HeartbeatPump
from model_repo.profiles import load_families
from policies.model import Variant
from tests.integration.agent_peer import LoopThread
from understudy.wire.protocol import ModelState, UnloadCommand

pytestmark = pytest.mark.timeout(120)

FAMILY, SMALL, LARGE = "mobilenet_v3", "mobilenet_v3_small", "mobilenet_v3_large"
TARGET_LOAD_S = 8.0
"""Long enough for R to be declared failed, its failover planned, and R heard again."""
WAIT_S = 20.0


class ScriptedLoadTimes(LoadTimes):
    """Load times the test sets per variant (the profiled ones are not what is tested)."""

    def __init__(self) -> None:  # noqa: D107 - no profile fit needed
        self.variants = {v.name: v for f in load_families().values() for v in f.variants}
        self.scale = 1.0
        self.seconds: dict[str, float] = {}

    def load_s(self, variant: Variant) -> float:
        return self.seconds.get(variant.name, 0.05)


@dataclass
class Cluster:
    controller: ControllerProcess
    loop: LoopThread
    agents: dict[str, SimAgent]
    load_times: ScriptedLoadTimes
    unloads: list[tuple[str, str]]
    """(server, model) of every unload an agent was sent."""

    def apps(self) -> dict[str, dict[str, Any]]:
        return {a["app_id"]: a for a in self.controller.http.get("/v1/apps").json()}

    def server_state(self, server_id: str) -> str:
        return str(self.controller.http.get(f"/v1/servers/{server_id}").json()["state"])

    def held(self, server_id: str) -> dict[str, ModelState]:
        """What the server's agent holds: model name -> state (read on the agents' loop)."""
        agent = self.agents[server_id]

        async def read() -> dict[str, ModelState]:
            return {name: item.state for name, item in agent.models.items.items()}

        return dict(self.loop.call(read()))

    def act(self, server_id: str, fault: Callable[[SimAgent], None]) -> None:
        agent = self.agents[server_id]

        async def run() -> None:
            fault(agent)

        self.loop.call(run())


def wait_until(what: str, condition: Callable[[], Any], timeout_s: float = WAIT_S,
               state: Callable[[], Any] = lambda: "") -> None:
    """Poll ``condition``; on timeout fail with ``state()`` (what the test saw last)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {state()}")
        time.sleep(0.02)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    controller = ControllerProcess(tmp_path, log_level="INFO")
    assert controller.credentials is not None
    store = CredentialStore(controller.credentials)
    loop = LoopThread()
    pump = HeartbeatPump(0.02).start()
    load_times = ScriptedLoadTimes()
    unloads: list[tuple[str, str]] = []
    agents: dict[str, SimAgent] = {}
    try:
        controller.wait_ready()

        async def start() -> None:
            for index in range(2):
                config = SimAgentConfig(
                    server_id=f"sim-{index:04d}", site_id=f"site-{index:02d}",
                    controller_url=controller.url,
                    token=store.agent_token(f"sim-{index:04d}"),
                    capacity={"memory_mb": 4000.0, "compute": 100.0})
                agent = agents[config.server_id] = SimAgent(config, pump, load_times)
                unload = agent._unload

                async def recorded(command: UnloadCommand, started: float,
                                   agent: SimAgent = agent, unload: Any = unload) -> Any:
                    unloads.append((agent.server_id, command.model_name))
                    return await unload(command, started)

                agent._unload = recorded  # type: ignore[method-assign]
                agent.start()

        loop.call(start())
        yield Cluster(controller, loop, agents, load_times, unloads)
    finally:
        if agents:
            async def stop() -> None:
                for agent in agents.values():
                    await agent.stop()

            loop.call(stop())
        loop.close()
        pump.stop()
        controller.stop()


def _settled_on(cluster: Cluster, server_id: str, variant: str, failed: str) -> bool:
    """p serves (server, variant), every replica ready, records and live agents agree."""
    p = cluster.apps()["p"]
    serving = p["serving"] or {}
    if (serving.get("server_id"), serving.get("variant"), p["status"]) != (
            server_id, variant, "serving"):
        return False
    recorded = set()
    for replica in p["replicas"]:
        if replica["state"] != "ready":
            return False
        recorded.add((replica["server_id"], f"p__{replica['variant']}"))
    held = {(s, name) for s in cluster.agents if s != failed
            for name, state in cluster.held(s).items()}
    return held == recorded and all(
        state is ModelState.READY for s in cluster.agents if s != failed
        for state in cluster.held(s).values())


def test_a_false_alarm_during_an_in_flight_recovery_ends_on_the_target(
        cluster: Cluster) -> None:
    http = cluster.controller.http
    wait_until("both servers up", lambda: [
        (s["state"], s["connected"]) for s in http.get("/v1/servers").json()] == [
        ("up", True), ("up", True)])
    registered = http.post("/v1/apps", params={"wait": "true"}, json={
        "app_id": "p", "family": FAMILY, "variant": LARGE, "max_rate_rps": 1.0,
        "critical": False})
    assert registered.status_code == 201, registered.text
    home = registered.json()["serving"]["server_id"]
    other = next(s for s in cluster.agents if s != home)
    cluster.load_times.seconds = {SMALL: 0.1, LARGE: TARGET_LOAD_S}

    # H crashes: p's interim serves on R and its target loads there.
    cluster.act(home, SimAgent.crash)
    wait_until("the target loading on the recovery server", lambda: cluster.held(other).get(
        f"p__{LARGE}") is ModelState.LOADING)
    assert (cluster.apps()["p"]["serving"] or {}).get("variant") == SMALL

    # R falls silent while its target loads: declared failed, its failover finds no room.
    cluster.act(other, SimAgent.silence)
    wait_until("the recovery server declared failed", lambda: cluster.server_state(
        other) == "failed")
    wait_until("its replicas forgotten", lambda: all(
        r["server_id"] != other for r in cluster.apps()["p"]["replicas"]))
    cluster.act(other, SimAgent.revive)
    wait_until("the recovery server taken back", lambda: cluster.server_state(other) == "up")
    assert cluster.held(other).get(f"p__{LARGE}") is ModelState.LOADING  # still in flight

    wait_until("p on its target with no stray model anywhere",
               lambda: _settled_on(cluster, other, LARGE, failed=home),
               TARGET_LOAD_S + WAIT_S,
               lambda: (cluster.apps()["p"], {s: cluster.held(s) for s in cluster.agents}))
    assert (other, f"p__{LARGE}") not in cluster.unloads
    events = http.get("/v1/events", params={"limit": 1000}).json()
    promoted = [(e["kind"], e["variant"]) for e in events if e["app_id"] == "p"
                and e["kind"] in ("serving", "upgraded", "failback")]
    assert all(variant == LARGE for _, variant in promoted), promoted
