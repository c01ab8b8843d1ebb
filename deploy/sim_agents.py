"""Simulated agents: the real agent protocol over real sockets, without Triton.

For control-plane tests at a scale no testbed reaches (a thousand servers on one machine). Each
:class:`SimAgent` keeps one websocket to the controller (``hello``, then commands and their
``result``), like ``agent.daemon.Agent``, and its heartbeats go over UDP from the process's one
heartbeat sender (``deploy.sim_heartbeats``). Many agents share one asyncio loop; run several
processes for more (``understudy testbed sim-agents``, driven by ``deploy.sim_control``).

What a simulated server does with each command:

* ``load``: waits for a load slot (``agent.load_slots.LoadSlots``, 3 slots, one kept for urgent
  loads, as the real agent), sleeps the variant's profiled load time (``sim.timing``: the
  measured time where the profiles have one, else the profiler's fitted line), and reports the
  model ready with its profiled memory; a model already ready is ``already``;
* ``unload``: :data:`UNLOAD_S`, then gone (``already`` when it was not loaded);
* ``prefetch``: remembered as cached (``already`` the second time); ``inventory``: every model
  with its state and memory; replica commands: refused (``unsupported``);
* an unknown variant fails with ``unknown_variant``, as on a real agent.

Faults (:meth:`SimAgent.crash`, ``silence``, ``stall``, ``revive``, ``restart``) act like their
real counterparts: a crash aborts the TCP connection (no close frame) and stops the beats; a
silence stops beats, probe answers and all websocket traffic but keeps the connection open (a
stopped box); a stall is a silence that ends by itself; revive undoes a crash or a silence with
the same boot (nothing restarted: the server was alive all along); restart reconnects with a new
boot id and nothing loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.load_slots import LoadSlots
from deploy.sim_heartbeats import BeatEntry, HeartbeatPump
from policies.model import Family, Variant
from understudy.wire.credentials import bearer, client_ssl_context
from understudy.wire.protocol import (
    AGENT_WS_PATH,
    CommandResult,
    Configure,
    ErrorInfo,
    HeartbeatChannel,
    Hello,
    InventoryCommand,
    InventoryItem,
    LoadCommand,
    ModelState,
    PrefetchCommand,
    ProtocolError,
    UnloadCommand,
    encode,
    parse_controller_message,
)

logger = logging.getLogger(__name__)

UNLOAD_S = 0.02
LOAD_SLOTS, ROUTINE_LOAD_SLOTS = 3, 2
"""The real agent's defaults (``agent.config.AgentConfig``)."""
TRY_AGAIN_LATER = 1013
BUSY_BACKOFF_S = 1.0
RECONNECT_INITIAL_S, RECONNECT_MAX_S = 0.05, 2.0
OUTBOX_LIMIT = 1000


class LoadTimes:
    """Each variant's simulated load time, from the profiles (``sim.timing``)."""

    def __init__(self, families: Mapping[str, Family], scale: float = 1.0) -> None:
        from sim.timing import profiler_fit, timing_for

        self.timing = timing_for(families, "profiles", profiler_fit())
        self.scale = scale
        self.variants: dict[str, Variant] = {v.name: v for f in families.values()
                                             for v in f.variants}

    def variant(self, name: str) -> Variant | None:
        """The profiled variant of that name (None when no family has it)."""
        return self.variants.get(name)

    def load_s(self, variant: Variant) -> float:
        """Seconds a load of ``variant`` takes (times ``scale``)."""
        return self.timing.load_ms(variant) / 1000.0 * self.scale


