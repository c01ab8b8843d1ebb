"""What the controller stores in Redis: apps, their replicas, servers, config, events.

Plain pydantic documents (JSON in Redis, never pickle). New fields always get defaults, so a
newer controller reads an older store. The API's request bodies are the ``*Spec`` / ``*Patch``
models with ``extra="forbid"``: unknown fields are a 422, not silently ignored.

Every number is finite (pydantic would store NaN and infinity as ``null``, which no later read
accepts) and every id and list is bounded (``understudy.wire.bounds``): a body or a record that
breaks a bound is refused, and a record in Redis that breaks one is quarantined at load
(``controller.store``).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.model import Role
from understudy.wire.bounds import (
    MAX_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
    NAME_PATTERN,
    Capacities,
    Duration,
    HeartbeatIntervalMs,
    Id,
    ModelPart,
    Token,
    Url,
)
from understudy.wire.protocol import ModelState

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
MAX_FAMILY_CHARS = 64
MAX_LIST = 1000
"""Servers or sites one app may exclude."""
MAX_SLO_MS = 3_600_000.0
MAX_INSTANCES = 8
"""Instances of its variant one app may ask for."""
PROTECTION_PATTERN = r"^(replicas|(replicas\+)?parity:[2-4](:concat)?)$"
MIN_TIME_LIMIT_S = 0.1
"""The ILP's shortest time limit: less is not enough for HiGHS to load the model."""


def now() -> float:
    """Wall-clock seconds since the epoch (what records and events carry)."""
    return time.time()


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class AppSpec(BaseModel):
    """An application registration (the body of ``POST /v1/apps``)."""

    # strict: a body is JSON of the schema's types (0 is not false, "5" not a number).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    app_id: str = Field(pattern=ID_PATTERN, description="unique id; letters, digits, _ . -")
    family: str = Field(min_length=1, max_length=MAX_FAMILY_CHARS, pattern=NAME_PATTERN,
                        description="model family, e.g. efficientnet")
    critical: bool = Field(False, description="member of K: must have a warm backup")
    latency_slo_ms: float | None = Field(None, gt=0, le=MAX_SLO_MS)
    max_rate_rps: float = Field(10.0, gt=0, le=100_000)
    variant: ModelPart | None = Field(None,
                                      description="primary variant (default: most accurate)")
    pinned_server: Id | None = None
    pinned_site: Id | None = None
    excluded_servers: list[Id] = Field(default_factory=list, max_length=MAX_LIST)
    excluded_sites: list[Id] = Field(default_factory=list, max_length=MAX_LIST)
    warm_replicas: int | None = Field(None, ge=1, le=4)
    allow_larger_backups: bool = Field(
        False, description="let warm backups and failover replicas use a variant larger or "
                           "more accurate than the primary variant (default: never above it)")
    artifacts_provided: bool = Field(
        False, description="the agents get this app's model artifacts from elsewhere than the "
                           "controller's artifact store: register it even when that store "
                           "does not hold its primary variant (default: refused, 422)")
    instances: int | None = Field(
        None, ge=1, le=MAX_INSTANCES,
        description="instances of the primary variant serving the app, each on its own "
                    "server; the gateway balances its queries over them (default: k with "
                    "parity:k, else 1)")
    protection: str = Field(
        "replicas", pattern=PROTECTION_PATTERN,
        description="how the app is protected: 'replicas' (warm backups when critical; the "
                    "default), 'parity:k' (k = 2 to 4: one parity model per k instances, on "
                    "a server none of them uses; ':concat' for the concatenation encoder), or "
                    "'replicas+parity:k' (both)")

    @field_validator("app_id")
    @classmethod
    def _no_separator(cls, value: str) -> str:
        if "__" in value:
            raise ValueError("app_id must not contain '__' (it separates app and variant)")
        return value

    @model_validator(mode="after")
    def _instances_per_parity(self) -> AppSpec:
        k = self.parity_k
        if k is not None and self.instances is not None and self.instances % k:
            raise ValueError(f"parity:{k} codes the queries of k = {k} instances per parity "
                             f"model: instances must be a multiple of {k}, got "
                             f"{self.instances}")
        return self

    @property
    def parity_k(self) -> int | None:
        """The k of the app's parity models (None: not protected by parity models)."""
        _, _, parity = self.protection.partition("parity:")
        return int(parity[0]) if parity else None

    @property
    def parity_encoder(self) -> Literal["addition", "concatenation"]:
        """The encoder of the app's parity models."""
        return "concatenation" if self.protection.endswith(":concat") else "addition"

    @property
    def instance_count(self) -> int:
        """How many instances serve the app (the serving replica's included)."""
        if self.instances is not None:
            return self.instances
        return self.parity_k or 1

    @property
    def parity_count(self) -> int:
        """How many parity models protect the app (one per k instances)."""
        k = self.parity_k
        return self.instance_count // k if k else 0

    @property
    def warm_protected(self) -> bool:
        """Whether a critical app gets warm backups (``replicas`` protection)."""
        return self.protection.startswith("replicas")


class Replica(_Doc):
    """One variant of an app on one server (desired, then observed)."""

    server_id: Id
    variant: Id
    role: Role
    state: ModelState = ModelState.LOADING
    accuracy: float = 0.0
    since: float = Field(default_factory=now)
    load_s: Duration | None = None
    """How long the agent's Triton load of this replica took (set when it became ready)."""

    @property
    def key(self) -> tuple[str, str]:
        """(server, variant): at most one replica per key per app."""
        return (self.server_id, self.variant)


