"""The pure parts of the simulated agents: commands, targets, inventory, command results."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from deploy.sim_agents import LoadTimes, SimAgent, SimAgentConfig, SimModels
from deploy.sim_control import (
    ControlCommand,
    parse_command,
    select_servers,
    server_name,
    site_name,
)
from deploy.sim_heartbeats import BeatEntry, HeartbeatPump
from model_repo.profiles import load_families
from understudy.wire.protocol import (
    InventoryCommand,
    LoadCommand,
    ModelState,
    PrefetchCommand,
    StartReplicaCommand,
    UnloadCommand,
    encode,
)


@pytest.mark.parametrize(("line", "expected"), [
    ("connect", ControlCommand("connect")),
    ("status", ControlCommand("status")),
    ("status site:site-01", ControlCommand("status", "site:site-01")),
    ("crash sim-0001", ControlCommand("crash", "sim-0001")),
    ("  SILENCE   sim-0001,sim-0002 \n", ControlCommand("silence", "sim-0001,sim-0002")),
    ("stall all 40", ControlCommand("stall", "all", 40.0)),
    ("revive site:site-03", ControlCommand("revive", "site:site-03")),
    ("restart sim-0007", ControlCommand("restart", "sim-0007")),
    ("quit", ControlCommand("quit")),
])
def test_commands_parse(line: str, expected: ControlCommand) -> None:
    assert parse_command(line) == expected


@pytest.mark.parametrize(("line", "message"), [
    ("", "empty"), ("explode all", "unknown command"), ("crash", "usage: crash TARGET"),
    ("stall all", "usage: stall TARGET MS"), ("stall all soon", "number of milliseconds"),
    ("stall all -5", "must be in"), ("quit now", "usage: quit"),
])
def test_bad_commands_say_why(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_command(line)


SITES = {server_name(i): site_name(i, 3) for i in range(6)}


def test_servers_are_spread_over_sites_round_robin() -> None:
    assert list(SITES.items())[:4] == [("sim-0000", "site-00"), ("sim-0001", "site-01"),
                                       ("sim-0002", "site-02"), ("sim-0003", "site-00")]


@pytest.mark.parametrize(("target", "chosen"), [
    ("all", list(SITES)), ("site:site-01", ["sim-0001", "sim-0004"]),
    ("sim-0002,sim-0005", ["sim-0002", "sim-0005"]),
])
def test_targets_select_servers(target: str, chosen: list[str]) -> None:
    assert select_servers(target, SITES) == chosen


@pytest.mark.parametrize("target", ["site:site-09", "sim-0100", "sim-0001,nope"])
def test_targets_naming_nothing_here_are_refused(target: str) -> None:
    with pytest.raises(ValueError):
        select_servers(target, SITES)


def test_load_times_come_from_the_profiles() -> None:
    families = load_families()
    times = LoadTimes(families)
    small, large = families["convnext"].smallest, families["convnext"].largest
    assert times.variant(small.name) == small
    assert times.variant("no-such-variant") is None
    assert 0 < times.load_s(small) < times.load_s(large)
    assert LoadTimes(families, scale=0.5).load_s(large) == pytest.approx(times.load_s(large) / 2)


def _load(app: str = "a1", variant: str = "mobilenet_v3_small", command_id: str = "c1",
          urgent: bool = False) -> LoadCommand:
    return LoadCommand(command_id=command_id, app_id=app, variant=variant, urgent=urgent)


def test_the_inventory_follows_loads_and_unloads() -> None:
    models = SimModels()
    variant = load_families()["mobilenet_v3"].smallest
    command = _load(variant=variant.name)
    models.loading(command)
    assert not models.ready("a1__mobilenet_v3_small")
    assert [i.state for i in models.inventory()] == [ModelState.LOADING]
    models.loaded(command, variant, 0.3)
    [item] = models.inventory()
    assert (item.state, item.memory_mb, item.load_s) == (ModelState.READY, variant.memory_mb, 0.3)
    unload = UnloadCommand(command_id="c2", app_id="a1", variant=variant.name)
    assert models.unloading(unload)
    assert models.inventory()[0].state is ModelState.UNLOADING
    models.unloaded(unload)
    assert models.inventory() == []
    assert not models.unloading(unload)


class _Socket:
    """Stands in for the websocket: records what the agent sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))


