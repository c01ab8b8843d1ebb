"""Versioned wire messages of the NSPB protocol (pydantic, JSON; tensors as base64 raw bytes).

Every frame is one ``Envelope`` (``v`` = ``WIRE_VERSION``) holding one message, discriminated by
its ``type``. Nothing is pickled. New fields get defaults so an older peer still decodes a newer
frame of the same version.

Data plane (HAMS §III-A, §IV): ``Data`` (an operator's output, or a client request from the
frontend, with its lineage — Algorithm 1), ``StateUpdate`` (the state tuple ⟨reqs, tensors,
outputs⟩ of §IV-D), ``StateAck``, ``Durable`` (Algorithm 2's notify) and ``Collect`` (output-log
garbage collection once requests have left the graph). Control plane (§IV-E, driven by the
manager): ``Configure``, ``Freeze``/``FreezeAck``, ``Fence``/``FenceAck``, ``Resume``/``ResumeAck``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from stateful.errors import WireFormatError
from stateful.graph import FRONTEND, MANAGER, GraphSpec

WIRE_VERSION: Literal[1] = 1

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Mode(StrEnum):
    """Replication mode; all four run the same code paths (issue 6, "Modes")."""

    BARE = "bare"
    """No replication: no state retrieval, no backup; a failed stateful operator restarts empty."""
    REMUS = "remus"
    """Stop, copy the state, hold outputs until the backup acknowledges it (HAMS §III-B)."""
    STRAWMAN = "strawman"
    """Release outputs at once, the backup applies states at once; only replies wait (§IV-C)."""
    NSPB = "nspb"
    """HAMS's non-stop primary-backup (§III-B, §IV)."""


class Payload(BaseModel):
    """A tensor as raw little-endian bytes.

    In plain JSON (``encode``) ``data`` is base64. In a transport frame (``encode_frame``) it is
    ``"#<n>"``, a reference to the n-th raw attachment after the JSON header, so a state of a
    few MB costs a memcpy instead of base64 both ways.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["float32", "int64"] = "float32"
    shape: tuple[int, ...]
    data: bytes

    @field_serializer("data", when_used="json")
    def _data_out(self, value: bytes, info: SerializationInfo) -> str:
        blobs = info.context.get("blobs") if isinstance(info.context, dict) else None
        if blobs is None:
            return base64.b64encode(value).decode()
        blobs.append(value)
        return f"#{len(blobs) - 1}"

    @field_validator("data", mode="before")
    @classmethod
    def _data_in(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        blobs = info.context.get("blobs") if isinstance(info.context, dict) else None
        if value.startswith("#"):  # never base64: '#' is outside its alphabet
            if blobs is None:
                raise ValueError("a blob reference outside a binary frame")
            return blobs[int(value[1:])]
        return base64.b64decode(value, validate=True)

    @cached_property
    def digest(self) -> str:
        """Content hash the consistency checker compares (dtype, shape and bytes)."""
        h = hashlib.blake2b(digest_size=10)
        h.update(f"{self.dtype}{self.shape}".encode())
        h.update(self.data)
        return h.hexdigest()


class LineageEntry(NamedTuple):
    """Where a request went through one operator: that operator's epoch, sequence and output."""

    epoch: int
    seq: int
    digest: str


Lineage = dict[str, LineageEntry]
"""operator -> entry, for every operator a request passed (Algorithm 1, flattened per request)."""


class RequestMeta(BaseModel):
    """What travels with a client request through the graph besides tensors."""

    model_config = _FROZEN

    stream: str = "default"
    """Per-stream state key (e.g. one LSTM hidden state per stream)."""
    kind: Literal["infer", "train"] = "infer"
    label: int | None = None
    entries: tuple[str, ...] = ()
    """The entry operators this request was sent to (decides each join's active inputs)."""


class OutputRecord(BaseModel):
    """One output of an operator; kept in its output log until the request leaves the graph."""

    model_config = _FROZEN

    request_id: int
    seq: int
    lineage: Lineage
    meta: RequestMeta
    payload: Payload


class FencePoint(NamedTuple):
    """Outputs of an operator with an epoch older than ``epoch`` and ``seq`` above are dead."""

    epoch: int
    seq: int


class Placement(BaseModel):
    """Where an operator runs; ``start_seq`` is the durable point a new epoch starts from."""

    model_config = _FROZEN

    primary: str | None
    backup: str | None = None
    epoch: int = 0
    start_seq: int = 0


class NoiseSpec(BaseModel):
    """Seeded non-determinism injected into every execution (HAMS §II-C, S2)."""

    model_config = _FROZEN

    seed: int = 0
    scale: float = Field(default=1e-4, gt=0.0, le=1.0)


