"""Controller <-> agent messages: versioned pydantic models, JSON on one websocket per agent.

Every frame is one JSON object with ``v`` (the protocol version) and ``type`` (the discriminator).
New fields always get defaults, so a newer peer can talk to an older one within a major version;
a frame with a different major ``v`` is refused with an error reply.

Agent -> controller: ``hello`` once per connection, ``result`` for each command, ``triton_down``
/ ``triton_up`` when the agent's Triton dies or is back, ``replica_exited`` the moment a
service-graph replica process it started ends.
Controller -> agent: ``heartbeat_channel`` after each hello (heartbeats then go as UDP datagrams,
``understudy.wire.heartbeat``), ``load``, ``unload``, ``inventory`` commands, ``configure``,
``start_replica`` / ``stop_replica`` (NSPB replica processes of a service graph).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from understudy.wire.artifacts import Manifest

PROTOCOL_VERSION = 1
AGENT_WS_PATH = "/v1/agents/connect"
"""Where the controller accepts agent websockets."""
MODEL_NAME_SEPARATOR = "__"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def model_name(app_id: str, variant: str) -> str:
    """Triton model name of ``variant`` serving ``app_id``: ``<app>__<variant>``."""
    return f"{app_id}{MODEL_NAME_SEPARATOR}{variant}"


def split_model_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`model_name`; ValueError when ``name`` is not one of ours."""
    app_id, sep, variant = name.partition(MODEL_NAME_SEPARATOR)
    if not sep or not app_id or not variant:
        raise ValueError(f"{name!r} is not an <app>__<variant> model name")
    return app_id, variant


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value) or MODEL_NAME_SEPARATOR in value:
        raise ValueError(f"{what} {value!r} must be letters, digits, '_', '.', '-' "
                         f"(not starting with a symbol, no '__')")
    return value


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = PROTOCOL_VERSION


class ModelState(StrEnum):
    """State of one model on an agent."""

    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class InventoryItem(BaseModel):
    """One model the agent's Triton holds (or is loading)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model_name: str
    app_id: str
    variant: str
    state: ModelState
    memory_mb: float | None = None
    load_s: float | None = None


class Endpoints(BaseModel):
    """Where clients reach this server's Triton."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    http: str
    grpc: str
    metrics: str | None = None


class ErrorInfo(BaseModel):
    """Why a command failed; ``retryable`` separates transient from final errors."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    message: str
    retryable: bool = False


class ReplicaInfo(BaseModel):
    """A service-graph replica process an agent runs (``python -m stateful.replica_main``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    graph: str
    node: str
    address: str
    """``host:port`` the replica listens on, as peers elsewhere reach it."""
    pid: int | None = None
    started_at: float | None = None


# --- agent -> controller ------------------------------------------------------------------------


class Hello(_Message):
    """First frame of every connection: identity, capacity, what is loaded."""

    type: Literal["hello"] = "hello"
    server_id: str
    site_id: str
    capacity: dict[str, float]
    server_type: str = "testbed"
    endpoints: Endpoints | None = None
    triton_alive: bool = True
    inventory: list[InventoryItem] = Field(default_factory=list)
    heartbeat_interval_ms: float = 20.0
    boot_id: str = ""
    """Changes every agent start: a new boot id means nothing loaded survived."""
    agent_pid: int | None = None
    replicas: list[ReplicaInfo] = Field(default_factory=list)
    """Graph replica processes running now (the controller stops those it does not know)."""


class CommandResult(_Message):
    """Answer to one command (also the answer to a malformed one, with ``ok`` false)."""

    type: Literal["result"] = "result"
    command_id: str
    ok: bool
    command: str = ""
    model_name: str | None = None
    state: ModelState | None = None
    already: bool = False
    """True when the command found its work already done (idempotent repeat)."""
    error: ErrorInfo | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    inventory: list[InventoryItem] | None = None
    replica: ReplicaInfo | None = None
    """For ``start_replica``: the running replica and its address."""


class TritonDown(_Message):
    """The agent's Triton process exited (sent the moment the agent sees it)."""

    type: Literal["triton_down"] = "triton_down"
    at: float
    exit_code: int | None = None
    restarting: bool = False
    lost_models: list[str] = Field(default_factory=list)


class TritonUp(_Message):
    """Triton is (again) ready; nothing is loaded in a restarted Triton."""

    type: Literal["triton_up"] = "triton_up"
    at: float
    endpoints: Endpoints
    restarts: int = 0


class ReplicaExited(_Message):
    """A replica process the agent started has ended (sent the moment the agent sees it)."""

    type: Literal["replica_exited"] = "replica_exited"
    graph: str
    node: str
    at: float
    exit_code: int | None = None
    requested: bool = False
    """True when a ``stop_replica`` command ended it (not a failure)."""


AgentMessage = Annotated[Hello | CommandResult | TritonDown | TritonUp |
                         ReplicaExited, Field(discriminator="type")]


# --- controller -> agent ------------------------------------------------------------------------


class _Command(_Message):
    command_id: str = Field(min_length=1, max_length=128)


class _ModelCommand(_Command):
    app_id: str
    variant: str

    @field_validator("app_id")
    @classmethod
    def _app(cls, value: str) -> str:
        return _check_name(value, "app id")

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str) -> str:
        return _check_name(value, "variant")

    @property
    def model_name(self) -> str:
        """The Triton model name this command acts on."""
        return model_name(self.app_id, self.variant)


