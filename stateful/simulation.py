"""Deterministic simulation of a deployed graph: the real cores and models on a virtual clock.

Every replica node, the frontend and the manager run their real core; models run for real
(``ModelHost``) but take *virtual* time (``SimTiming``). Frames cross a seeded network that
delays, drops and reorders them (``NetParams``) under per-pair retransmitting links
(``stateful.link``). Crashes are crash-stop; the manager hears of one ``detect_s`` later, as from
the controller's detector. Given a seed, a run is reproducible event by event, so a test can
crash a replica after *any* step and replay the exact schedule.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from pydantic import BaseModel

from stateful.checker import ConsistencyChecker, ConsistencyReport
from stateful.core.backup import BackupRole
from stateful.core.coordinator import Coordinator, initial_config
from stateful.core.effects import (
    Compute,
    Effect,
    Kill,
    LaunchSpare,
    LoadState,
    Observe,
    RecoveryDone,
    Reply,
    Retrieve,
    Send,
    StartTimer,
    Update,
)
from stateful.core.frontend import ClientRequest, FrontendNode
from stateful.core.replica_node import ReplicaNode
from stateful.graph import FRONTEND, MANAGER, GraphSpec
from stateful.host import ModelHost
from stateful.link import Frame, Links
from stateful.messages import Mode, Payload, RuntimeOptions, decode_frame, encode_frame

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetParams:
    delay_s: tuple[float, float] = (0.0002, 0.002)
    """Uniform one-way delay per frame; independent per frame, so frames reorder."""
    drop: float = 0.0
    rto_s: float = 0.01
    wire: bool = False
    """Round-trip every message through the transport's frame encoding (checks the format)."""


@dataclass(frozen=True)
class SimTiming:
    compute_base_s: float = 0.002
    compute_item_s: float = 0.0001
    update_s: float = 0.0005
    retrieve_s: float = 0.001
    load_s: float = 0.0005
    detect_s: float = 0.005
    spare_launch_s: float = 0.05


@dataclass
class _Node:
    name: str
    core: Any
    links: Links = field(default_factory=Links)
    host: ModelHost | None = None
    lane: deque[Compute | Update | LoadState | Retrieve] = field(default_factory=deque)
    lane_busy: bool = False
    alive: bool = True
    retransmit_armed: bool = False


