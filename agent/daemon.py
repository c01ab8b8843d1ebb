"""The per-server agent: supervises Triton, keeps one websocket to the controller, runs commands.

Life of a connection: ``hello`` (identity, capacity, endpoints, inventory); the controller answers
with the connection's heartbeat channel, and a dedicated thread then sends a UDP heartbeat every
T ms on a fixed schedule and answers the controller's probes (``understudy.wire.heartbeat``), so
neither this loop nor a busy CPU delays it; commands run as independent tasks so a slow load
never delays another command. Results that could
not be delivered because the connection dropped are queued and sent after the next ``hello``.

Triton is kept by ``agent.triton_keeper``: its death is reported to the controller the moment
it happens (``triton_down``), then Triton is restarted or not, as configured. When the
controller is unreachable the agent keeps Triton serving and reconnects with capped exponential
back-off plus jitter (FailLite §4; DESIGN.md "Failure detection").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import subprocess
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from agent.config import AgentConfig
from agent.gpu import choose_device
from agent.load_slots import LoadSlots
from agent.replicas import ReplicaSupervisor
from agent.repository import (
    CACHE_DIR,
    ArtifactFetchError,
    ModelRepository,
    UnknownVariantError,
)
from agent.triton import TritonServer
from agent.triton_config import TritonConfig, TritonError
from agent.triton_keeper import TritonKeeper
from understudy.wire.credentials import CA_FILE_ENV, TOKEN_ENV, bearer, client_ssl_context
from understudy.wire.heartbeat_process import TICK_S, HeartbeatProcess
from understudy.wire.ports import free_ports
from understudy.wire.protocol import (
    CommandResult,
    Configure,
    Endpoints,
    ErrorInfo,
    HeartbeatChannel,
    Hello,
    InventoryCommand,
    InventoryItem,
    LoadCommand,
    ModelState,
    PrefetchCommand,
    ProtocolError,
    ReplicaExited,
    StartReplicaCommand,
    StopReplicaCommand,
    TritonDown,
    TritonUp,
    UnloadCommand,
    encode,
    parse_controller_message,
    split_model_name,
)

logger = logging.getLogger(__name__)

MEMORY_MEASURE_DELAY_S = 0.5
"""How long after a load its worker's memory is measured (see ``_record_memory``)."""

TRY_AGAIN_LATER = 1013
"""Close code of a controller too busy to admit this hello now."""
BUSY_BACKOFF_S = 1.0

OUTBOX_LIMIT = 1000
"""Undelivered results kept across a disconnection (oldest dropped first, with a warning)."""


def _replica_credentials(config: AgentConfig) -> dict[str, str]:
    env = {TOKEN_ENV: config.token} if config.token else {}
    if config.ca_file is not None:
        env[CA_FILE_ENV] = str(config.ca_file.resolve())
    return env


def _error(code: str, exc: BaseException | str, retryable: bool = False) -> ErrorInfo:
    return ErrorInfo(code=code, message=str(exc), retryable=retryable)


