"""A deployed service graph as the manager holds it, and its record (what Redis and the API see).

:class:`LiveGraph` bundles a graph's record, its runtime (``ClusterGraph``: the manager and
frontend hosted in the controller) and its launcher (the replicas on the agents).
:func:`snapshot` turns one into a :class:`GraphRecord` — status, placement, the manager's state
a restarted controller needs, replicas and recoveries — without touching anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.graphs.launcher import AgentReplicaLauncher
from controller.graphs.placement import ReplicaDemand
from controller.graphs.records import (
    GraphRecord,
    GraphRegistration,
    GraphStatus,
    RecoveryView,
    ReplicaView,
)
from controller.graphs.runtime import ClusterGraph
from stateful.messages import NoiseSpec, RuntimeOptions


@dataclass
class LiveGraph:
    """A deployed graph: its record, runtime and launcher."""

    record: GraphRecord
    graph: ClusterGraph
    launcher: AgentReplicaLauncher
    plan: dict[str, str]
    """Server of each initial replica (standbys are placed as they start)."""
    partners: dict[str, str] = field(default_factory=dict)
    """Primary <-> backup node of each stateful operator in the initial placement."""
    watcher: asyncio.Task[None] | None = None
    answered: int = 0
    past_recoveries: list[RecoveryView] = field(default_factory=list)
    """Recoveries of earlier incarnations (before a controller restart)."""
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Record writes one at a time, each a snapshot taken when its turn comes (no older
    snapshot overwrites a newer one)."""
    id_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def replica_demand(reg: GraphRegistration) -> ReplicaDemand:
    """What each replica of a registration needs on its server."""
    return ReplicaDemand(memory_mb=reg.replica_memory_mb, compute=reg.replica_compute)


def runtime_options(reg: GraphRegistration) -> RuntimeOptions:
    """The NSPB runtime options of a registration."""
    noise = NoiseSpec(seed=reg.noise_seed) if reg.noise_seed is not None else None
    return RuntimeOptions(mode=reg.mode, observe=reg.observe, noise=noise)


def snapshot(live: LiveGraph, sites: Mapping[str, str]) -> GraphRecord:
    """A live graph's record with its current status, placement, replicas and recoveries."""
    graph, coordinator = live.graph, live.graph.coordinator
    record = live.record.model_copy(deep=True)
    record.requests = live.answered
    config = coordinator.config
    if record.status in (GraphStatus.SERVING, GraphStatus.RECOVERING):
        record.status = GraphStatus.SERVING if graph.replicated() else GraphStatus.RECOVERING
    if config is not None:
        record.config_version = config.version
        record.placements = {op: {"primary": w.primary, "backup": w.backup, "epoch": w.epoch}
                             for op, w in config.placements.items()}
        record.config = config.model_dump(mode="json")
    record.dead = sorted(coordinator.dead)
    record.spares = list(coordinator.spares)
    record.synced = dict(coordinator.synced)
    record.seen = dict(coordinator.seen)
    roles = config.roles if config is not None else {}
    replicas = []
    for node, handle in sorted(live.launcher.handles.items()):
        alive = not handle.exited.done() and node not in coordinator.dead
        op, role = roles.get(node, (None, "standby" if node in coordinator.spares else "idle"))
        replicas.append(ReplicaView(node=node, server_id=handle.server_id,
                                    site_id=sites.get(handle.server_id),
                                    address=handle.address, operator=op,
                                    role=role if alive else "dead", alive=alive))
    record.replicas = replicas
    record.recoveries = live.past_recoveries + [RecoveryView(
        recovery=r.recovery, failed=list(r.failed), promoted=list(r.promoted),
        rolled_back=list(r.rolled_back), restarted=list(r.restarted),
        duration_ms=round((r.finished_at - r.started_at) * 1e3, 3))
        for r in graph.recoveries]
    return record
