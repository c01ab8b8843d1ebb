"""The graph frontend: logs client requests, sends them in, releases replies when durable.

HAMS §IV-D: "the frontend can be regarded as a special model, whose state durable action is
sending service outputs to clients". A reply (the outputs of every sink the request reaches) is
released only when every state it depends on is durable: in ``nspb`` the frontend checks its
previous stateful models (the rest follows by Algorithm 2's ordering); in ``strawman`` every
stateful operator in the lineage (its backups apply without ordering); ``remus`` and ``bare``
release at once (Remus holds outputs at each operator instead; bare gives no guarantee).

The request log doubles as the source of resends after a recovery, and the reply watermark
drives garbage collection of every output log (``Collect``). The frontend itself is not
replicated here; HAMS replicates it with SMR (§III-A), which is the controller's job.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from stateful.checker import ObsReply, ObsSubmit
from stateful.core.common import Durability, fold_seen, is_dead, merge_lineages
from stateful.core.effects import Effect, Observe, Reply, Send, StartTimer
from stateful.errors import InvalidGraphRequestError, ReplicaUnavailableError
from stateful.graph import FRONTEND
from stateful.messages import (
    Collect,
    Configure,
    Data,
    Durable,
    Fence,
    FenceAck,
    Freeze,
    FreezeAck,
    GraphConfig,
    Lineage,
    Mode,
    OutputRecord,
    Payload,
    RequestMeta,
    Resume,
    ResumeAck,
)

logger = logging.getLogger(__name__)

COLLECT_TIMER = "collect"


class ClientRequest(BaseModel):
    """What a client sends: one tensor per entry operator it targets, and request metadata."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: dict[str, Payload]
    stream: str = "default"
    kind: Literal["infer", "train"] = "infer"
    label: int | None = None


def reply_digest(outputs: dict[str, OutputRecord]) -> str:
    h = hashlib.blake2b(digest_size=10)
    for sink in sorted(outputs):
        h.update(f"{sink}:{outputs[sink].payload.digest};".encode())
    return h.hexdigest()


@dataclass
class _Pending:
    meta: RequestMeta
    inputs: dict[str, Payload]
    expected: tuple[str, ...]
    parts: dict[str, OutputRecord] = field(default_factory=dict)


