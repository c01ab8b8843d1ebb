"""Service-graph replica processes on this server: start, stop, kill, and report their deaths.

The controller's graph manager places the NSPB replicas of a service graph on servers and asks
their agents to start them (``start_replica``). The supervisor runs ``python -m
stateful.replica_main --node NODE`` and answers once the process printed ``READY host:port`` —
the handshake of ``stateful.runtime.SubprocessLauncher`` — with the address rewritten to the
agent's advertised host, so peers on other servers can reach it. A replica's exit is reported at
once through ``on_exit`` (the agent sends ``replica_exited``): that is the per-process failure
signal, next to the controller's detector that fails every replica of a server that goes silent.

Replicas are bound to the agent's life, like Triton: each replica asks Linux to SIGKILL it when
the agent dies (``PR_SET_PDEATHSIG``, first thing in ``stateful.replica_main``, which then exits if
its parent is no longer this agent: no window where a dead agent leaves a replica running; the
forking thread lives as long as the agent) and stays in the agent's process group. A replica
outliving its agent would keep serving a graph whose controller already promoted its backup.
Its niceness (data plane) comes from ``nice -n``, which execs it: with no ``preexec_fn``,
CPython starts it with vfork instead of a fork that copies the agent's page tables while holding
the GIL (``bench/spawn_stall.py`` measures what that costs the agent's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from understudy.wire.protocol import (
    CommandResult,
    ErrorInfo,
    ReplicaExited,
    ReplicaInfo,
    StartReplicaCommand,
    StopReplicaCommand,
)

logger = logging.getLogger(__name__)

READY = "READY"
"""First stdout word of a replica that listens (``stateful.replica_main.READY``; not imported, so
the agent does not load torch)."""
REPO_ROOT = Path(__file__).resolve().parents[1]


class ReplicaStartError(RuntimeError):
    """A replica process exited or stayed silent before it printed ``READY``."""


@dataclass
class _Running:
    info: ReplicaInfo
    process: subprocess.Popen[bytes]
    stopping: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)


def _read_line(process: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
               future: asyncio.Future[bytes]) -> None:
    """In a thread: the replica's first stdout line (EOF when it dies or is killed)."""
    assert process.stdout is not None  # noqa: S101 - we asked for a pipe
    line = process.stdout.readline()

    def deliver() -> None:
        if not future.done():
            future.set_result(line)

    loop.call_soon_threadsafe(deliver)


