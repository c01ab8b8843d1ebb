"""Controller <-> agent messages: versioned pydantic models, JSON on one websocket per agent.

Every frame is one JSON object with ``v`` (the protocol version) and ``type`` (the discriminator).
New fields always get defaults, so a newer peer can talk to an older one within a major version;
a frame with a different major ``v`` is refused with an error reply.

Every field is bounded (``understudy.wire.bounds``): finite numbers in sane ranges, ids of 1 to
128 safe characters, bounded lists, frames of at most :data:`MAX_FRAME_BYTES`. A frame that breaks
a bound is refused whole (:class:`ProtocolError`); a frame of a type this peer does not know is
an :class:`UnknownMessageError`, which a receiver may skip (a newer peer's message).

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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from understudy.wire.artifacts import Manifest
from understudy.wire.bounds import (
    MAX_ID_CHARS,
    MODEL_NAME_SEPARATOR,
    NAME_PATTERN,
    Capacities,
    Capacity,
    Count,
    Duration,
    ExitCode,
    HeartbeatIntervalMs,
    Id,
    Message,
    ModelName,
    ModelPart,
    Pid,
    Text,
    Timestamp,
    Token,
    Url,
    check_name,
)

PROTOCOL_VERSION = 1
AGENT_WS_PATH = "/v1/agents/connect"
"""Where the controller accepts agent websockets."""
_NAME = re.compile(NAME_PATTERN)
MAX_FRAME_BYTES = 4 * 1024 * 1024
"""Largest frame either side accepts (a hello listing 4,096 models is about 1 MB)."""
MAX_MODELS = 4096
"""Models one inventory may list."""
MAX_REPLICAS = 1024
"""Graph replica processes one hello may list."""
_FRAME = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)


def model_name(app_id: str, variant: str) -> str:
    """Triton model name of ``variant`` serving ``app_id``: ``<app>__<variant>``."""
    return f"{app_id}{MODEL_NAME_SEPARATOR}{variant}"


def split_model_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`model_name`; ValueError when ``name`` is not one of ours."""
    app_id, sep, variant = name.partition(MODEL_NAME_SEPARATOR)
    if not sep or not app_id or not variant:
        raise ValueError(f"{name!r} is not an <app>__<variant> model name")
    return app_id, variant


class _Message(BaseModel):
    model_config = _FRAME

    v: int = PROTOCOL_VERSION


class ModelState(StrEnum):
    """State of one model on an agent."""

    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class InventoryItem(BaseModel):
    """One model the agent's Triton holds (or is loading)."""

    model_config = _FRAME

    model_name: ModelName
    app_id: ModelPart
    variant: ModelPart
    state: ModelState
    memory_mb: Capacity | None = None
    load_s: Duration | None = None

    @model_validator(mode="after")
    def _name_matches(self) -> InventoryItem:
        if self.model_name != model_name(self.app_id, self.variant):
            raise ValueError(f"model_name is not {self.app_id}{MODEL_NAME_SEPARATOR}"
                             f"{self.variant}")
        return self


class Endpoints(BaseModel):
    """Where clients reach this server's Triton."""

    model_config = _FRAME

    http: Url
    grpc: Url
    metrics: Url | None = None


class ErrorInfo(BaseModel):
    """Why a command failed; ``retryable`` separates transient from final errors."""

    model_config = _FRAME

    code: Text
    message: Message
    retryable: bool = False


class ReplicaInfo(BaseModel):
    """A service-graph replica process an agent runs (``python -m stateful.replica_main``)."""

    model_config = _FRAME

    graph: Id
    node: Id
    address: Url
    """``host:port`` the replica listens on, as peers elsewhere reach it."""
    pid: Pid | None = None
    started_at: Timestamp | None = None


# --- agent -> controller ------------------------------------------------------------------------


class Hello(_Message):
    """First frame of every connection: identity, capacity, what is loaded."""

    type: Literal["hello"] = "hello"
    server_id: Id
    site_id: Id
    capacity: Capacities
    server_type: Id = "testbed"
    endpoints: Endpoints | None = None
    triton_alive: bool = True
    inventory: list[InventoryItem] = Field(default_factory=list, max_length=MAX_MODELS)
    heartbeat_interval_ms: HeartbeatIntervalMs = 20.0
    boot_id: Token = ""
    """Changes every agent start: a new boot id means nothing loaded survived."""
    agent_pid: Pid | None = None
    replicas: list[ReplicaInfo] = Field(default_factory=list, max_length=MAX_REPLICAS)
    """Graph replica processes running now (the controller stops those it does not know)."""


