"""Keeps the server's Triton running: starts it, notices its exit, restarts it as configured.

Triton is watched by a thread blocked in ``waitpid`` (``agent.triton``): its exit reaches the
keeper the moment it happens, on the agent's event loop, and the keeper tells the agent
(``on_down``: what to report to the controller), then starts Triton again, backing off, within
the restart policy (``AgentConfig.triton_restart``, ``max_restarts``). A start that fails, at
boot or after a crash, is tried again the same way. The agent hears when Triton is up again
(``on_up``) and whenever it comes or goes (``on_alive``: the heartbeats carry it).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent.config import AgentConfig, RestartPolicy
from agent.triton import TritonServer
from agent.triton_config import TritonError, TritonStartError
from understudy.wire.ports import free_ports

logger = logging.getLogger(__name__)

STABLE_RUN_S = 60.0
"""A Triton that ran this long before it exited starts the restart count again."""
QUICK_EXIT_S = 10.0
"""A Triton that exited this soon after it was ready restarts on fresh ports."""


class TritonKeeper:
    """Starts ``triton``, reacts to its exits, and restarts it within the policy.

    ``spawn`` runs a coroutine as one of the agent's tasks; ``stopping`` says whether the agent
    is stopping (no restart then). ``on_down(process, code, restarting)`` hears of an exit of
    a Triton that was running; ``on_up(restarts)`` of a restart that brought it back.
    """

    def __init__(self, triton: TritonServer, config: AgentConfig, *,
                 spawn: Callable[[Awaitable[Any]], object],
                 stopping: Callable[[], bool],
                 on_alive: Callable[[bool], None],
                 on_down: Callable[[subprocess.Popen[bytes], int, bool], None],
                 on_up: Callable[[int], Awaitable[None]]) -> None:
        self.triton = triton
        self.config = config
        self._spawn = spawn
        self._stopping = stopping
        self._on_alive = on_alive
        self._on_down = on_down
        self._on_up = on_up
        self.restarts = 0
        self.restarting = False
        """A restart loop runs (:meth:`restart`): one at a time."""
        self.started_at = time.monotonic()
        self.expected_exit = False
        """The agent stops Triton itself: its exit is no crash."""
        self._alive = False
        self._loop: asyncio.AbstractEventLoop | None = None
        triton.on_exit = self._exited_threadsafe

    @property
    def alive(self) -> bool:
        """Whether Triton is up and serving (as far as the keeper knows)."""
        return self._alive

    @alive.setter
    def alive(self, alive: bool) -> None:
        self._alive = alive
        self._on_alive(alive)

    async def bring_up(self) -> None:
        """The first start; when it fails, the restart policy's retries in the background."""
        self._loop = asyncio.get_running_loop()
        if not await self.start():
            # e.g. its runtime's torch import outlasted the start timeout on a busy machine
            self._spawn(self.restart())

    async def start(self) -> bool:
        """Start Triton; False (logged) when it did not come up or died as it did."""
        try:
            await asyncio.to_thread(self.triton.start)
            if not self.triton.alive():  # an exit reported before this was ready is ignored
                raise TritonStartError("tritonserver exited right after it was ready")
        except TritonError as exc:
            logger.error("Triton did not start: %s", exc)
            self.alive = False
            self.fresh_ports()
            return False
        self.alive = True
        self.expected_exit = False
        self.started_at = time.monotonic()
        return True

    async def stop(self) -> None:
        """Stop Triton for good (the agent is stopping)."""
        self.expected_exit = True
        await asyncio.to_thread(self.triton.stop)

    def fresh_ports(self) -> None:
        """New ports for the next start where they were chosen automatically.

        A port found free at start-up can be taken meanwhile (any outgoing connection may get
        it as its ephemeral port); Triton then exits at once with "already in use", and
        restarting on the same ports would fail the same way every time. The new endpoints
        reach the controller in ``triton_up`` (or the next hello).
        """
        c = self.config
        fresh = free_ports(3)
        update = {name: port for name, port, fixed in (
            ("http_port", fresh[0], c.http_port), ("grpc_port", fresh[1], c.grpc_port),
            ("metrics_port", fresh[2], c.metrics_port)) if not fixed}
        if update:
            self.triton.config = self.triton.config.model_copy(update=update)

    def _exited_threadsafe(self, process: Any, code: int) -> None:
        """Triton's watcher thread calls this the moment Triton exits."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.exited, process, code)

    def exited(self, process: subprocess.Popen[bytes], code: int) -> None:
        """Triton (``process``) exited with ``code``: tell the agent, restart if allowed."""
        if process is not self.triton.process or self.expected_exit or not self.alive:
            return  # not ready yet: the start that launched it fails, and retries
        self.alive = False
        ran_s = time.monotonic() - self.started_at
        if ran_s >= STABLE_RUN_S:
            self.restarts = 0  # a crash loop is what the limit stops, not crashes days apart
        elif ran_s < QUICK_EXIT_S:
            # Dead right after it became ready: likely a port another process took between
            # our pick and Triton's bind of its last listener; the same ports would clash again.
            self.fresh_ports()
        restarting = self.may_restart()
        self._on_down(process, code, restarting)
        if restarting:
            self._spawn(self.restart())

    def may_restart(self) -> bool:
        """Whether the restart policy allows one more start of Triton now."""
        return (self.config.triton_restart is RestartPolicy.ALWAYS
                and self.restarts < self.config.max_restarts and not self._stopping())

    async def restart(self) -> None:
        """Start Triton again, backing off, until it runs or the policy allows no more tries.

        A start that fails is tried again like a crash: otherwise one slow start (at boot,
        or after a crash) would leave the server without Triton for good.
        """
        if self.restarting:
            return
        self.restarting = True
        try:
            await self._restart_until_running()
        finally:
            self.restarting = False

    async def _restart_until_running(self) -> None:
        while self.may_restart():
            self.restarts += 1
            await asyncio.sleep(self.config.restart_backoff_s * self.restarts)
            if self._stopping():
                return
            await asyncio.to_thread(self.triton.kill)  # the runtime too, for a clean slate
            if await self.start():
                await self._on_up(self.restarts)
                return
        if not self._stopping():  # the agent stopping ends the loop too: no error then
            logger.error("Triton is not running and will not be started again (%d restarts, "
                         "policy %s)", self.restarts, self.config.triton_restart.value)