@dataclass
class ReplicaSupervisor:
    """The replica processes of one agent, keyed by (graph, node).

    The event loop never forks or waits: under CPU pressure a fork-and-exec can take tens of
    milliseconds, and the agent's heartbeats (every 20 ms, failed after 50 ms of silence) share
    its loop. Processes are spawned on one long-lived thread — it must outlive them, because the
    parent-death signal fires when the *thread* that forked a child ends — and each is watched by
    a thread blocked in ``waitpid``, as Triton is.
    """

    run_dir: Path
    bind_host: str = "127.0.0.1"
    advertise_host: str | None = None
    on_exit: Callable[[ReplicaExited], None] | None = None
    nice: int = 0
    """Absolute niceness of the replicas (0: inherit): data plane, like Triton, so heartbeats
    never queue behind a replica importing torch or computing a batch."""
    python: str = sys.executable
    credentials: dict[str, str] = field(default_factory=dict)
    """``UNDERSTUDY_TOKEN`` and ``UNDERSTUDY_CA_FILE`` for the replicas: a graph's Triton
    operators resolve apps with the SDK under their agent's credential."""

    def __post_init__(self) -> None:
        self._running: dict[tuple[str, str], _Running] = {}
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="replica-spawner")

    def running(self) -> list[ReplicaInfo]:
        """Replicas alive now (for the agent's hello)."""
        return [r.info for r in self._running.values() if r.process.poll() is None]

    async def start(self, command: StartReplicaCommand) -> tuple[ReplicaInfo, bool]:
        """Start the replica (or find it running); returns its info and whether it already ran."""
        key = (command.graph, command.node)
        async with self._starting.setdefault(key, asyncio.Lock()):
            current = self._running.get(key)
            if current is not None and current.process.poll() is None:
                return current.info, True
            loop = asyncio.get_running_loop()
            process = await loop.run_in_executor(self._spawner, self._spawn, command)
            try:
                address = await self._handshake(command, process)
            except ReplicaStartError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.to_thread(process.wait)
                raise
            info = ReplicaInfo(graph=command.graph, node=command.node, address=address,
                               pid=process.pid, started_at=time.time())
            running = _Running(info, process)
            self._running[key] = running
            threading.Thread(target=self._watch, args=(running, loop), daemon=True,
                             name=f"replica-watch-{process.pid}").start()
            logger.info("replica %s/%s pid %d ready at %s", command.graph, command.node,
                        process.pid, address)
            return info, False

    def _spawn(self, command: StartReplicaCommand) -> subprocess.Popen[bytes]:
        """On the spawner thread."""
        args = [*self._nice_prefix(), self.python, "-m", "stateful.replica_main",
                "--node", command.node, "--host", self.bind_host,
                "--log-level", command.log_level, "--parent-pid", str(os.getpid())]
        if command.observe_dir:
            args += ["--observe-dir", command.observe_dir]
        env = {**os.environ, **self.credentials}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        log_dir = self.run_dir / "replicas" / command.graph
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / f"{command.node}.log").open("ab") as log:
            return subprocess.Popen(  # noqa: S603 - our own module and arguments
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
                cwd=str(REPO_ROOT))  # no preexec_fn: vfork, the replica sets itself up

    def _nice_prefix(self) -> list[str]:
        """``nice -n ADJ``: the replica runs at ``self.nice`` from its first instruction.

        Its interpreter start alone is ~50 ms of CPU before any Python of ours could lower its
        priority, at the agent's raised one, next to the heartbeats, times every replica a
        graph deployment starts at once. ``nice`` (coreutils) is relative and adds one small
        exec; a ``preexec_fn`` would instead make CPython fork (see the module doc).
        """
        if not self.nice:
            return []
        adjust = self.nice - os.getpriority(os.PRIO_PROCESS, 0)
        return ["nice", "-n", str(adjust)] if adjust else []

    async def _handshake(self, command: StartReplicaCommand,
                         process: subprocess.Popen[bytes]) -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        threading.Thread(target=_read_line, args=(process, loop, future), daemon=True,
                         name=f"replica-ready-{process.pid}").start()
        try:
            line = await asyncio.wait_for(asyncio.shield(future), command.ready_timeout_s)
        except TimeoutError:
            line = b""
        word, _, address = line.decode(errors="replace").strip().partition(" ")
        host, sep, port = address.rpartition(":")
        if word != READY or not sep or not port.isdigit():
            log = self.run_dir / "replicas" / command.graph / f"{command.node}.log"
            raise ReplicaStartError(f"replica {command.graph}/{command.node} did not become "
                                    f"ready within {command.ready_timeout_s:g} s (see {log})")
        # The replica reports the address it bound; peers elsewhere need the advertised one.
        return f"{self.advertise_host or host}:{port}"

    def _watch(self, running: _Running, loop: asyncio.AbstractEventLoop) -> None:
        """On a watcher thread: drain stdout (a full pipe would block the replica), wait."""
        process = running.process
        assert process.stdout is not None  # noqa: S101
        while process.stdout.read(65536):
            pass
        code = process.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed: the agent is exiting
            loop.call_soon_threadsafe(self._exited, running, code)

    def _exited(self, running: _Running, code: int) -> None:
        running.exited.set()
        info = running.info
        key = (info.graph, info.node)
        if self._running.get(key) is running:
            del self._running[key]
        level = logging.INFO if running.stopping else logging.WARNING
        logger.log(level, "replica %s/%s pid %s exited with code %s%s", info.graph, info.node,
                   running.process.pid, code, " (stopped)" if running.stopping else "")
        if self.on_exit is not None:
            self.on_exit(ReplicaExited(graph=info.graph, node=info.node, at=time.time(),
                                       exit_code=code, requested=running.stopping))

    async def stop(self, graph: str, node: str, kill: bool = False,
                   timeout_s: float = 5.0) -> bool:
        """Stop a replica (SIGTERM, then SIGKILL after ``timeout_s``); False if none ran."""
        async with self._starting.setdefault((graph, node), asyncio.Lock()):
            pass  # a stop that overtook the start of the same replica waits for it
        running = self._running.get((graph, node))
        if running is None or running.process.poll() is not None:
            return False
        running.stopping = True
        logger.info("stopping replica %s/%s pid %s with %s", graph, node, running.process.pid,
                    "SIGKILL" if kill else f"SIGTERM (SIGKILL after {timeout_s:g} s)")
        with contextlib.suppress(ProcessLookupError):
            if kill:
                running.process.kill()
            else:
                running.process.terminate()
        try:
            await asyncio.wait_for(running.exited.wait(), timeout_s if not kill else 10.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                running.process.kill()
            await running.exited.wait()
        return True

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop every replica (agent shutdown)."""
        await asyncio.gather(*(self.stop(g, n, timeout_s=timeout_s)
                               for g, n in list(self._running)), return_exceptions=True)
        self._spawner.shutdown(wait=False)

    async def handle(self, command: StartReplicaCommand | StopReplicaCommand) -> CommandResult:
        """Run a replica command and build its result (errors become failed results)."""
        started = time.perf_counter()
        try:
            if isinstance(command, StartReplicaCommand):
                info, already = await self.start(command)
                return CommandResult(command_id=command.command_id, ok=True,
                                     command=command.type, already=already, replica=info,
                                     timings={"total_s": time.perf_counter() - started})
            stopped = await self.stop(command.graph, command.node, command.kill,
                                      command.timeout_s)
            return CommandResult(command_id=command.command_id, ok=True, command=command.type,
                                 already=not stopped,
                                 timings={"total_s": time.perf_counter() - started})
        except (ReplicaStartError, OSError) as exc:
            # Retryable: another server (or a second try) may well start it.
            return CommandResult(command_id=command.command_id, ok=False, command=command.type,
                                 error=ErrorInfo(code="replica_start", message=str(exc),
                                                 retryable=True),
                                 timings={"total_s": time.perf_counter() - started})