class RuntimeOptions(BaseModel):
    model_config = _FROZEN

    mode: Mode = Mode.NSPB
    window: int = Field(default=2, ge=1, le=64)
    """States a primary may have shipped but not yet seen received before it must wait."""
    noise: NoiseSpec | None = None
    collect_interval_s: float = Field(default=0.02, gt=0.0)
    observe: bool = False
    """Emit checker observations (releases, applied states, replies)."""
    link_mbps: float | None = Field(default=None, gt=0.0)
    """Emulate this bandwidth on every link between processes (replicas of one machine
    talk over loopback; a benchmark can model the edge network between servers)."""


class GraphConfig(BaseModel):
    """The manager's desired state for one graph; nodes converge to the newest version."""

    model_config = _FROZEN

    version: int
    graph: GraphSpec
    options: RuntimeOptions = RuntimeOptions()
    placements: dict[str, Placement]
    fences: dict[str, FencePoint] = Field(default_factory=dict)
    addresses: dict[str, str] = Field(default_factory=dict)
    frontend: str = FRONTEND
    manager: str = MANAGER

    def evolve(self, **changes: object) -> GraphConfig:
        """A copy with ``changes`` (not ``model_copy``: it would copy the cached properties)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        fields.update(changes)
        return GraphConfig(**fields)

    @cached_property
    def roles(self) -> dict[str, tuple[str, str]]:
        """Map each node to (operator, "primary" | "backup" | "stateless")."""
        out: dict[str, tuple[str, str]] = {}
        stateful = self.graph.topology.stateful
        for op, where in self.placements.items():
            if where.primary is not None:
                out[where.primary] = (op, "primary" if op in stateful else "stateless")
            if where.backup is not None:
                out[where.backup] = (op, "backup")
        return out

    @cached_property
    def nodes(self) -> tuple[str, ...]:
        """Every replica node in this config (frontend and manager excluded)."""
        return tuple(sorted(self.roles))


class Data(BaseModel):
    type: Literal["data"] = "data"
    model_config = _FROZEN
    cv: int = 0
    """The sender's config version; a receiver still on an older one holds the message."""
    src_op: str
    """The producing operator, or ``frontend`` for client requests."""
    records: tuple[OutputRecord, ...]
    """A released batch travels as one message (one frame, one decode, one batch formed)."""


class StateUpdate(BaseModel):
    """HAMS's ⟨reqs, tensors, outputs⟩ after batch ``batch_no`` (§IV-D).

    ``records`` are the batch's outputs, each with the lineage of its request (so reqs and
    outputs in one list). With ``overwrite`` the tensors replace whatever the receiver holds and
    ``records`` is the primary's whole live output log (a fresh or rejoining backup, §IV-E).
    """

    type: Literal["state"] = "state"
    model_config = _FROZEN
    cv: int = 0
    op: str
    epoch: int
    batch_no: int
    last_seq: int
    overwrite: bool = False
    tensors: dict[str, Payload]
    records: tuple[OutputRecord, ...]
    gc_upto: int = 0


class StateAck(BaseModel):
    type: Literal["state_ack"] = "state_ack"
    model_config = _FROZEN
    cv: int = 0
    """The sender's config version; a receiver still on an older one holds the message."""
    op: str
    epoch: int
    received_batch: int
    applied_batch: int


class Durable(BaseModel):
    """Algorithm 2's notify: the backup of ``op`` applied every state up to output ``seq``."""

    type: Literal["durable"] = "durable"
    model_config = _FROZEN
    cv: int = 0
    op: str
    epoch: int
    seq: int


class Collect(BaseModel):
    """Every request with id <= ``upto`` has left the graph; drop its logs (§IV-D)."""

    type: Literal["collect"] = "collect"
    model_config = _FROZEN
    upto: int


class Configure(BaseModel):
    type: Literal["configure"] = "configure"
    model_config = _FROZEN
    config: GraphConfig


class Freeze(BaseModel):
    """Recovery step 1: stop applying states and accepting notifies; report durable points."""

    type: Literal["freeze"] = "freeze"
    model_config = _FROZEN
    recovery: int


class FreezeAck(BaseModel):
    type: Literal["freeze_ack"] = "freeze_ack"
    model_config = _FROZEN
    recovery: int
    node: str
    applied: dict[str, int] = Field(default_factory=dict)
    """Backups: the last output seq of the state they applied."""
    durable: dict[str, int] = Field(default_factory=dict)
    """The durable seq this node has acted on, per stateful operator."""
    seen: dict[str, int] = Field(default_factory=dict)
    """The largest seq of each operator in any lineage this node holds (§IV-E max_out)."""


