"""Typed values of service graphs on the cluster: what a client registers, what Redis keeps.

A :class:`GraphRecord` is written before the graph is deployed (write-ahead, status
``deploying``) and again after the deployment and every recovery, with the placement of every
replica process. Every config the graph's manager sends (and every failure it acts on) is
written here first (``config``, ``dead``, ``spares``, ...): a restarted controller rebuilds the
manager and the frontend from that and the replicas the agents still run (see
``controller/graphs/restore.py``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stateful.graph import GraphSpec
from stateful.messages import Mode
from understudy.wire.bounds import Capacity


class GraphStatus(StrEnum):
    """Where a registered graph stands."""

    DEPLOYING = "deploying"
    SERVING = "serving"
    """Every placed replica alive, every stateful operator's backup in sync."""
    RECOVERING = "recovering"
    """A recovery round runs, or a replica is missing (requests wait, none is lost)."""
    FAILED = "failed"
    """The deployment failed (see ``reason``); delete it and register again."""
    RESTORING = "restoring"
    """The controller restarted: rebuilding the manager and frontend from Redis and the agents."""
    INTERRUPTED = "interrupted"
    """The controller stopped (or restarted before the deployment's first config was written):
    the in-process frontend and manager are gone; delete and register the graph again."""


class GraphRegistration(BaseModel):
    """Body of ``POST /v1/graphs``: the graph and how to run it."""

    # strict: JSON of the schema's types (0 is not false); the mode is a string on the wire.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    spec: GraphSpec
    mode: Mode = Field(Mode.NSPB, strict=False)
    spares: int = Field(2, ge=0, le=32)
    """Hot standbys (blank replica processes) kept on live servers."""
    observe: bool = False
    """Record observations for the consistency checker (replica files on the agents' hosts)."""
    noise_seed: int | None = None
    """Inject seeded float non-determinism (a re-execution differs, as on a GPU)."""
    batch_size: int | None = Field(None, ge=1, le=4096)
    """Overrides ``spec.batch_size``."""
    replica_memory_mb: Capacity = 0.0
    """Memory each replica process needs on its server (in the servers' ``memory_mb`` unit):
    a replica only goes where that is left after the apps and the other replicas there. 0:
    not declared (servers with more free memory are still preferred)."""
    replica_compute: Capacity = 0.0
    """Compute share each replica needs, likewise. Both are finite, at most a server's largest
    capacity (``understudy.wire.bounds.MAX_CAPACITY``): an infinite demand fitted nowhere and,
    stored as ``null``, made the graph's record unreadable."""


class ReplicaView(BaseModel):
    """One replica process: where it runs and what it does."""

    node: str
    server_id: str
    site_id: str | None = None
    address: str | None = None
    operator: str | None = None
    """None for a standby."""
    role: str
    """``primary``, ``backup``, ``stateless``, ``standby`` or ``dead``."""
    alive: bool = True


class RecoveryView(BaseModel):
    """One finished recovery (HAMS §IV-E): what failed and what it did about it."""

    recovery: int
    failed: list[str]
    promoted: list[str]
    rolled_back: list[str]
    restarted: list[str]
    duration_ms: float


class GraphRecord(BaseModel):
    """A registered graph as stored in Redis (and shown by the API, with live fields)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    registration: GraphRegistration
    status: GraphStatus = GraphStatus.DEPLOYING
    reason: str = ""
    replicas: list[ReplicaView] = Field(default_factory=list)
    placements: dict[str, dict[str, str | int | None]] = Field(default_factory=dict)
    """Operator -> ``{primary, backup, epoch}`` (node names; servers in ``replicas``)."""
    recoveries: list[RecoveryView] = Field(default_factory=list)
    config_version: int = 0
    requests: int = 0
    """Client requests answered (written at most ``PERSIST_INTERVAL_S`` late)."""
    created_at: float = 0.0
    updated_at: float = 0.0
    # What a restarted controller needs to rebuild the manager and the frontend (written before
    # the manager acts on it).
    config: dict[str, Any] | None = None
    """The newest ``GraphConfig`` the manager sent (JSON)."""
    dead: list[str] = Field(default_factory=list)
    """Replicas the manager declared failed."""
    spares: list[str] = Field(default_factory=list)
    """Blank standbys in the manager's pool."""
    synced: dict[str, tuple[str, int]] = Field(default_factory=dict)
    """Operator -> (backup, epoch) that has applied a state."""
    seen: dict[str, int] = Field(default_factory=dict)
    """Largest seq per operator any freeze reported."""
    request_ids: int = 0
    """Request ids reserved so far: the frontend never uses one above it before writing more, so
    a restarted frontend numbers after every request the replicas may have seen."""
    incarnation: int = 0
    """How many times a restarted controller rebuilt the frontend and manager (their node names
    carry it: replicas keep per-link sequence numbers with the old ones)."""