class SimModels:
    """What one simulated server holds: its inventory, as a real agent reports it."""

    def __init__(self) -> None:
        self.items: dict[str, InventoryItem] = {}
        self.cached: set[str] = set()

    def ready(self, name: str) -> bool:
        """Whether the model is loaded."""
        item = self.items.get(name)
        return item is not None and item.state is ModelState.READY

    def loading(self, command: LoadCommand) -> None:
        """A load of the command's model began."""
        self.items[command.model_name] = InventoryItem(
            model_name=command.model_name, app_id=command.app_id, variant=command.variant,
            state=ModelState.LOADING)

    def loaded(self, command: LoadCommand, variant: Variant, load_s: float) -> None:
        """The load finished: the model is ready, with the variant's profiled memory."""
        self.items[command.model_name] = InventoryItem(
            model_name=command.model_name, app_id=command.app_id, variant=command.variant,
            state=ModelState.READY, memory_mb=variant.memory_mb, load_s=load_s)
        self.cached.add(command.variant)

    def unloading(self, command: UnloadCommand) -> bool:
        """An unload began; False when the model was not there (nothing to do)."""
        item = self.items.get(command.model_name)
        if item is None:
            return False
        self.items[command.model_name] = item.model_copy(update={"state": ModelState.UNLOADING})
        return True

    def unloaded(self, command: UnloadCommand) -> None:
        """The model is gone."""
        self.items.pop(command.model_name, None)

    def inventory(self) -> list[InventoryItem]:
        """Every model, as the ``hello`` and the ``inventory`` command report them."""
        return list(self.items.values())


@dataclass(frozen=True)
class SimAgentConfig:
    """One simulated server."""

    server_id: str
    site_id: str
    controller_url: str
    capacity: dict[str, float]
    token: str | None = None
    """This server's agent credential."""
    ca_file: Path | None = None
    """CA that verifies a ``wss://`` controller."""
    server_type: str = "sim"
    heartbeat_interval_ms: float = 20.0

    def websocket_url(self) -> str:
        """The controller's agent endpoint as a ws:// URL."""
        url = self.controller_url.rstrip("/")
        for http, ws in (("http://", "ws://"), ("https://", "wss://")):
            if url.startswith(http):
                url = ws + url[len(http):]
        return url if url.endswith(AGENT_WS_PATH) else url + AGENT_WS_PATH


def _error(code: str, message: str, retryable: bool = False) -> ErrorInfo:
    return ErrorInfo(code=code, message=message, retryable=retryable)