class Fence(BaseModel):
    """Recovery step 2: outputs beyond each fence point are lost speculation; purge them."""

    type: Literal["fence"] = "fence"
    model_config = _FROZEN
    recovery: int
    round: int
    fences: dict[str, FencePoint]


class RollbackPoint(BaseModel):
    """A complete state a tainted primary retains and could roll back to."""

    model_config = _FROZEN

    seq: int
    """The last output seq the state reflects; no output up to it is purged speculation."""
    deps: dict[str, int] = Field(default_factory=dict)
    """The largest seq of every other stateful operator in those outputs' lineages."""


class FenceAck(BaseModel):
    type: Literal["fence_ack"] = "fence_ack"
    model_config = _FROZEN
    recovery: int
    round: int
    node: str
    tainted: tuple[str, ...] = ()
    """Stateful primaries whose state holds a purged output: they must be rolled back."""
    points: tuple[RollbackPoint, ...] = ()
    """A tainted primary's retained states that hold no purged output, oldest first."""


class Resume(BaseModel):
    """Recovery step 3: install the new placements, unfreeze, resend from the logs."""

    type: Literal["resume"] = "resume"
    model_config = _FROZEN
    recovery: int
    config: GraphConfig


class ResumeAck(BaseModel):
    type: Literal["resume_ack"] = "resume_ack"
    model_config = _FROZEN
    recovery: int
    node: str


class LinkAck(BaseModel):
    """Transport: every frame of ``src`` -> ``dst`` up to link seq ``upto`` arrived."""

    type: Literal["link_ack"] = "link_ack"
    model_config = _FROZEN
    upto: int


Message = Annotated[
    Data | StateUpdate | StateAck | Durable | Collect | Configure | Freeze | FreezeAck | Fence
    | FenceAck | Resume | ResumeAck | LinkAck,
    Field(discriminator="type"),
]


class Envelope(BaseModel):
    model_config = _FROZEN

    v: Literal[1] = WIRE_VERSION
    src: str
    dst: str
    link: int = 0
    """Per (src, dst) frame number for retransmission after a reconnect (0: unnumbered)."""
    msg: Message


def _envelope_json(src: str, dst: str, msg: BaseModel, link: int,
                   context: dict[str, list[bytes]] | None) -> bytes:
    # The message is dumped by its own class, not through the Envelope's union field: pydantic
    # may try several union members while serializing, which would run (and double) the blob
    # serializer of every tensor.
    body = msg.model_dump_json(context=context)
    return (f'{{"v":{WIRE_VERSION},"src":{json.dumps(src)},"dst":{json.dumps(dst)},'
            f'"link":{int(link)},"msg":{body}}}').encode()


def encode(src: str, dst: str, msg: BaseModel, link: int = 0) -> bytes:
    """One message as JSON bytes (an ``Envelope``)."""
    return _envelope_json(src, dst, msg, link, None)


def decode(frame: bytes) -> Envelope:
    """The ``Envelope`` in ``frame``; ``WireFormatError`` for anything malformed."""
    try:
        return Envelope.model_validate_json(frame)
    except ValidationError as exc:
        raise WireFormatError(f"undecodable frame ({len(frame)} bytes): {exc}") from exc


_U32 = struct.Struct(">I")


def encode_frame(src: str, dst: str, msg: BaseModel, link: int = 0) -> bytes:
    """A transport frame: u32 header length, the JSON header, then u32-length-prefixed blobs."""
    blobs: list[bytes] = []
    header = _envelope_json(src, dst, msg, link, {"blobs": blobs})
    parts = [_U32.pack(len(header)), header]
    for blob in blobs:
        parts += [_U32.pack(len(blob)), blob]
    return b"".join(parts)


def decode_frame(body: bytes) -> Envelope:
    """Inverse of ``encode_frame``; ``WireFormatError`` for anything malformed."""
    try:
        (size,) = _U32.unpack_from(body, 0)
        header = body[4:4 + size]
        blobs: list[bytes] = []
        offset = 4 + size
        while offset < len(body):
            (length,) = _U32.unpack_from(body, offset)
            blobs.append(body[offset + 4:offset + 4 + length])
            offset += 4 + length
        if offset != len(body) or len(header) != size:
            raise WireFormatError(f"truncated frame ({len(body)} bytes)")
        return Envelope.model_validate_json(header, context={"blobs": blobs})
    except (ValidationError, struct.error, IndexError, ValueError) as exc:
        raise WireFormatError(f"undecodable frame ({len(body)} bytes): {exc}") from exc

