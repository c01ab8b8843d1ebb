"""Helpers every core shares: fences, durability bookkeeping, lineage merging, the input stage.

Dead speculation (HAMS §IV-C, §IV-E): when an operator's primary is replaced, its new epoch
starts from the durable point ``D`` (the last output its backup applied). Every output of an
older epoch with ``seq > D`` was speculative and is lost; anything carrying it in its lineage is
*dead* and must be purged everywhere. ``Fences`` records those points.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stateful.graph import Topology
from stateful.messages import (
    Data,
    Durable,
    FencePoint,
    Lineage,
    LineageEntry,
    OutputRecord,
    Payload,
    RequestMeta,
)

logger = logging.getLogger(__name__)


def is_dead(lineage: Mapping[str, LineageEntry], fences: Mapping[str, FencePoint]) -> bool:
    """Whether ``lineage`` holds an output that a fence declared lost."""
    for op, entry in lineage.items():
        point = fences.get(op)
        if point is not None and entry.epoch < point.epoch and entry.seq > point.seq:
            return True
    return False


def merge_lineages(lineages: Iterable[Mapping[str, LineageEntry]]) -> Lineage:
    """Union of the inputs' lineages at a join (Algorithm 1 over several predecessors).

    An operator processes a request once, so the same operator carries the same entry on every
    path. The exception is a stateless operator that was restarted and re-executed; its entries
    are never checked, and the newest is kept.
    """
    out: Lineage = {}
    for lineage in lineages:
        for op, entry in lineage.items():
            old = out.get(op)
            if old is None or (entry.epoch, entry.seq) > (old.epoch, old.seq):
                out[op] = entry
    return out


@dataclass
class Durability:
    """What one node knows about durable states (Algorithm 2's ``durable_seqs``).

    Notifies of an epoch older than the operator's fence are stale and ignored; during a
    recovery freeze they are held back and replayed on resume.
    """

    seqs: dict[str, int] = field(default_factory=dict)
    fences: dict[str, FencePoint] = field(default_factory=dict)
    frozen: bool = False
    held: list[Durable] = field(default_factory=list)

    def seq(self, op: str) -> int:
        return self.seqs.get(op, 0)

    def covers(self, op: str, entry: LineageEntry) -> bool:
        """Whether ``op``'s output ``entry`` is durable as far as this node knows.

        A fenced-off output (an older epoch's speculation past the fence) never is, however far
        the new epoch's durable point has moved: its seq was reused by a re-execution, and a
        notify for that seq covers the new value, not this one.
        """
        point = self.fences.get(op)
        if point is not None and entry.epoch < point.epoch and entry.seq > point.seq:
            return False
        return entry.seq <= self.seqs.get(op, 0)

    def notify(self, msg: Durable) -> bool:
        """Record a notify; True when it moved a durable point forward."""
        if self.frozen:
            self.held.append(msg)
            return False
        point = self.fences.get(msg.op)
        if point is not None and msg.epoch < point.epoch:
            return False
        if msg.seq > self.seqs.get(msg.op, 0):
            self.seqs[msg.op] = msg.seq
            return True
        return False

    def fence(self, fences: Mapping[str, FencePoint]) -> None:
        """Install fence points; a fence's seq is durable by construction.

        It is the max of every applied or acted-on seq reported in the freeze.
        """
        for op, point in fences.items():
            old = self.fences.get(op)
            if old is None or point.epoch > old.epoch:
                self.fences[op] = point
            self.seqs[op] = max(self.seqs.get(op, 0), point.seq)

    def thaw(self) -> bool:
        """Leave the freeze and replay held notifies; True when any moved a point."""
        self.frozen = False
        held, self.held = self.held, []
        moved = False
        for msg in held:
            moved = self.notify(msg) or moved
        return moved


@dataclass(slots=True)
class ReadyItem:
    """A request whose inputs from every active predecessor have arrived."""

    request_id: int
    meta: RequestMeta
    inputs: tuple[Payload, ...]
    lineage: Lineage


@dataclass
class InputStage:
    """Joins inputs per request, drops duplicates and dead inputs, queues ready requests.

    ``done`` holds the ids of requests this operator already took into a batch (dedup across
    resends after a failover); ``gc_upto`` is the frontend's collect watermark.
    """

    op: str
    topology: Topology
    joins: dict[int, dict[str, OutputRecord]] = field(default_factory=dict)
    ready: deque[ReadyItem] = field(default_factory=deque)
    done: dict[int, int] = field(default_factory=dict)
    queued: set[int] = field(default_factory=set)
    """Ids in ``ready``: a resend of a request already joined but not yet batched is a dup."""
    gc_upto: int = 0

    def accept(self, data: Data, fences: Mapping[str, FencePoint]) -> bool:
        """Take a message of inputs; True when some request became ready."""
        ready = False
        for record in data.records:
            ready = self._accept(data.src_op, record, fences) or ready
        return ready

    def _accept(self, src: str, record: OutputRecord, fences: Mapping[str, FencePoint]) -> bool:
        rid = record.request_id
        if (rid <= self.gc_upto or rid in self.done or rid in self.queued
                or is_dead(record.lineage, fences)):
            return False
        wanted = self.topology.active_preds(self.op, record.meta.entries)
        if src not in wanted:
            logger.warning("%s: input for request %d from %s, which is not an active predecessor",
                           self.op, rid, src)
            return False
        slot = self.joins.setdefault(rid, {})
        if src in slot:
            return False
        slot[src] = record
        if len(slot) < len(wanted):
            return False
        del self.joins[rid]
        self.queued.add(rid)
        parts = [slot[p] for p in wanted]
        self.ready.append(ReadyItem(
            request_id=rid, meta=record.meta, inputs=tuple(p.payload for p in parts),
            lineage=merge_lineages(p.lineage for p in parts)))
        return True

    def take(self, limit: int) -> list[ReadyItem]:
        out: list[ReadyItem] = []
        while self.ready and len(out) < limit:
            item = self.ready.popleft()
            self.queued.discard(item.request_id)
            out.append(item)
        return out

    def purge(self, fences: Mapping[str, FencePoint]) -> None:
        """Drop queued and partially joined inputs that carry dead lineage."""
        self.ready = deque(i for i in self.ready if not is_dead(i.lineage, fences))
        self.queued = {i.request_id for i in self.ready}
        for rid in list(self.joins):
            slot = {p: r for p, r in self.joins[rid].items() if not is_dead(r.lineage, fences)}
            if slot:
                self.joins[rid] = slot
            else:
                del self.joins[rid]

    def collect(self, upto: int) -> None:
        self.gc_upto = max(self.gc_upto, upto)
        self.done = {r: s for r, s in self.done.items() if r > upto}
        self.ready = deque(i for i in self.ready if i.request_id > upto)
        self.queued = {i.request_id for i in self.ready}
        for rid in [r for r in self.joins if r <= upto]:
            del self.joins[rid]

    def seen(self, into: dict[str, int]) -> None:
        """Fold the largest seq per operator found in queued lineages into ``into``."""
        for item in self.ready:
            fold_seen(item.lineage, into)
        for slot in self.joins.values():
            for record in slot.values():
                fold_seen(record.lineage, into)


def fold_seen(lineage: Mapping[str, LineageEntry], into: dict[str, int]) -> None:
    for op, entry in lineage.items():
        if entry.seq > into.get(op, 0):
            into[op] = entry.seq


def make_record(item: ReadyItem, op: str, epoch: int, seq: int, output: Payload) -> OutputRecord:
    """The output record of ``item`` with this operator's own lineage entry (Algorithm 1, l.7)."""
    lineage = dict(item.lineage)
    lineage[op] = LineageEntry(epoch, seq, output.digest)
    return OutputRecord(request_id=item.request_id, seq=seq, lineage=lineage, meta=item.meta,
                        payload=output)