def _agent() -> tuple[SimAgent, _Socket]:
    config = SimAgentConfig("sim-0000", "site-00", "http://127.0.0.1:1", {"memory_mb": 1000.0})
    agent = SimAgent(config, HeartbeatPump(0.02), LoadTimes(load_families(), scale=0.001))
    socket = _Socket()
    agent._ws = socket
    return agent, socket


async def _results(agent: SimAgent, socket: _Socket, *commands: Any) -> list[dict[str, Any]]:
    expected = len(socket.sent) + len(commands)
    for command in commands:
        agent._dispatch(encode(command))
    while len(socket.sent) < expected:
        await asyncio.sleep(0.001)
    return socket.sent


def test_commands_get_the_results_a_real_agent_gives() -> None:
    agent, socket = _agent()
    results = asyncio.run(_results(
        agent, socket, _load(command_id="load"),
        _load(variant="no_such_variant", command_id="bad"),
        PrefetchCommand(command_id="prefetch", variant="mobilenet_v3_large"),
        StartReplicaCommand(command_id="replica", graph="g", node="n")))
    by_id = {r["command_id"]: r for r in results}
    assert by_id["load"]["ok"] and by_id["load"]["state"] == "ready"
    assert by_id["load"]["model_name"] == "a1__mobilenet_v3_small"
    assert by_id["load"]["timings"]["load_s"] > 0
    assert (by_id["bad"]["ok"], by_id["bad"]["error"]["code"]) == (False, "unknown_variant")
    assert by_id["prefetch"]["ok"] and not by_id["prefetch"]["already"]
    assert by_id["replica"]["error"]["code"] == "unsupported"


def test_repeated_commands_are_idempotent_and_the_inventory_truthful() -> None:
    agent, socket = _agent()

    async def scenario() -> list[dict[str, Any]]:
        await _results(agent, socket, _load(command_id="first"))
        await _results(agent, socket, _load(command_id="again"))
        await _results(agent, socket, InventoryCommand(command_id="inventory"))
        unload = UnloadCommand(command_id="unload", app_id="a1", variant="mobilenet_v3_small")
        await _results(agent, socket, unload)
        return await _results(agent, socket, unload.model_copy(update={"command_id": "u2"}))

    by_id = {r["command_id"]: r for r in asyncio.run(scenario())}
    assert not by_id["first"]["already"] and by_id["again"]["already"]
    [item] = by_id["inventory"]["inventory"]
    assert (item["model_name"], item["state"]) == ("a1__mobilenet_v3_small", "ready")
    assert not by_id["unload"]["already"] and by_id["u2"]["already"]
    assert agent.models.inventory() == []


def test_silence_holds_every_frame_until_revived() -> None:
    agent, socket = _agent()
    agent._entry = BeatEntry("sim-0000", ("127.0.0.1", 9), 1, 7)

    async def scenario() -> tuple[int, bool, int, bool]:
        agent.silence()
        agent._dispatch(encode(InventoryCommand(command_id="inventory")))
        await asyncio.sleep(0.05)
        held, beating_while_silent = len(socket.sent), agent._entry.beating  # type: ignore[union-attr]
        agent.revive()
        while not socket.sent:
            await asyncio.sleep(0.001)
        return held, beating_while_silent, len(socket.sent), agent._entry.beating  # type: ignore[union-attr]

    assert asyncio.run(scenario()) == (0, False, 1, True)


def test_a_restart_is_a_new_boot_with_nothing_loaded() -> None:
    agent, socket = _agent()
    asyncio.run(_results(agent, socket, _load()))
    boot = agent.boot_id

    async def restart() -> None:
        agent._ws = None  # nothing to abort
        agent.restart()

    asyncio.run(restart())
    assert agent.boot_id != boot and agent.models.inventory() == []
    assert agent._hello().boot_id == agent.boot_id and agent._hello().endpoints is None