class Agent:
    """One server's agent. ``await agent.run()`` until ``agent.stop()``."""

    def __init__(self, config: AgentConfig,
                 triton_factory: Callable[[TritonConfig], TritonServer] = TritonServer) -> None:
        self.config = config
        self.boot_id = uuid.uuid4().hex
        ports = free_ports(3)
        device, gpu = choose_device(config.device)
        triton_config = TritonConfig(
            model_repository=config.run_dir / "repository", work_dir=config.run_dir / "triton",
            http_port=config.http_port or ports[0], grpc_port=config.grpc_port or ports[1],
            metrics_port=config.metrics_port or ports[2],
            model_load_threads=config.model_load_threads, use_runtime=config.use_runtime,
            nice=config.triton_nice, host=config.triton_host,
            advertise_host=config.advertise_host, device=device,
            device_name=gpu.name if gpu is not None else None)
        self.triton = triton_factory(triton_config)
        self.repository = ModelRepository(config.artifacts, triton_config.model_repository,
                                          config.run_dir / CACHE_DIR, token=config.token,
                                          ca_file=config.ca_file,
                                          mirror=config.artifacts_mirror,
                                          backend=self.triton.model_backend, device=device)
        self.models: dict[str, InventoryItem] = {}
        # Service-graph replicas listen where Triton does and are advertised like it.
        self.replicas = ReplicaSupervisor(config.run_dir, bind_host=config.triton_host,
                                          advertise_host=config.advertise_host,
                                          on_exit=self._on_replica_exit,
                                          nice=config.triton_nice,
                                          credentials=_replica_credentials(config))
        self.heartbeat_interval_s = config.heartbeat_interval_ms / 1000.0
        self._locks: dict[str, asyncio.Lock] = {}
        threads = config.model_load_threads
        self.load_slots = LoadSlots(threads, max(1, min(config.routine_load_slots, threads - 1)))
        self._ws: Any = None
        self.heartbeats = HeartbeatProcess()
        """Beats and answers probes from a child process (``understudy.wire.heartbeat_process``)."""
        self._outbox: deque[str] = deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.keeper = TritonKeeper(self.triton, config, spawn=self._spawn,
                                   stopping=self._stop.is_set, on_alive=self._on_alive,
                                   on_down=self._on_triton_down, on_up=self._on_triton_up)

    # --- life cycle ------------------------------------------------------------------------

    @property
    def endpoints(self) -> Endpoints:
        """Where clients reach this server's Triton."""
        c = self.triton.config
        return Endpoints(http=c.advertised(c.http_port), grpc=c.advertised(c.grpc_port),
                         metrics=c.advertised(c.metrics_port))

    async def run(self) -> None:
        """Start Triton, then stay connected to the controller until :meth:`stop`."""
        self.heartbeats.start()  # from this (the main) thread: it dies with the thread
        self.heartbeats.triton(self.keeper.alive)
        self._spawn(self._tick_heartbeats())
        await self.keeper.bring_up()
        try:
            await self._connection_loop()
        finally:
            self.heartbeats.close()
            for task in list(self._tasks):
                task.cancel()
            self.keeper.expected_exit = True
            await self.replicas.close()
            self.repository.close()
            await self.keeper.stop()
            logger.info("agent %s stopped", self.config.server_id)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (safe from a signal handler on the loop)."""
        self._stop.set()
        if self._ws is not None:
            self._spawn(self._ws.close(1001, "agent stopping"))

    def _spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_alive(self, alive: bool) -> None:
        self.heartbeats.triton(alive)  # the heartbeats carry it

    def _on_triton_down(self, process: subprocess.Popen[bytes], code: int,
                        restarting: bool) -> None:
        """Triton exited: its models are gone; the controller hears it at once."""
        lost = sorted(self.models)
        self.models.clear()
        logger.error("Triton (pid %s) exited with code %s; lost %d models; %s", process.pid,
                     code, len(lost), "restarting" if restarting else "not restarting")
        self._spawn(self._send(TritonDown(at=time.time(), exit_code=code,
                                          restarting=restarting, lost_models=lost), keep=True))

    async def _on_triton_up(self, restarts: int) -> None:
        await self._send(TritonUp(at=time.time(), endpoints=self.endpoints,
                                  restarts=restarts), keep=True)

    # --- connection ----------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        delay = self.config.reconnect_initial_s
        headers = bearer(self.config.token)
        url = self.config.websocket_url()
        tls: dict[str, Any] = ({"ssl": client_ssl_context(self.config.ca_file)}
                               if url.startswith("wss://") else {})
        while not self._stop.is_set():
            try:
                async with connect(url, additional_headers=headers, compression=None,
                                   proxy=None, open_timeout=5, ping_interval=None, **tls,
                                   max_size=16 * 1024 * 1024) as ws:
                    delay = self.config.reconnect_initial_s
                    await self._serve(ws)
                    logger.warning("controller closed the connection (code %s %s)",
                                   ws.close_code, ws.close_reason)
                    if ws.close_code == TRY_AGAIN_LATER:
                        # A connect storm: come back after a random share of a second or two,
                        # so the agents refused together do not return together.
                        delay = max(delay, BUSY_BACKOFF_S)
            except InvalidStatus as exc:
                logger.error("controller refused the connection: HTTP %s",
                             exc.response.status_code)
            except (OSError, TimeoutError, WebSocketException) as exc:
                logger.info("controller %s unreachable (%s); retrying in %.2f s", url,
                            type(exc).__name__, delay)
            if self._stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, self.config.reconnect_max_s)

    async def _serve(self, ws: Any) -> None:
        await ws.send(encode(self._hello()))
        self._ws = ws
        logger.info("connected to controller as %s", self.config.server_id)
        while self._outbox:
            await ws.send(self._outbox.popleft())
        try:
            async for raw in ws:
                self._dispatch(raw)
        finally:
            self._ws = None
            self.heartbeats.pause()

    def _start_heartbeats(self, channel: HeartbeatChannel) -> None:
        """Beat on the channel the controller gave this connection (replacing any other)."""
        host = channel.host or _host_of(self.config.controller_url)
        self.heartbeats.channel(host, channel.port, channel.slot, channel.nonce,
                                self.heartbeat_interval_s, channel.tcp_port)
        logger.info("heartbeats to udp %s:%d every %.0f ms", host, channel.port,
                    self.heartbeat_interval_s * 1000)

    def _hello(self) -> Hello:
        return Hello(server_id=self.config.server_id, site_id=self.config.site_id,
                     capacity=self.config.capacity, server_type=self.config.server_type,
                     endpoints=self.endpoints, triton_alive=self.keeper.alive,
                     inventory=list(self.models.values()),
                     heartbeat_interval_ms=self.heartbeat_interval_s * 1000.0,
                     boot_id=self.boot_id, agent_pid=_pid(), replicas=self.replicas.running())

    async def _tick_heartbeats(self) -> None:
        """Tell the heartbeat process this loop runs (a hung agent stops beating)."""
        while True:
            self.heartbeats.tick()
            await asyncio.sleep(TICK_S)

    async def _send(self, message: Any, keep: bool = False) -> None:
        """Send now, or (``keep``) queue for the next connection if there is none."""
        text = encode(message)
        ws = self._ws
        if ws is not None:
            try:
                await ws.send(text)
                return
            except Exception as exc:  # noqa: BLE001 - any send failure means "not delivered"
                logger.info("send failed (%s); %s", exc, "queued" if keep else "dropped")
        if keep:
            if len(self._outbox) >= OUTBOX_LIMIT:
                logger.warning("outbox full; dropping the oldest undelivered message")
                self._outbox.popleft()
            self._outbox.append(text)

    # --- commands ----------------------------------------------------------------------------

    def _dispatch(self, raw: str | bytes) -> None:
        try:
            message = parse_controller_message(raw)
        except ProtocolError as exc:
            logger.warning("bad command: %s", exc)
            self._spawn(self._send(CommandResult(
                command_id=exc.command_id or "", ok=False, command="invalid",
                error=_error("bad_command", exc)), keep=True))
            return
        if isinstance(message, HeartbeatChannel):
            self.heartbeat_interval_s = message.heartbeat_interval_ms / 1000.0
            self._start_heartbeats(message)
            return
        if isinstance(message, Configure):
            if message.heartbeat_interval_ms is not None:
                self.heartbeat_interval_s = message.heartbeat_interval_ms / 1000.0
                self.heartbeats.interval(self.heartbeat_interval_s)
            return
        self._spawn(self._run_command(message))

    def _on_replica_exit(self, message: ReplicaExited) -> None:
        self._spawn(self._send(message, keep=True))

    async def _run_command(self, command: LoadCommand | UnloadCommand | InventoryCommand |
                           StartReplicaCommand | StopReplicaCommand | PrefetchCommand) -> None:
        started = time.perf_counter()
        try:
            if isinstance(command, StartReplicaCommand | StopReplicaCommand):
                result = await self.replicas.handle(command)
            elif isinstance(command, LoadCommand):
                result = await self._load(command, started)
            elif isinstance(command, UnloadCommand):
                result = await self._unload(command, started)
            elif isinstance(command, PrefetchCommand):
                result = await self._prefetch(command, started)
            else:
                result = CommandResult(command_id=command.command_id, ok=True,
                                       command="inventory", inventory=await self.inventory())
        except Exception as exc:  # noqa: BLE001 - one failing command never kills the agent
            logger.exception("command %s failed unexpectedly", command.command_id)
            result = CommandResult(command_id=command.command_id, ok=False,
                                   command=command.type, error=_error("internal", exc, True))
        await self._send(result, keep=True)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _load(self, command: LoadCommand, started: float) -> CommandResult:
        name = command.model_name
        reply = _Reply(command, "load", started)
        if not self.keeper.alive:
            return reply.fail(_error("triton_down", "Triton is not running", retryable=True))
        async with self._lock(name):
            queued = time.perf_counter()
            current = self.models.get(name)
            if current is not None and current.state is ModelState.READY and \
                    await asyncio.to_thread(self.triton.is_model_ready, name):
                return reply.ok(ModelState.READY, already=True, queued_s=queued - started)
            self.models[name] = InventoryItem(model_name=name, app_id=command.app_id,
                                              variant=command.variant, state=ModelState.LOADING)
            try:
                async with self.load_slots.slot(command.urgent):
                    admitted = time.perf_counter()
                    await asyncio.to_thread(self.repository.materialise, name, command.variant,
                                            command.manifest, command.urgent)
                    materialised = time.perf_counter()
                    load_s = await asyncio.to_thread(self.triton.load, name)
            except UnknownVariantError as exc:
                self.models.pop(name, None)
                return reply.fail(_error("unknown_variant", exc))
            except (ArtifactFetchError, TritonError) as exc:
                self.models.pop(name, None)
                await asyncio.to_thread(self.repository.remove, name)
                code = "artifact_fetch" if isinstance(exc, ArtifactFetchError) else "load_failed"
                return reply.fail(_error(code, exc, getattr(exc, "retryable", False)))
            self.models[name] = InventoryItem(
                model_name=name, app_id=command.app_id, variant=command.variant,
                state=ModelState.READY, load_s=load_s)
            # The reply ends an outage for an interim; measuring memory can wait for it.
            self._spawn(self._record_memory(name))
            return reply.ok(ModelState.READY, queued_s=admitted - started,
                            materialise_s=materialised - admitted, load_s=load_s)

    async def _record_memory(self, name: str) -> None:
        """Fill in a freshly loaded model's resident memory (reported in the inventory).

        Measured a little later: the runtime reads the worker's smaps_rollup (~3 ms) in its
        single loop, and a failover's other interims are still being handed to workers.
        """
        await asyncio.sleep(MEMORY_MEASURE_DELAY_S)
        memory = (await asyncio.to_thread(self.triton.model_memory_mb, [name])).get(name)
        current = self.models.get(name)
        if memory is not None and current is not None and current.state is ModelState.READY:
            self.models[name] = current.model_copy(update={"memory_mb": memory})

    async def _prefetch(self, command: PrefetchCommand, started: float) -> CommandResult:
        """Cache a variant's weights ahead of the load that will need them (see the command)."""
        try:
            fetched = await asyncio.to_thread(self.repository.prefetch, command.variant,
                                              command.manifest)
        except UnknownVariantError as exc:
            return CommandResult(command_id=command.command_id, ok=False, command="prefetch",
                                 error=_error("unknown_variant", exc))
        except ArtifactFetchError as exc:
            return CommandResult(command_id=command.command_id, ok=False, command="prefetch",
                                 error=_error("artifact_fetch", exc,
                                              getattr(exc, "retryable", False)))
        if fetched:
            logger.info("prefetched %s", command.variant)
        return CommandResult(command_id=command.command_id, ok=True, command="prefetch",
                             already=not fetched,
                             timings={"total_s": time.perf_counter() - started})

    async def _unload(self, command: UnloadCommand, started: float) -> CommandResult:
        name = command.model_name
        reply = _Reply(command, "unload", started)
        async with self._lock(name):
            queued = time.perf_counter()
            loaded = self.keeper.alive and await asyncio.to_thread(
                self.triton.is_model_ready, name)
            if not loaded:
                self.models.pop(name, None)
                await asyncio.to_thread(self.repository.remove, name)
                return reply.ok(None, already=True, queued_s=queued - started)
            self.models[name] = self.models.get(name, InventoryItem(
                model_name=name, app_id=command.app_id, variant=command.variant,
                state=ModelState.UNLOADING)).model_copy(update={"state": ModelState.UNLOADING})
            try:
                unload_s = await asyncio.to_thread(self.triton.unload, name)
            except TritonError as exc:
                self.models[name] = self.models[name].model_copy(
                    update={"state": ModelState.READY})
                return reply.fail(_error("unload_failed", exc, exc.retryable))
            self.models.pop(name, None)
            await asyncio.to_thread(self.repository.remove, name)
            return reply.ok(None, queued_s=queued - started, unload_s=unload_s)

    async def inventory(self) -> list[InventoryItem]:
        """Reconcile our model table with Triton's index and return it (with memory)."""
        if not self.keeper.alive:
            return []
        try:
            ready = await asyncio.to_thread(self.triton.ready_models)
            memory = await asyncio.to_thread(self.triton.model_memory_mb)
        except TritonError as exc:
            logger.warning("inventory: %s", exc)
            return list(self.models.values())
        for name in ready:
            if name not in self.models:
                with contextlib.suppress(ValueError):
                    app_id, variant = split_model_name(name)
                    self.models[name] = InventoryItem(model_name=name, app_id=app_id,
                                                      variant=variant, state=ModelState.READY)
        for name, item in list(self.models.items()):
            if item.state is ModelState.READY and name not in ready:
                del self.models[name]
            elif name in memory:
                self.models[name] = item.model_copy(update={"memory_mb": memory[name]})
        return list(self.models.values())


class _Reply:
    """Builds a command's result with its timings."""

    def __init__(self, command: LoadCommand | UnloadCommand, kind: str, started: float) -> None:
        self.command = command
        self.kind = kind
        self.started = started

    def ok(self, state: ModelState | None, already: bool = False,
           **timings: float) -> CommandResult:
        return CommandResult(command_id=self.command.command_id, ok=True, command=self.kind,
                             model_name=self.command.model_name, state=state, already=already,
                             timings={**timings, "total_s": time.perf_counter() - self.started})

    def fail(self, error: ErrorInfo) -> CommandResult:
        return CommandResult(command_id=self.command.command_id, ok=False, command=self.kind,
                             model_name=self.command.model_name, state=ModelState.FAILED,
                             error=error,
                             timings={"total_s": time.perf_counter() - self.started})


def _pid() -> int:
    import os

    return os.getpid()


def _host_of(url: str) -> str:
    """The host part of the controller's URL (where its heartbeat port is too)."""
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or "127.0.0.1"