class LoadCommand(_ModelCommand):
    """Materialise the variant's model directory and load it (no-op when already loaded)."""

    type: Literal["load"] = "load"
    urgent: bool = False
    """The load ends an outage (a progressive interim, an app with nothing serving): the agent
    starts it before routine loads (warm backups, targets, fail-backs) and keeps a load slot
    free for it."""
    manifest: Manifest | None = None
    """The variant's manifest, from the controller's artifact store: an agent whose cache holds
    weights with this sha256 loads them without asking the controller anything."""


class UnloadCommand(_ModelCommand):
    """Unload the model (no-op when not loaded)."""

    type: Literal["unload"] = "unload"


class PrefetchCommand(_Command):
    """Put a variant's verified weights in the agent's cache without loading anything.

    The controller sends it for the variants a failover would load first (each family's
    smallest, the interim), so that an interim load during an outage never downloads or hashes
    weights. Disk only: no memory or GPU is used until a load asks for it.
    """

    type: Literal["prefetch"] = "prefetch"
    variant: str
    manifest: Manifest | None = None

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str) -> str:
        return _check_name(value, "variant")


class InventoryCommand(_Command):
    """Report everything loaded, with memory per model."""

    type: Literal["inventory"] = "inventory"


class _ReplicaCommand(_Command):
    graph: str
    node: str

    @field_validator("graph", "node")
    @classmethod
    def _names(cls, value: str) -> str:
        if not _NAME.match(value) or len(value) > 128:
            raise ValueError(f"{value!r} must be letters, digits, '_', '.', '-' (not starting "
                             f"with a symbol, at most 128 characters)")
        return value


class StartReplicaCommand(_ReplicaCommand):
    """Start ``python -m stateful.replica_main --node NODE``; the result carries its address.

    Idempotent: a replica of that graph and node that is already running is reported again.
    """

    type: Literal["start_replica"] = "start_replica"
    observe_dir: str | None = None
    """Write the checker's observations to this directory on the agent's host (testing)."""
    log_level: str = Field("WARNING", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    ready_timeout_s: float = Field(60.0, gt=0, le=600)


class StopReplicaCommand(_ReplicaCommand):
    """Stop a replica: SIGTERM, then SIGKILL after ``timeout_s`` (at once with ``kill``)."""

    type: Literal["stop_replica"] = "stop_replica"
    kill: bool = False
    timeout_s: float = Field(5.0, ge=0, le=60)


class HeartbeatChannel(_Message):
    """Where and how to send heartbeats for this connection (``understudy.wire.heartbeat``).

    Sent once after each ``hello``; the agent beats over UDP to ``host`` (or, when None, the
    host it reached the controller at) and ``port``, with this slot and nonce.
    """

    type: Literal["heartbeat_channel"] = "heartbeat_channel"
    port: int = Field(gt=0, lt=65536)
    tcp_port: int | None = Field(None, gt=0, lt=65536)
    """The liveness stream's TCP port (``controller.heartbeat_monitor``); None: no stream."""
    host: str | None = Field(None, max_length=255)
    slot: int = Field(ge=0, lt=2**32)
    nonce: int = Field(gt=0, lt=2**64)
    heartbeat_interval_ms: float = Field(20.0, gt=0, le=60_000)


class Configure(_Message):
    """Controller-side settings pushed to the agent (heartbeat interval)."""

    type: Literal["configure"] = "configure"
    heartbeat_interval_ms: float | None = Field(None, gt=0, le=60_000)


ControllerMessage = Annotated[LoadCommand | UnloadCommand | InventoryCommand | Configure |
                              HeartbeatChannel | StartReplicaCommand | StopReplicaCommand |
                              PrefetchCommand,
                              Field(discriminator="type")]
AgentCommand = LoadCommand | UnloadCommand | InventoryCommand | StartReplicaCommand | \
    StopReplicaCommand | PrefetchCommand
"""Every controller -> agent frame that expects a ``result``."""

_AGENT_ADAPTER: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)
_CONTROLLER_ADAPTER: TypeAdapter[ControllerMessage] = TypeAdapter(ControllerMessage)


class ProtocolError(ValueError):
    """A frame that is not valid JSON, not a known message, or of another protocol version."""

    def __init__(self, message: str, command_id: str | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id


def _parse(adapter: TypeAdapter, raw: str | bytes) -> object:
    import json

    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ProtocolError("frame is not a JSON object")
    command_id = data.get("command_id") if isinstance(data.get("command_id"), str) else None
    version = data.get("v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} not supported (this peer speaks "
                            f"{PROTOCOL_VERSION})", command_id)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                            for e in exc.errors())
        raise ProtocolError(f"invalid {data.get('type', 'untyped')!s} frame: {details}",
                            command_id) from exc


def parse_agent_message(raw: str | bytes) -> Hello | CommandResult | TritonDown | TritonUp | \
        ReplicaExited:
    """Decode one agent frame (controller side)."""
    return _parse(_AGENT_ADAPTER, raw)  # type: ignore[return-value]


def parse_controller_message(raw: str | bytes) -> LoadCommand | UnloadCommand | \
        InventoryCommand | Configure | HeartbeatChannel | StartReplicaCommand | \
        StopReplicaCommand:
    """Decode one controller frame (agent side)."""
    return _parse(_CONTROLLER_ADAPTER, raw)  # type: ignore[return-value]


def encode(message: BaseModel) -> str:
    """The JSON text of a message (defaults included, so the receiver sees every field)."""
    return message.model_dump_json()
