"""``LocalGraph`` as the controller hosts it: write-ahead configs, restorable after a restart.

The controller hosts each graph's manager (``Coordinator``) and frontend in its own process
(``controller/graphs/manager.py``). Two things make that survive a controller crash:

* **Write-ahead.** Before the manager's effects go out, any that act on its state — a config
  (``Configure``/``Resume``), the start of a recovery (``Freeze``), a fence (``Kill``) — wait
  until ``persist()`` wrote the manager's state to Redis; later effects queue behind them, so
  every link keeps its order. Redis therefore always holds the newest config any replica may
  have installed, and every replica the manager acted on as failed.
* **Adoption.** :meth:`ClusterGraph.adopt` starts a new incarnation of the manager and frontend
  over replica processes that kept running (the agents keep them across a controller restart):
  it republishes the stored config under a higher version with the new manager and frontend,
  fails the replicas that are gone (a recovery promotes their backups, as if the detector had
  seen them fail) and numbers requests after every id the old frontend may have used.

The new manager and frontend take new node names (``manager~1``, ``frontend~1``): replicas keep
per-link sequence numbers (``stateful.link``) with the old ones, and a new node numbering from 1
would have its frames taken for duplicates.

The frontend's checker observations go to ``<observe dir>/<frontend node>.jsonl`` like the
replicas' (not process memory), so the consistency checker still sees the requests of the
previous incarnation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import IO

from stateful.checker import observation_to_json
from stateful.core.effects import Effect, Kill, Observe, Send
from stateful.core.frontend import FrontendNode
from stateful.graph import FRONTEND, MANAGER
from stateful.messages import Configure, Freeze, GraphConfig, Resume
from stateful.nodehost import NodeHost
from stateful.runtime import LocalGraph, ReplicaHandle

logger = logging.getLogger(__name__)

PERSIST_TRIES = 5
"""Writes tried before the manager acts anyway (availability over the write-ahead rule while
Redis restarts; logged as an error)."""
PERSIST_RETRY_S = 0.2


def needs_record(effects: Sequence[Effect]) -> bool:
    """Whether the manager acts on state a restarted controller must know (see module doc)."""
    return any(isinstance(e, Kill)
               or (isinstance(e, Send) and isinstance(e.msg, Configure | Resume | Freeze))
               for e in effects)


@dataclass
class ClusterGraph(LocalGraph):
    """A ``LocalGraph`` whose manager writes ahead, and which can adopt running replicas."""

    incarnation: int = 0
    persist: Callable[[], Awaitable[None]] | None = None
    """Writes the manager's state (the graph's record) to Redis."""

    def __post_init__(self) -> None:
        super().__post_init__()
        suffix = f"~{self.incarnation}" if self.incarnation else ""
        self.manager_node = MANAGER + suffix
        self.frontend_node = FRONTEND + suffix
        self._names = {MANAGER: self.manager_node, FRONTEND: self.frontend_node}
        if self.incarnation:
            self.coordinator.node = self.manager_node
            self.frontend = FrontendNode(self.frontend_node)
            self.node_host = NodeHost(self.host, outcome=self._outcome)
            if self.options.link_mbps:
                self.node_host.transport.link_bps = self.options.link_mbps * 1e6
            self.node_host.add(self.manager_node, self.coordinator)
            self.node_host.add(self.frontend_node, self.frontend)
        self._outbox: deque[tuple[str, list[Effect]]] = deque()
        self._flushing = False
        self._observations: IO[str] | None = None

    # -- write-ahead -------------------------------------------------------------------------

    def _apply(self, name: str, effects: list[Effect]) -> None:
        name = self._names.get(name, name)
        if not self._outbox and (self.persist is None or not needs_record(effects)):
            self.node_host.apply(name, effects)
            return
        self._outbox.append((name, effects))
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        """Write the manager's state, then let out what was queued before the write."""
        try:
            while self._outbox:
                count = len(self._outbox)
                if any(needs_record(effects) for _, effects in itertools.islice(
                        self._outbox, count)):
                    await self._persist()
                for _ in range(count):
                    name, effects = self._outbox.popleft()
                    self.node_host.apply(name, effects)
        finally:
            self._flushing = False

    async def _persist(self) -> None:
        assert self.persist is not None  # noqa: S101 - needs_record checked it
        for attempt in range(PERSIST_TRIES):
            try:
                await self.persist()
                return
            except Exception:  # noqa: BLE001 - Redis restarting: retry, then act anyway
                logger.warning("graph %s: writing the manager's state failed (try %d)",
                               self.graph.name, attempt + 1, exc_info=True)
                await asyncio.sleep(PERSIST_RETRY_S)
        logger.error("graph %s: acting on a config Redis does not have (a controller restart "
                     "now could not rebuild it)", self.graph.name)

    # -- observations ------------------------------------------------------------------------

    def _outcome(self, node: str, effect: Effect) -> None:
        if isinstance(effect, Observe) and self.observe_dir is not None:
            if self._observations is None:
                self.observe_dir.mkdir(parents=True, exist_ok=True)
                path = self.observe_dir / f"{self.frontend_node}.jsonl"
                self._observations = path.open("a", encoding="utf-8")
            # One write per line, as the replicas do: a crash never tears a record.
            self._observations.write(observation_to_json(effect.event) + "\n")
            self._observations.flush()
            return
        super()._outcome(node, effect)

    async def stop(self) -> None:
        await super().stop()
        if self._observations is not None:
            self._observations.close()
            self._observations = None

    # -- adoption after a controller restart -------------------------------------------------

    async def adopt(self, config: GraphConfig, handles: Collection[ReplicaHandle],
                    spares: Sequence[str], failed: Sequence[tuple[str | None, str]], *,
                    next_spare: int, first_request: int) -> None:
        """Take over running replicas with this incarnation's manager and frontend.

        ``config`` is the newest one the previous manager sent (its version is bumped, so every
        replica installs this one); ``failed`` are the role holders that are gone (or that the
        previous manager declared failed): they go through one recovery, as a server failure
        would. Requests are numbered from ``first_request + 1``.
        """
        address = await self.node_host.start()
        old = {config.manager, config.frontend, MANAGER, FRONTEND}
        addresses = {n: a for n, a in config.addresses.items() if n not in old}
        addresses.update({h.node: h.address for h in handles})
        addresses[self.manager_node] = addresses[self.frontend_node] = address
        self.node_host.learn(addresses)
        for handle in handles:
            self.handles[handle.node] = handle
            self._spawn(self._watch(handle))
        self._spare_ids = itertools.count(next_spare)
        self.frontend.next_id = self.frontend.watermark = first_request
        config = config.evolve(version=config.version + 1, addresses=addresses,
                               manager=self.manager_node, frontend=self.frontend_node)
        logger.info("graph %s: incarnation %d adopts %s (config v%d), failing %s",
                    self.graph.name, self.incarnation, sorted(h.node for h in handles),
                    config.version, [n for _, n in failed])
        self._apply(MANAGER, self.coordinator.deploy(config, spares))
        if failed:
            self.on_replicas_failed(list(failed))
        await self._until(lambda: self.frontend.config is not None, 30.0)

    def add_spares(self, count: int) -> None:
        """Start ``count`` more standbys (the pool lost them while no controller watched)."""
        for _ in range(count):
            self._spawn(self._launch_spare())