class FrontendNode:
    def __init__(self, node: str = FRONTEND) -> None:
        self.node = node
        self.config: GraphConfig | None = None
        self.durability = Durability()
        self.next_id = 0
        self.pending: dict[int, _Pending] = {}
        self.complete: set[int] = set()
        self.replied_above: set[int] = set()
        self.watermark = 0
        self.collect_sent = 0
        self.collect_armed = False

    # -- client side -----------------------------------------------------------------------

    def submit(self, request: ClientRequest) -> tuple[int, list[Effect]]:
        """Accept a request; returns its id and the effects that send it into the graph."""
        rids, effects = self.submit_many([request])
        return rids[0], effects

    def submit_many(self, requests: list[ClientRequest]) -> tuple[list[int], list[Effect]]:
        """Accept requests together; one message per entry operator carries them all."""
        rids: list[int] = []
        out: list[Effect] = []
        for request in requests:
            rid, effects = self._accept(request)
            rids.append(rid)
            out += effects
        return rids, out + self._send_in(rids)

    def _accept(self, request: ClientRequest) -> tuple[int, list[Effect]]:
        if self.config is None:
            raise ReplicaUnavailableError("the frontend has no graph deployed yet")
        topo = self.config.graph.topology
        unknown = sorted(set(request.inputs) - set(topo.entries))
        if not request.inputs or unknown:
            raise InvalidGraphRequestError(
                f"request inputs must name entry operators {list(topo.entries)}, got "
                f"{sorted(request.inputs)}")
        self.next_id += 1
        rid = self.next_id
        meta = RequestMeta(stream=request.stream, kind=request.kind, label=request.label,
                           entries=tuple(sorted(request.inputs)))
        self.pending[rid] = _Pending(meta=meta, inputs=dict(request.inputs),
                                     expected=topo.expected_sinks(meta.entries))
        if self.config.options.observe:
            return rid, [Observe(ObsSubmit(request_id=rid))]
        return rid, []

    def _send_in(self, rids: list[int]) -> list[Effect]:
        assert self.config is not None
        per_entry: dict[str, list[OutputRecord]] = {}
        for rid in rids:
            pending = self.pending[rid]
            for entry, payload in pending.inputs.items():
                per_entry.setdefault(entry, []).append(OutputRecord(
                    request_id=rid, seq=rid, lineage={}, meta=pending.meta, payload=payload))
        out: list[Effect] = []
        for entry, records in sorted(per_entry.items()):
            where = self.config.placements[entry]
            if where.primary is not None:
                out.append(Send(where.primary, Data(src_op=FRONTEND, records=tuple(records),
                                                    cv=self.config.version)))
        return out

    # -- graph side ------------------------------------------------------------------------

    def on_message(self, src: str, msg: object) -> list[Effect]:
        if isinstance(msg, Data):
            return self._on_output(msg)
        if isinstance(msg, Durable):
            return self._release_ready() if self.durability.notify(msg) else []
        if isinstance(msg, Configure):
            old = self.config
            self._install(msg.config)
            out = self._release_ready()
            if old is not None and self.config is not None and any(
                    old.placements[e].primary != self.config.placements[e].primary
                    for e in self.config.graph.topology.entries):
                out += self._resend()
            return out
        if isinstance(msg, Freeze):
            self.durability.frozen = True
            seen: dict[str, int] = {}
            for pending in self.pending.values():
                for part in pending.parts.values():
                    fold_seen(part.lineage, seen)
            return [Send(src, FreezeAck(recovery=msg.recovery, node=self.node,
                                        durable=dict(self.durability.seqs), seen=seen))]
        if isinstance(msg, Fence):
            self._fence(msg)
            return [Send(src, FenceAck(recovery=msg.recovery, round=msg.round, node=self.node))]
        if isinstance(msg, Resume):
            self._install(msg.config)
            self.durability.thaw()
            return self._resend() + self._release_ready() + [
                Send(src, ResumeAck(recovery=msg.recovery, node=self.node))]
        logger.warning("frontend: dropping unexpected %s from %s", type(msg).__name__, src)
        return []

    def _resend(self) -> list[Effect]:
        """Send every unanswered request in again (entries drop what they already took)."""
        return self._send_in([r for r in sorted(self.pending) if r not in self.complete])

    def _install(self, config: GraphConfig) -> None:
        if self.config is None or config.version > self.config.version:
            self.config = config
            self.durability.fence(config.fences)

    def _fence(self, msg: Fence) -> None:
        self.durability.fence(msg.fences)
        for rid, pending in self.pending.items():
            dead = [s for s, p in pending.parts.items() if is_dead(p.lineage, msg.fences)]
            for sink in dead:
                del pending.parts[sink]
                self.complete.discard(rid)

    def _on_output(self, msg: Data) -> list[Effect]:
        completed: list[int] = []
        for record in msg.records:
            pending = self.pending.get(record.request_id)
            if (pending is None or msg.src_op not in pending.expected
                    or msg.src_op in pending.parts
                    or is_dead(record.lineage, self.durability.fences)):
                continue
            pending.parts[msg.src_op] = record
            if len(pending.parts) == len(pending.expected):
                self.complete.add(record.request_id)
                completed.append(record.request_id)
        return self._release_ready(only=completed) if completed else []

    def _durable(self, lineage: Lineage) -> bool:
        assert self.config is not None
        mode = self.config.options.mode
        if mode in (Mode.BARE, Mode.REMUS):
            return True
        topo = self.config.graph.topology
        ops = topo.pfm[FRONTEND] if mode is Mode.NSPB else topo.stateful
        for op in ops:
            entry = lineage.get(op)
            if entry is not None and not self.durability.covers(op, entry):
                return False
        return True

    def _release_ready(self, only: list[int] | None = None) -> list[Effect]:
        if self.config is None:
            return []
        out: list[Effect] = []
        for rid in (only if only is not None else sorted(self.complete)):
            pending = self.pending[rid]
            lineage = merge_lineages(p.lineage for p in pending.parts.values())
            if self._durable(lineage):
                out += self._reply(rid, pending, lineage)
        return out + self._maybe_collect()

    def _reply(self, rid: int, pending: _Pending, lineage: Lineage) -> list[Effect]:
        del self.pending[rid]
        self.complete.discard(rid)
        self.replied_above.add(rid)
        while self.watermark + 1 in self.replied_above:
            self.watermark += 1
            self.replied_above.discard(self.watermark)
        out: list[Effect] = []
        if self.config is not None and self.config.options.observe:
            out.append(Observe(ObsReply(request_id=rid, digest=reply_digest(pending.parts),
                                        lineage=lineage)))
        out.append(Reply(rid, {s: p.payload for s, p in pending.parts.items()}))
        return out

    def _maybe_collect(self) -> list[Effect]:
        if self.collect_armed or self.watermark <= self.collect_sent or self.config is None:
            return []
        self.collect_armed = True
        return [StartTimer(COLLECT_TIMER, self.config.options.collect_interval_s)]

    def on_timer(self, key: str) -> list[Effect]:
        if key != COLLECT_TIMER or self.config is None:
            return []
        self.collect_armed = False
        if self.watermark <= self.collect_sent:
            return []
        self.collect_sent = self.watermark
        msg = Collect(upto=self.watermark)
        return [Send(node, msg) for node in self.config.nodes]

    @property
    def outstanding(self) -> int:
        """Requests accepted and not yet replied."""
        return len(self.pending)