class AppStatus(StrEnum):
    """Overall state of an app, as the API reports it."""

    PENDING = "pending"
    SERVING = "serving"
    RECOVERING = "recovering"
    DEGRADED = "degraded"
    """Serving, but on an interim or smaller variant than its primary."""
    UNAVAILABLE = "unavailable"
    """No live replica (unrecoverable for now, or not placed)."""


class AppRecord(_Doc):
    """An app with everything the controller decided and observed for it."""

    spec: AppSpec
    status: AppStatus = AppStatus.PENDING
    replicas: list[Replica] = Field(default_factory=list)
    serving: tuple[Id, Id] | None = None
    """(server, variant) of the replica clients are sent to."""
    home: tuple[Id, Id] | None = None
    """Where the primary belongs when healthy (for fail-back)."""
    reason: str = ""
    registered_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)

    @property
    def app_id(self) -> str:
        """The app's id."""
        return self.spec.app_id

    def replica(self, server_id: str, variant: str) -> Replica | None:
        """The replica at (server, variant), if any."""
        return next((r for r in self.replicas if r.key == (server_id, variant)), None)

    def put_replica(self, replica: Replica) -> Replica:
        """Add a replica, replacing any with the same (server, variant): at most one per key.

        The one replaced is typically being unloaded (a dropped warm backup); the agent runs
        the commands of one model in order, so its unload, then the new load, leave it loaded.
        """
        self.replicas = [r for r in self.replicas if r.key != replica.key]
        self.replicas.append(replica)
        return replica

    def serving_replica(self) -> Replica | None:
        """The replica clients use now."""
        return self.replica(*self.serving) if self.serving else None


class ServerState(StrEnum):
    """A server as the controller sees it."""

    UP = "up"
    FAILED = "failed"
    DRAINING = "draining"
    DRAINED = "drained"


class ServerRecord(_Doc):
    """A server known from its agent's hello."""

    server_id: Id
    site_id: Id
    capacity: Capacities
    server_type: Id = "testbed"
    http: Url | None = None
    grpc: Url | None = None
    state: ServerState = ServerState.UP
    connected: bool = False
    boot_id: Token = ""
    failed_at: float | None = None
    failure_reason: str = ""
    last_hello: float = Field(default_factory=now)


class RuntimeConfig(BaseModel):
    """Settings changeable at run time through ``PUT /v1/config`` (all optional there)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    alpha: float = Field(0.1, ge=0, lt=1, description="share of free capacity kept for cold")
    heartbeat_interval_ms: HeartbeatIntervalMs = Field(
        20.0, description=f"{MIN_HEARTBEAT_MS:g} to {MAX_HEARTBEAT_MS:g} ms")
    heartbeat_misses: int = Field(2, ge=1, le=100)
    solver: Literal["highs", "cbc", "gurobi"] = "highs"
    time_limit_s: float = Field(10.0, ge=MIN_TIME_LIMIT_S, le=3600)
    mip_rel_gap: float = Field(0.01, ge=0, lt=1)
    warm_method: Literal["auto", "decomposed", "full", "heuristic"] = Field(
        "auto", description="how the warm plan is solved: 'auto' solves the ILP (decomposed) "
                            "up to a size and uses FailLite's heuristic above it, so that a "
                            "re-plan of thousands of critical apps takes seconds, not minutes")
    site_independent: bool | Literal["auto"] = Field(
        "auto", description="warm backups in another site than the primary (and than each "
                            "other); 'auto': on when two or more sites have a live server")
    warm_replicas: int = Field(1, ge=1, le=4)
    policy: Literal["understudy", "full-size-warm-k"] = "understudy"
    failback: bool = True
    preempt_warm: bool = Field(
        True, description="when a failure leaves apps with no room, unload the fewest, least "
                          "valuable warm backups of healthy apps so that they recover "
                          "(understudy policy; the warm re-plan restores the backups)")


class ConfigPatch(BaseModel):
    """Body of ``PATCH /v1/config``: any subset of :class:`RuntimeConfig`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    alpha: float | None = Field(None, ge=0, lt=1)
    heartbeat_interval_ms: HeartbeatIntervalMs | None = None
    heartbeat_misses: int | None = Field(None, ge=1, le=100)
    solver: Literal["highs", "cbc", "gurobi"] | None = None
    time_limit_s: float | None = Field(None, ge=MIN_TIME_LIMIT_S, le=3600)
    mip_rel_gap: float | None = Field(None, ge=0, lt=1)
    warm_method: Literal["auto", "decomposed", "full", "heuristic"] | None = None
    site_independent: bool | Literal["auto"] | None = None
    warm_replicas: int | None = Field(None, ge=1, le=4)
    policy: Literal["understudy", "full-size-warm-k"] | None = None
    failback: bool | None = None
    preempt_warm: bool | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> ConfigPatch:
        if not self.model_dump(exclude_none=True):
            raise ValueError("the patch changes nothing")
        return self


class Event(_Doc):
    """A placement change, pushed to clients and kept in the event stream."""

    seq: int = 0
    app_id: str
    kind: str
    """registered, warm_switch, interim_serving, upgraded, failback, unrecoverable, deleted,
    backup_loaded, backup_removed, drained ..."""
    server_id: str | None = None
    endpoint: dict[str, str] | None = None
    model_name: str | None = None
    variant: str | None = None
    role: str | None = None
    accuracy: float | None = None
    reason: str = ""
    failed_server: str | None = None
    failure_at: float | None = None
    """When the failure this event answers was detected (for notification-delay figures)."""
    load_s: float | None = None
    """How long the named replica took to load, when it was loaded for this change (so an
    operator sees how much of a recovery was the load and how much the control plane)."""
    time: float = Field(default_factory=now)
