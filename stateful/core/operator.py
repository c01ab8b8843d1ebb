"""The request manager every operator replica shares (HAMS §III-A), and the stateless role.

An operator replica joins inputs, forms batches of at most ``batch_size`` ready requests,
numbers them (``my_seq``, Algorithm 1 l.1-4), records lineage on each output (l.6-8), keeps an
output log until the frontend says the request left the graph (§IV-D), and resends that log
after a reconfiguration (receivers drop duplicates by request id).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from stateful.checker import ObsRelease
from stateful.core.common import Durability, InputStage, ReadyItem, fold_seen, is_dead, make_record
from stateful.core.effects import BatchItem, Compute, Effect, Observe, Send
from stateful.graph import FRONTEND
from stateful.messages import Data, FencePoint, GraphConfig, Mode, OutputRecord, Payload

logger = logging.getLogger(__name__)


class NodeContext(Protocol):
    """What a role needs from the replica node that hosts it."""

    node: str
    durability: Durability
    generation: int

    @property
    def config(self) -> GraphConfig:
        """The installed config."""
        ...

    def route(self, op: str) -> str | None:
        """The node serving ``op`` now (its primary), or the frontend node."""
        ...


@dataclass
class Batch:
    batch_no: int
    items: list[ReadyItem]
    first_seq: int
    records: list[OutputRecord] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.items) - 1


class OperatorRole:
    """Shared by the stateless role and the stateful primary role."""

    def __init__(self, ctx: NodeContext, op: str, epoch: int, next_seq: int) -> None:
        self.ctx = ctx
        self.op = op
        self.epoch = epoch
        self.next_seq = next_seq
        topo = ctx.config.graph.topology
        self.stage = InputStage(op=op, topology=topo)
        self.log: dict[int, OutputRecord] = {}
        self.batch_no = 0
        self.computing: Batch | None = None
        self.frozen = False

    @property
    def mode(self) -> Mode:
        return self.ctx.config.options.mode

    def on_data(self, data: Data) -> list[Effect]:
        if self.stage.accept(data, self.ctx.durability.fences):
            return self.pump()
        return []

    def pump(self) -> list[Effect]:
        raise NotImplementedError

    def _form_batch(self) -> tuple[Batch, Compute] | None:
        """Take up to ``batch_size`` ready requests and number them."""
        items = self.stage.take(self.ctx.config.graph.batch_size)
        if not items:
            return None
        self.batch_no += 1
        batch = Batch(batch_no=self.batch_no, items=items, first_seq=self.next_seq)
        for offset, item in enumerate(items):
            self.stage.done[item.request_id] = self.next_seq + offset
        self.next_seq += len(items)
        effect = Compute(generation=self.ctx.generation, batch_no=batch.batch_no,
                         items=tuple(BatchItem(i.request_id, batch.first_seq + n, i.meta, i.inputs)
                                     for n, i in enumerate(items)))
        return batch, effect

    def _records(self, batch: Batch, outputs: list[Payload]) -> list[OutputRecord]:
        if len(outputs) != len(batch.items):
            raise ValueError(f"{self.op}: model returned {len(outputs)} outputs for "
                             f"{len(batch.items)} requests")
        return [make_record(item, self.op, self.epoch, batch.first_seq + n, out)
                for n, (item, out) in enumerate(zip(batch.items, outputs, strict=True))]

    def release(self, records: list[OutputRecord]) -> list[Effect]:
        """Send outputs to every successor's current primary (and the frontend for a sink)."""
        out: list[Effect] = []
        observe = self.ctx.config.options.observe
        cv = self.ctx.config.version
        if not records:
            return out
        for succ in self.ctx.config.graph.topology.succs[self.op]:
            dst = self.ctx.route(succ)
            if dst is None:
                continue
            if observe:
                out += [Observe(ObsRelease.of(self.op, self.ctx.node, r, succ)) for r in records]
            out.append(Send(dst, Data(src_op=self.op, records=tuple(records), cv=cv)))
        return out

    def released_log(self) -> list[OutputRecord]:
        """Log entries already released downstream (all of them, except Remus's held ones)."""
        return list(self.log.values())

    def resync(self) -> list[Effect]:
        """Resend the live output log after a reconfiguration (§IV-E: resend from lineage)."""
        return self.release(self.released_log())

    def collect(self, upto: int) -> None:
        self.stage.collect(upto)
        self.log = {s: r for s, r in self.log.items() if r.request_id > upto}

    def seen(self, into: dict[str, int]) -> None:
        self.stage.seen(into)
        for record in self.log.values():
            fold_seen(record.lineage, into)
        if self.next_seq - 1 > into.get(self.op, 0):
            into[self.op] = self.next_seq - 1

    def purge_log(self, fences: dict[str, FencePoint]) -> None:
        """Forget outputs built on dead speculation, so their re-executions are accepted."""
        for seq, record in list(self.log.items()):
            if is_dead(record.lineage, fences):
                del self.log[seq]
                self.stage.done.pop(record.request_id, None)


class StatelessRole(OperatorRole):
    """A stateless operator: compute, release, log. Re-execution is always allowed (§IV-F)."""

    def pump(self) -> list[Effect]:
        if self.computing is not None or self.frozen:
            return []
        formed = self._form_batch()
        if formed is None:
            return []
        self.computing, effect = formed
        return [effect]

    def on_compute_done(self, batch_no: int, outputs: list[Payload]) -> list[Effect]:
        batch = self.computing
        if batch is None or batch.batch_no != batch_no:
            return []
        self.computing = None
        fences = self.ctx.durability.fences
        records = []
        for record in self._records(batch, outputs):
            if is_dead(record.lineage, fences):
                continue  # a fence arrived while this batch computed (see on_fence)
            self.log[record.seq] = record
            records.append(record)
        return self.release(records) + self.pump()

    def on_fence(self, fences: dict[str, FencePoint]) -> bool:
        self.stage.purge(fences)
        self.purge_log(fences)
        if self.computing is not None:
            # Forget dead requests of the running batch now, so their re-executed versions are
            # accepted even if they arrive before this batch completes (its outputs are dropped).
            for item in self.computing.items:
                if is_dead(item.lineage, fences):
                    self.stage.done.pop(item.request_id, None)
        return False


def frontend_route(config: GraphConfig, op: str) -> str | None:
    """Routing used by every node: the frontend node, or an operator's current primary."""
    if op == FRONTEND:
        return config.frontend
    where = config.placements.get(op)
    return None if where is None else where.primary