class CommandResult(_Message):
    """Answer to one command (also the answer to a malformed one, with ``ok`` false)."""

    type: Literal["result"] = "result"
    command_id: str = Field(max_length=MAX_ID_CHARS)
    """Empty in the error reply to a frame that named no (valid) command id."""
    ok: bool
    command: Text = ""
    model_name: ModelName | None = None
    state: ModelState | None = None
    already: bool = False
    """True when the command found its work already done (idempotent repeat)."""
    error: ErrorInfo | None = None
    timings: dict[Id, Duration] = Field(default_factory=dict, max_length=64)
    inventory: list[InventoryItem] | None = Field(None, max_length=MAX_MODELS)
    replica: ReplicaInfo | None = None
    """For ``start_replica``: the running replica and its address."""


class TritonDown(_Message):
    """The agent's Triton process exited (sent the moment the agent sees it)."""

    type: Literal["triton_down"] = "triton_down"
    at: Timestamp
    exit_code: ExitCode | None = None
    restarting: bool = False
    lost_models: list[ModelName] = Field(default_factory=list, max_length=MAX_MODELS)


class TritonUp(_Message):
    """Triton is (again) ready; nothing is loaded in a restarted Triton."""

    type: Literal["triton_up"] = "triton_up"
    at: Timestamp
    endpoints: Endpoints
    restarts: Count = 0


class ReplicaExited(_Message):
    """A replica process the agent started has ended (sent the moment the agent sees it)."""

    type: Literal["replica_exited"] = "replica_exited"
    graph: Id
    node: Id
    at: Timestamp
    exit_code: ExitCode | None = None
    requested: bool = False
    """True when a ``stop_replica`` command ended it (not a failure)."""


AgentMessage = Annotated[Hello | CommandResult | TritonDown | TritonUp |
                         ReplicaExited, Field(discriminator="type")]


# --- controller -> agent ------------------------------------------------------------------------


class _Command(_Message):
    command_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)


class _ModelCommand(_Command):
    app_id: str
    variant: str

    @field_validator("app_id")
    @classmethod
    def _app(cls, value: str) -> str:
        return check_name(value, "app id")

    @field_validator("variant")
    @classmethod
    def _variant(cls, value: str) -> str:
        return check_name(value, "variant")

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
        return check_name(value, "variant")


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
    heartbeat_interval_ms: HeartbeatIntervalMs = 20.0


class Configure(_Message):
    """Controller-side settings pushed to the agent (heartbeat interval)."""

    type: Literal["configure"] = "configure"
    heartbeat_interval_ms: HeartbeatIntervalMs | None = None


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
    """A frame that is not valid JSON, not a valid message, or of another protocol version."""

    def __init__(self, message: str, command_id: str | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id


class FrameTooLargeError(ProtocolError):
    """A frame longer than :data:`MAX_FRAME_BYTES` (refused before it is parsed)."""


class UnknownMessageError(ProtocolError):
    """A well-formed frame of a type this peer does not know (perhaps a newer peer's)."""


_MAX_DETAILS_CHARS = 500
"""What a refusal quotes of the validation errors (they may quote hostile keys)."""


def _frame_size(raw: str | bytes) -> int:
    if isinstance(raw, bytes) or len(raw) * 4 <= MAX_FRAME_BYTES:
        return len(raw)  # a str this short cannot encode to more than the limit
    return len(raw.encode("utf-8", "surrogatepass"))


def _parse(adapter: TypeAdapter, raw: str | bytes) -> object:
    import json

    if _frame_size(raw) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"frame larger than {MAX_FRAME_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested thousands deep
        raise ProtocolError(f"frame is not JSON: {str(exc)[:_MAX_DETAILS_CHARS]}") from exc
    if not isinstance(data, dict):
        raise ProtocolError("frame is not a JSON object")
    command_id = data.get("command_id")
    if not isinstance(command_id, str) or not 0 < len(command_id) <= MAX_ID_CHARS:
        command_id = None
    version = data.get("v", PROTOCOL_VERSION)
    kind = str(data.get("type", "untyped"))[:40]
    if version != PROTOCOL_VERSION:
        shown = version if isinstance(version, int) else str(version)[:20]
        raise ProtocolError(f"protocol version {shown!r} not supported (this peer speaks "
                            f"{PROTOCOL_VERSION})", command_id)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if errors[0]["type"] == "union_tag_invalid":
            raise UnknownMessageError(f"invalid {kind} frame: a type this peer does not know",
                                      command_id) from exc
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                            for e in errors)
        raise ProtocolError(f"invalid {kind} frame: {details[:_MAX_DETAILS_CHARS]}",
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