class SimAgent:
    """One simulated server's agent. ``await run()`` until :meth:`stop`."""

    def __init__(self, config: SimAgentConfig, pump: HeartbeatPump, load_times: LoadTimes,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.pump = pump
        self.load_times = load_times
        self.rng = rng or random.Random()
        self.boot_id = uuid.uuid4().hex
        self.models = SimModels()
        self.slots = LoadSlots(LOAD_SLOTS, ROUTINE_LOAD_SLOTS)
        self.connects = 0
        self.refusals = 0
        """Connections the controller closed with 1013 (busy) or refused."""
        self.commands = 0
        self._ws: Any = None
        self._entry: BeatEntry | None = None
        self._online = asyncio.Event()
        """Set while the agent should be connected (cleared by a crash)."""
        self._awake = asyncio.Event()
        """Set while the agent runs (cleared by a silence or a stall: nothing moves)."""
        self._awake.set()
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._outbox: deque[str] = deque()
        self._stall: asyncio.TimerHandle | None = None

    # --- state --------------------------------------------------------------------------------

    @property
    def server_id(self) -> str:
        """This server's id."""
        return self.config.server_id

    @property
    def connected(self) -> bool:
        """Whether its websocket is open now."""
        return self._ws is not None

    @property
    def beating(self) -> bool:
        """Whether it holds a heartbeat channel and beats on it now."""
        entry = self._entry
        return entry is not None and entry.beating

    def counters(self) -> dict[str, int]:
        """Beats sent and probes answered or ignored (current channel, sender's last report)."""
        sent, acks, ignored = self.pump.counters.get(self.server_id, (0, 0, 0))
        return {"sent": sent, "acks": acks, "probes_ignored": ignored,
                "connects": self.connects, "refusals": self.refusals,
                "commands": self.commands, "models": len(self.models.items)}

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Begin connecting (the returned task runs until :meth:`stop`)."""
        self._online.set()
        return asyncio.ensure_future(self.run())

    async def run(self) -> None:
        """Stay connected while online; reconnect with jittered back-off."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

        delay = RECONNECT_INITIAL_S
        headers = bearer(self.config.token)
        url = self.config.websocket_url()
        tls: dict[str, Any] = ({"ssl": client_ssl_context(self.config.ca_file)}
                               if url.startswith("wss://") else {})
        while not self._stopping:
            await self._online.wait()
            if self._stopping:
                break
            try:
                async with connect(url, additional_headers=headers, **tls,
                                   compression=None, proxy=None, open_timeout=10,
                                   ping_interval=None, max_size=16 * 1024 * 1024) as ws:
                    delay = RECONNECT_INITIAL_S
                    with contextlib.suppress(ConnectionClosed):
                        await self._serve(ws)
                    if ws.close_code == TRY_AGAIN_LATER:  # a connect storm: come back later
                        self.refusals += 1
                        delay = max(delay, BUSY_BACKOFF_S)
            except InvalidStatus as exc:
                self.refusals += 1
                logger.warning("%s: controller refused the connection: HTTP %s",
                               self.server_id, exc.response.status_code)
            except (OSError, TimeoutError, WebSocketException) as exc:
                logger.info("%s: controller unreachable (%s)", self.server_id,
                            type(exc).__name__)
            if self._stopping:
                break
            if self._online.is_set():  # not a crash: back off before the next try
                await asyncio.sleep(delay * self.rng.uniform(0.5, 1.5))
                delay = min(delay * 2, RECONNECT_MAX_S)

    async def stop(self) -> None:
        """Close the connection cleanly and stop (the end of a run, not a fault)."""
        self._stopping = True
        self._online.set()
        self._awake.set()
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(1001, "simulated agent stopping")
        self._stop_beating()
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, ws: Any) -> None:
        if not self._online.is_set():
            return  # crashed while connecting
        self._ws = ws  # before any await: a crash from now on aborts this connection
        self.connects += 1
        try:
            await ws.send(encode(self._hello()))
            while self._outbox:
                await ws.send(self._outbox.popleft())
            async for raw in ws:
                await self._awake.wait()
                if self._ws is not ws:
                    break  # crashed meanwhile
                self._dispatch(raw)
        finally:
            if self._ws is ws:
                self._ws = None
            self._stop_beating()

    def _hello(self) -> Hello:
        return Hello(server_id=self.server_id, site_id=self.config.site_id,
                     capacity=self.config.capacity, server_type=self.config.server_type,
                     endpoints=None, triton_alive=True, inventory=self.models.inventory(),
                     heartbeat_interval_ms=self.pump.interval_s * 1000.0,
                     boot_id=self.boot_id, agent_pid=os.getpid())

    def _start_beating(self, channel: HeartbeatChannel) -> None:
        self._stop_beating()
        host = channel.host or urlsplit(self.config.controller_url).hostname or "127.0.0.1"
        self.pump.interval_s = channel.heartbeat_interval_ms / 1000.0
        self._entry = self.pump.add(BeatEntry(self.server_id, (host, channel.port),
                                              channel.slot, channel.nonce,
                                              beating=self._awake.is_set(),
                                              tcp_port=channel.tcp_port))

    def _stop_beating(self, goodbye: bool = True) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            self.pump.remove(entry, goodbye)

    # --- faults -------------------------------------------------------------------------------

    def crash(self) -> None:
        """Abort the connection (no close frame) and stop beating until revive or restart."""
        self._online.clear()
        self._stop_beating(goodbye=False)  # the liveness stream closes without a goodbye
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.transport.abort()

    def silence(self) -> None:
        """Stop beats, probe answers and websocket traffic; the connection stays open."""
        self._cancel_stall()
        self._awake.clear()
        if self._entry is not None:
            self.pump.set_beating(self._entry, False)

    def stall(self, seconds: float) -> None:
        """A silence that ends by itself after ``seconds``."""
        self.silence()
        self._stall = asyncio.get_running_loop().call_later(seconds, self._wake)

    def revive(self) -> None:
        """Undo a crash (reconnect, same boot) or a silence (resume on the open connection)."""
        self._wake()
        self._online.set()

    def restart(self) -> None:
        """A new boot: nothing loaded, a fresh connection (the old one, if any, is dropped)."""
        self.crash()
        for task in list(self._tasks):
            task.cancel()
        self.boot_id = uuid.uuid4().hex
        self.models = SimModels()
        self.slots = LoadSlots(LOAD_SLOTS, ROUTINE_LOAD_SLOTS)
        self._locks.clear()
        self._outbox.clear()
        self.revive()

    def _wake(self) -> None:
        self._cancel_stall()
        self._awake.set()
        if self._entry is not None:
            self.pump.set_beating(self._entry, True)

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    # --- commands -----------------------------------------------------------------------------

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, raw: str | bytes) -> None:
        try:
            message = parse_controller_message(raw)
        except ProtocolError as exc:
            self._spawn(self._send(CommandResult(command_id=exc.command_id or "", ok=False,
                                                 command="invalid",
                                                 error=_error("bad_command", str(exc)))))
            return
        if isinstance(message, HeartbeatChannel):
            self._start_beating(message)
        elif isinstance(message, Configure):
            if message.heartbeat_interval_ms is not None:
                self.pump.interval_s = message.heartbeat_interval_ms / 1000.0
        else:
            self.commands += 1
            self._spawn(self._run_command(message))

    async def _send(self, message: Any) -> None:
        """Send now (waiting while silenced), or queue for the next connection."""
        text = encode(message)
        await self._awake.wait()
        ws = self._ws
        if ws is not None:
            try:
                await ws.send(text)
                return
            except Exception:  # noqa: BLE001 - any send failure means "not delivered"
                logger.debug("%s: send failed; queued", self.server_id)
        if len(self._outbox) >= OUTBOX_LIMIT:
            self._outbox.popleft()
        self._outbox.append(text)

    async def _run_command(self, command: Any) -> None:
        started = time.perf_counter()
        if isinstance(command, LoadCommand):
            result = await self._load(command, started)
        elif isinstance(command, UnloadCommand):
            result = await self._unload(command, started)
        elif isinstance(command, PrefetchCommand):
            known = self.load_times.variant(command.variant) is not None
            already = command.variant in self.models.cached
            self.models.cached.add(command.variant)
            result = CommandResult(
                command_id=command.command_id, ok=known, command="prefetch", already=already,
                error=None if known else _error("unknown_variant",
                                                f"no profile has variant {command.variant!r}"))
        elif isinstance(command, InventoryCommand):
            result = CommandResult(command_id=command.command_id, ok=True, command="inventory",
                                   inventory=self.models.inventory())
        else:
            result = CommandResult(command_id=command.command_id, ok=False,
                                   command=command.type,
                                   error=_error("unsupported", "a simulated agent runs no "
                                                "service-graph replicas"))
        await self._send(result)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _load(self, command: LoadCommand, started: float) -> CommandResult:
        name = command.model_name

        def reply(ok: bool, state: ModelState, already: bool = False,
                  error: ErrorInfo | None = None, **timings: float) -> CommandResult:
            return CommandResult(command_id=command.command_id, ok=ok, command="load",
                                 model_name=name, state=state, already=already, error=error,
                                 timings={**timings, "total_s": time.perf_counter() - started})

        variant = self.load_times.variant(command.variant)
        if variant is None:
            return reply(False, ModelState.FAILED, error=_error(
                "unknown_variant", f"no profile has variant {command.variant!r}"))
        async with self._lock(name):
            if self.models.ready(name):
                return reply(True, ModelState.READY, already=True)
            self.models.loading(command)
            async with self.slots.slot(command.urgent):
                admitted = time.perf_counter()
                load_s = self.load_times.load_s(variant)
                await asyncio.sleep(load_s)
            self.models.loaded(command, variant, load_s)
            return reply(True, ModelState.READY, queued_s=admitted - started, load_s=load_s)

    async def _unload(self, command: UnloadCommand, started: float) -> CommandResult:
        async with self._lock(command.model_name):
            already = not self.models.unloading(command)
            if not already:
                await asyncio.sleep(UNLOAD_S)
                self.models.unloaded(command)
        return CommandResult(command_id=command.command_id, ok=True, command="unload",
                             model_name=command.model_name, already=already,
                             timings={"total_s": time.perf_counter() - started})
