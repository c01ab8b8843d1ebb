"""Runs protocol cores in a real process: transport, timers and the model executor threads.

``NodeHost`` owns one event loop's worth of cores (a replica process hosts one; the runtime
hosts the manager and the frontend). Cores are only ever called on the loop thread. Model
effects follow the executor contract of ``stateful.core.effects``: one *model* thread runs
``Compute``/``Update``/``LoadState`` in order; ``Retrieve`` is queued on the model thread as a
marker that, once reached, hands ``get_state`` to a second *state* thread and lets the next
compute start at once — the non-stop retrieval of HAMS §IV-B (the copy runs while the next
batch computes; the core never issues the next ``Update`` before the copy is done).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from stateful.core.effects import (
    Compute,
    Effect,
    LoadState,
    Retrieve,
    Send,
    StartTimer,
    Update,
)
from stateful.transport import Transport

if TYPE_CHECKING:  # torch, for the model hosts: a controller hosting no model never loads it
    from stateful.host import ModelHost

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 1.0
"""Longest a stop waits for the transport's connections to close."""

Outcome = Callable[[str, Effect], None]
"""Called for effects the host does not carry out itself (Reply, Observe, Kill, ...)."""


class ModelExecutor:
    """The two worker threads of one replica node."""

    def __init__(self, owner: NodeHost, name: str, host: ModelHost) -> None:
        self.owner = owner
        self.name = name
        self.host = host
        self.model = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-model")
        self.state = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-state")

    def submit(self, effect: Compute | Update | LoadState | Retrieve) -> None:
        self.model.submit(self._run, effect)

    def _current(self, generation: int) -> bool:
        return bool(generation == self.owner.cores[self.name].generation)

    def _run(self, effect: Compute | Update | LoadState | Retrieve) -> None:
        """On the model thread."""
        if not self._current(effect.generation):
            return
        try:
            if isinstance(effect, Retrieve):
                self.state.submit(self._retrieve, effect)
            elif isinstance(effect, LoadState):
                self.host.load(effect.op, effect.tensors)
            elif isinstance(effect, Compute):
                outputs = self.host.compute(effect.batch_no, effect.items)
                self._back(lambda core: core.on_compute_done(effect.generation, effect.batch_no,
                                                             outputs))
            else:
                self.host.update(effect.batch_no)
                self._back(lambda core: core.on_update_done(effect.generation, effect.batch_no))
        except Exception:
            self._fatal(effect)

    def _retrieve(self, effect: Retrieve) -> None:
        """On the state thread, concurrently with the next compute."""
        try:
            tensors = self.host.retrieve()
        except Exception:
            self._fatal(effect)
            return
        self._back(lambda core: core.on_retrieved(effect.generation, effect.batch_no, tensors))

    def _back(self, call: Callable[[Any], list[Effect]]) -> None:
        self.owner.loop.call_soon_threadsafe(self.owner.complete, self.name, call)

    def _fatal(self, effect: object) -> None:
        # A model that cannot run a batch cannot produce its outputs or its state: the replica
        # stops, and the manager's failure handling takes over (promotion or restart).
        logger.exception("%s: %s failed; exiting so the manager fails this replica over",
                         self.name, type(effect).__name__)
        os._exit(70)

    def close(self) -> None:
        self.model.shutdown(wait=False, cancel_futures=True)
        self.state.shutdown(wait=False, cancel_futures=True)


class NodeHost:
    def __init__(self, transport_host: str = "127.0.0.1", port: int = 0,
                 outcome: Outcome | None = None) -> None:
        self.transport = Transport(self._deliver, host=transport_host, port=port)
        self.cores: dict[str, Any] = {}
        self.executors: dict[str, ModelExecutor] = {}
        self.outcome = outcome or (lambda node, effect: None)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("NodeHost.start() was not awaited")
        return self._loop

    async def start(self) -> str:
        self._loop = asyncio.get_running_loop()
        return await self.transport.start()

    def add(self, name: str, core: Any) -> None:
        self.cores[name] = core
        self.transport.add_node(name)

    def attach_model(self, name: str, host: ModelHost) -> None:
        self.executors[name] = ModelExecutor(self, name, host)

    def learn(self, addresses: dict[str, str]) -> None:
        self.transport.learn(addresses)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the model threads and close every connection (bounded: a stop must not hang)."""
        for executor in self.executors.values():
            executor.close()
        try:
            await asyncio.wait_for(self.transport.close(), timeout_s)
        except TimeoutError:
            logger.warning("closing the transport took over %g s; leaving it", timeout_s)

    # -- driving the cores -------------------------------------------------------------------

    def _deliver(self, src: str, dst: str, msg: object) -> None:
        core = self.cores.get(dst)
        if core is not None:
            self.apply(dst, core.on_message(src, msg))

    def complete(self, name: str, call: Callable[[Any], list[Effect]]) -> None:
        self.apply(name, call(self.cores[name]))

    def timer(self, name: str, key: str) -> None:
        self.apply(name, self.cores[name].on_timer(key))

    def apply(self, name: str, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self.transport.send(name, effect.dst, effect.msg)
            elif isinstance(effect, Compute | Update | LoadState | Retrieve):
                executor = self.executors.get(name)
                if executor is None:
                    logger.error("%s: model effect without a model host", name)
                    continue
                executor.submit(effect)
            elif isinstance(effect, StartTimer):
                self.loop.call_later(effect.delay_s, self.timer, name, effect.key)
            else:
                self.outcome(name, effect)