class SimCluster:
    def __init__(self, graph: GraphSpec, options: RuntimeOptions, *, seed: int = 0,
                 net: NetParams | None = None, timing: SimTiming | None = None,
                 spares: int = 2) -> None:
        # Models run inline on tiny tensors: intra-op threads only add contention.
        torch.set_num_threads(1)
        self.graph = graph
        self.options = options
        self.net = net or NetParams()
        self.timing = timing or SimTiming()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.steps = 0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._tie = itertools.count()
        self._spare_ids = itertools.count()
        self.replies: dict[int, Mapping[str, Payload]] = {}
        self.reply_times: dict[int, float] = {}
        self.submit_times: dict[int, float] = {}
        self.recoveries: list[RecoveryDone] = []
        self.checker = ConsistencyChecker(graph.topology.stateful)
        self.on_step: Callable[[int], None] | None = None
        self.slow: dict[tuple[str, str], float] = {}
        """Extra one-way delay per (source, destination) pair, e.g. a slow state transfer."""
        self.nodes: dict[str, _Node] = {}
        self.coordinator = Coordinator(clock=lambda: self.now)
        self.frontend = FrontendNode()
        self.nodes[MANAGER] = _Node(MANAGER, self.coordinator)
        self.nodes[FRONTEND] = _Node(FRONTEND, self.frontend)
        config = initial_config(graph, options)
        for name in config.nodes:
            self._add_replica(name)
        spare_names = [self._add_replica(f"spare.{next(self._spare_ids)}") for _ in range(spares)]
        self._apply(MANAGER, self.coordinator.deploy(config, spare_names))
        self.run(lambda: self.frontend.config is not None, timeout_s=10.0)

    # -- public API ----------------------------------------------------------------------------

    def submit(self, request: ClientRequest) -> int:
        rid, effects = self.frontend.submit(request)
        self.submit_times[rid] = self.now
        self._apply(FRONTEND, effects)
        return rid

    def node_of(self, op: str, role: str) -> str | None:
        """The node now serving ``op`` as ``primary`` or ``backup`` (manager's view)."""
        config = self.coordinator.config
        if config is None:
            return None
        where = config.placements[op]
        return where.primary if role == "primary" else where.backup

    def can_fail(self, node: str) -> bool:
        """Whether crashing ``node`` now stays inside HAMS's failure model (§III-A).

        A stateful operator survives one replica failure: the other replica must be alive and,
        if the victim is the primary, the backup must hold every state any node treats as
        durable (a just-attached backup that has not caught up does not count).
        """
        target = self.nodes.get(node)
        config = self.coordinator.config
        if target is None or not target.alive or node in (MANAGER, FRONTEND) or config is None:
            return False
        role = config.roles.get(node)
        if role is None or role[1] == "stateless" or self.options.mode is Mode.BARE:
            return True
        op, kind = role
        where = config.placements[op]
        other = where.backup if kind == "primary" else where.primary
        if other is None or not self._alive(other):
            return False
        if kind == "backup":
            return True
        backup = self.nodes[other].core.role
        durable = max((n.core.durability.seq(op) for n in self.nodes.values()
                       if n.alive and hasattr(n.core, "durability")), default=0)
        return (isinstance(backup, BackupRole) and backup.op == op
                and backup.applied_batch >= 0 and backup.applied_seq >= durable)

    def kill(self, node: str) -> None:
        """Crash-stop ``node``; the manager is told ``detect_s`` later."""
        target = self.nodes.get(node)
        if target is None or not target.alive or node in (MANAGER, FRONTEND):
            return
        target.alive = False
        logger.info("t=%.4f: crash %s", self.now, node)
        role = self.coordinator.config.roles.get(node) if self.coordinator.config else None
        op = role[0] if role else None
        self._at(self.timing.detect_s, lambda: self._apply(
            MANAGER, self.coordinator.on_replica_failed(op, node)))

    def run(self, until: Callable[[], bool] | None = None, *, timeout_s: float = 60.0,
            max_steps: int = 10_000_000) -> bool:
        """Process events until ``until()`` holds (True), or the queue empties or time runs out."""
        deadline = self.now + timeout_s
        while self._queue and self.steps < max_steps:
            if until is not None and until():
                return True
            when, _, action = self._queue[0]
            if when > deadline:
                break
            heapq.heappop(self._queue)
            self.now = when
            action()
            self.steps += 1
            if self.on_step is not None:
                self.on_step(self.steps)
        return until() if until is not None else not self._queue

    def idle(self) -> bool:
        """No request outstanding and no recovery in progress."""
        return self.frontend.outstanding == 0 and not self.coordinator.busy

    def report(self) -> ConsistencyReport:
        return self.checker.verify()

    # -- machinery -----------------------------------------------------------------------------

    def _add_replica(self, name: str) -> str:
        core = ReplicaNode(name)
        self.nodes[name] = _Node(name, core, host=ModelHost(self.graph, name, self.options.noise))
        return name

    def _at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._tie), action))

    def _alive(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and node.alive

    def _apply(self, name: str, effects: Iterable[Effect]) -> None:
        node = self.nodes[name]
        if not node.alive:
            return
        for effect in effects:
            if isinstance(effect, Send):
                self._send(node, effect.dst, effect.msg)
            elif isinstance(effect, Compute | Update | LoadState | Retrieve):
                node.lane.append(effect)
                if not node.lane_busy:
                    self._lane_next(node)
            elif isinstance(effect, StartTimer):
                self._at(effect.delay_s, partial(self._deliver_timer, name, effect.key))
            else:
                self._outcome(effect)

    def _outcome(self, effect: Effect) -> None:
        if isinstance(effect, Observe):
            self.checker.record(effect.event)
        elif isinstance(effect, Reply):
            self.replies[effect.request_id] = effect.outputs
            self.reply_times[effect.request_id] = self.now
        elif isinstance(effect, Kill):
            target = self.nodes.get(effect.node)
            if target is not None:
                target.alive = False
        elif isinstance(effect, LaunchSpare):
            for _ in range(effect.count):
                self._at(self.timing.spare_launch_s, self._launch_spare)
        elif isinstance(effect, RecoveryDone):
            self.recoveries.append(effect)

    def _launch_spare(self) -> None:
        name = self._add_replica(f"spare.{next(self._spare_ids)}")
        self._apply(MANAGER, self.coordinator.on_spare_ready(name))

    def _deliver_timer(self, name: str, key: str) -> None:
        node = self.nodes[name]
        if node.alive:
            self._apply(name, node.core.on_timer(key))

    # -- network -----------------------------------------------------------------------------

    def _send(self, node: _Node, dst: str, msg: BaseModel) -> None:
        if self.net.wire:
            msg = decode_frame(encode_frame(node.name, dst, msg)).msg
        self._transmit(node.name, dst, node.links.send(dst, msg))
        self._arm_retransmit(node)

    def _transmit(self, src: str, dst: str, frame: Frame) -> None:
        if self.rng.random() < self.net.drop:
            return
        lo, hi = self.net.delay_s
        delay = self.rng.uniform(lo, hi) + self.slow.get((src, dst), 0.0)
        self._at(delay, lambda: self._receive(src, dst, frame))

    def _receive(self, src: str, dst: str, frame: Frame) -> None:
        node = self.nodes.get(dst)
        if node is None or not node.alive:
            return
        delivered, ack = node.links.receive(src, frame)
        if ack is not None:
            self._transmit(dst, src, ack)
        for msg in delivered:
            if not node.alive:
                return
            self._apply(dst, node.core.on_message(src, msg))

    def _arm_retransmit(self, node: _Node) -> None:
        if not node.retransmit_armed:
            node.retransmit_armed = True
            self._at(self.net.rto_s, lambda: self._retransmit(node))

    def _retransmit(self, node: _Node) -> None:
        node.retransmit_armed = False
        if not node.alive:
            return
        pending = node.links.pending()
        for dst, frames in pending.items():
            if not self._alive(dst):
                node.links.forget(dst)  # like a refused connection: the peer is gone
                continue
            for frame in frames:
                self._transmit(node.name, dst, frame)
        if node.links.pending():
            self._arm_retransmit(node)

    # -- model lane (executor contract in stateful.core.effects) -----------------------------

    def _lane_next(self, node: _Node) -> None:
        node.lane_busy = False
        core = node.core
        while node.lane and node.alive:
            effect = node.lane.popleft()
            if effect.generation != core.generation:
                continue
            host = node.host
            assert host is not None
            t = self.timing
            name = node.name
            if isinstance(effect, Retrieve):
                done = partial(core.on_retrieved, effect.generation, effect.batch_no,
                               host.retrieve())
                self._at(t.retrieve_s, partial(self._retrieved, name, done))
                continue
            node.lane_busy = True
            if isinstance(effect, LoadState):
                host.load(effect.op, effect.tensors)
                self._at(t.load_s, partial(self._lane_next, node))
            elif isinstance(effect, Compute):
                outputs = host.compute(effect.batch_no, effect.items)
                dur = t.compute_base_s + t.compute_item_s * len(effect.items)
                self._at(dur, partial(self._done, node, partial(
                    core.on_compute_done, effect.generation, effect.batch_no, outputs)))
            else:
                host.update(effect.batch_no)
                self._at(t.update_s, partial(self._done, node, partial(
                    core.on_update_done, effect.generation, effect.batch_no)))
            return

    def _retrieved(self, name: str, done: Callable[[], list[Effect]]) -> None:
        if self._alive(name):
            self._apply(name, done())

    def _done(self, node: _Node, callback: Callable[[], list[Effect]]) -> None:
        if not node.alive:
            return
        self._apply(node.name, callback())
        self._lane_next(node)
