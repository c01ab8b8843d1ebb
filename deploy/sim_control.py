"""A process of simulated agents, driven by one-line commands (``understudy testbed sim-agents``).

The process runs ``count`` :class:`~deploy.sim_agents.SimAgent` on one asyncio loop, and one
heartbeat sender for them all (``deploy.sim_heartbeats``). Servers are ``sim-0000``,
``sim-0001`` ... (:func:`server_name`; ``--first`` numbers a process's share when several run)
in sites ``site-00`` ... round-robin (:func:`site_name`). It reads commands on stdin, one per
line, and answers each with one JSON line on stdout (``ok``, ``op``, ``servers`` acted on,
``at``: the wall time the fault was injected); stdin closing ends the process. At start it
prints ``{"op": "ready", ...}``.

Commands (TARGET: ``all``, ``site:SITE`` or comma-separated server ids)::

    connect [TARGET]     start agents held back by --hold (default all)
    crash TARGET         abort the websocket (no close frame), stop beating (like SIGKILL)
    silence TARGET       stop beats, probe answers and websocket traffic (like SIGSTOP)
    stall TARGET MS      a silence of MS milliseconds, then everything resumes
    revive TARGET        undo a crash or a silence with the same boot id
    restart TARGET       reconnect with a new boot id and nothing loaded
    status [TARGET]      counters: connected, beating, beats sent, probes answered ...
    quit                 close every connection cleanly and exit
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from deploy.sim_agents import LoadTimes, SimAgent, SimAgentConfig
from deploy.sim_heartbeats import HeartbeatPump

logger = logging.getLogger(__name__)

OPS = ("connect", "crash", "silence", "stall", "revive", "restart", "status", "quit")
_NEEDS_TARGET = ("crash", "silence", "stall", "revive", "restart")


def server_name(index: int) -> str:
    """The id of simulated server number ``index``."""
    return f"sim-{index:04d}"


def site_name(index: int, sites: int) -> str:
    """The site of simulated server number ``index`` (round-robin over ``sites``)."""
    return f"site-{index % sites:02d}"


@dataclass(frozen=True)
class ControlCommand:
    """One parsed command line."""

    op: str
    target: str = "all"
    stall_ms: float = 0.0


def parse_command(line: str) -> ControlCommand:
    """Parse one command line (ValueError with the reason when it is not one)."""
    words = line.split()
    if not words:
        raise ValueError("empty command")
    op = words[0].lower()
    if op not in OPS:
        raise ValueError(f"unknown command {op!r}; known: {', '.join(OPS)}")
    expected = {"stall": 3, "quit": 1}.get(op, 2)
    if op in ("connect", "status") and len(words) == 1:
        return ControlCommand(op)
    if len(words) != expected:
        usage = {"stall": "stall TARGET MS", "quit": "quit"}.get(op, f"{op} TARGET")
        raise ValueError(f"usage: {usage}")
    if op == "quit":
        return ControlCommand(op)
    stall_ms = 0.0
    if op == "stall":
        try:
            stall_ms = float(words[2])
        except ValueError:
            raise ValueError(f"stall needs a number of milliseconds, not {words[2]!r}") from None
        if not 0 < stall_ms <= 3_600_000:
            raise ValueError("stall milliseconds must be in (0, 3600000]")
    return ControlCommand(op, words[1], stall_ms)


def select_servers(target: str, sites: Mapping[str, str]) -> list[str]:
    """The servers (of ``sites``: server -> site) that ``target`` names; ValueError if none."""
    if target == "all":
        chosen = list(sites)
    elif target.startswith("site:"):
        site = target.removeprefix("site:")
        chosen = [server for server, at in sites.items() if at == site]
    else:
        chosen = [name for name in target.split(",") if name]
        unknown = [name for name in chosen if name not in sites]
        if unknown:
            raise ValueError(f"unknown servers {', '.join(unknown[:5])}")
    if not chosen:
        raise ValueError(f"{target!r} names no server of this process")
    return chosen


@dataclass(frozen=True)
class FleetSpec:
    """The simulated servers of one process."""

    controller_url: str
    capacity: dict[str, float]
    count: int
    first: int = 0
    sites: int = 10
    credentials_dir: Path | None = None
    """The controller's credential store: each agent presents its own server's credential
    (None: none, for a controller started with ``--insecure``)."""
    ca_file: Path | None = None
    heartbeat_interval_ms: float = 20.0
    load_time_scale: float = 1.0
    seed: int = 0


class SimFleet:
    """The agents of one process, their heartbeat thread, and the commands that drive them."""

    def __init__(self, spec: FleetSpec) -> None:
        from model_repo.profiles import load_families

        self.spec = spec
        self.pump = HeartbeatPump(spec.heartbeat_interval_ms / 1000.0)
        load_times = LoadTimes(load_families(), spec.load_time_scale)
        rng = random.Random(spec.seed + spec.first)
        self.agents: dict[str, SimAgent] = {}
        store = None
        if spec.credentials_dir is not None:
            from controller.credentials import CredentialStore

            store = CredentialStore(spec.credentials_dir)
        for index in range(spec.first, spec.first + spec.count):
            server_id = server_name(index)
            config = SimAgentConfig(
                server_id=server_id, site_id=site_name(index, spec.sites),
                controller_url=spec.controller_url, capacity=dict(spec.capacity),
                token=store.agent_token(server_id) if store is not None else None,
                ca_file=spec.ca_file, heartbeat_interval_ms=spec.heartbeat_interval_ms)
            self.agents[config.server_id] = SimAgent(config, self.pump, load_times,
                                                     random.Random(rng.random()))
        self.sites = {name: agent.config.site_id for name, agent in self.agents.items()}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, hold: bool) -> None:
        """Start the heartbeat sender, and the agents unless ``hold``."""
        self.pump.start()
        if not hold:
            self.connect(list(self.agents))

    def connect(self, servers: list[str]) -> None:
        """Start the agents not started yet."""
        for server in servers:
            if server not in self._tasks:
                self._tasks[server] = self.agents[server].start()

    async def close(self) -> None:
        """Stop every agent cleanly (close frames), then the heartbeat sender."""
        await asyncio.gather(*(agent.stop() for agent in self.agents.values()))
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self.pump.stop()

    def apply(self, command: ControlCommand) -> dict[str, Any]:
        """Carry out one command; the reply (see the module docstring)."""
        if command.op == "quit":
            return {"ok": True, "op": "quit"}
        servers = select_servers(command.target, self.sites)
        at = time.time()
        if command.op == "status":
            return {"ok": True, "op": "status", **self.status(servers)}
        if command.op == "connect":
            self.connect(servers)
        else:
            actions: dict[str, Callable[[SimAgent], None]] = {
                "crash": SimAgent.crash, "silence": SimAgent.silence,
                "stall": lambda agent: agent.stall(command.stall_ms / 1000.0),
                "revive": SimAgent.revive, "restart": SimAgent.restart}
            act = actions[command.op]
            for server in servers:
                act(self.agents[server])
        return {"ok": True, "op": command.op, "servers": servers, "at": at}

    def status(self, servers: list[str]) -> dict[str, Any]:
        """Counters summed over ``servers``."""
        agents = [self.agents[s] for s in servers]
        totals: dict[str, int] = {}
        for agent in agents:
            for key, value in agent.counters().items():
                totals[key] = totals.get(key, 0) + value
        return {"agents": len(agents), "connected": sum(a.connected for a in agents),
                "beating": sum(a.beating for a in agents), "late_ticks": self.pump.late_ticks,
                "sender_max_late_ms": self.pump.max_late_ms,
                "reports_skipped": self.pump.reports_skipped, **totals}


def _read_lines(stream: TextIO, loop: asyncio.AbstractEventLoop,
                queue: asyncio.Queue[str | None]) -> None:
    """A thread: stdin lines onto the loop's queue; None at end of input."""
    for line in stream:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def run_fleet(spec: FleetSpec, hold: bool = False, commands: TextIO = sys.stdin,
                    replies: TextIO = sys.stdout) -> int:
    """Run one process's fleet until ``quit`` or the end of ``commands``."""
    fleet = SimFleet(spec)

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    fleet.start(hold)
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_read_lines, args=(commands, loop, queue), daemon=True,
                     name="sim-commands").start()
    reply({"op": "ready", "agents": len(fleet.agents), "first": spec.first,
           "servers": list(fleet.agents), "sites": fleet.sites})
    try:
        while (line := await queue.get()) is not None:
            if not line.strip():
                continue
            try:
                command = parse_command(line)
                answer = fleet.apply(command)
            except ValueError as exc:
                reply({"ok": False, "error": str(exc), "line": line.strip()})
                continue
            reply(answer)
            if command.op == "quit":
                break
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(fleet.close(), 10)
    return 0
