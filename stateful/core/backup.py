"""The backup of a stateful operator: buffer, order and apply states (HAMS Algorithm 2).

Applying a state makes it this backup's current state — durable, acknowledged, announced — and
keeps its tensors; they are loaded into the model when the backup is promoted (a load is a
millisecond for these models on CPU; HAMS keeps the backup's state on the GPU instead so that
takeover needs no copy). Doing it lazily keeps the per-batch cost of a backup to a decode.

States are buffered and applied strictly in batch order (a later complete state also embodies
the earlier batches' effects, so skipping one would make its speculative inputs durable without
the check). An ``overwrite`` state (a new or rejoining backup, §IV-E) supersedes everything
before it.

``nspb``: a state is applied only when, for every request in it and every previous stateful
model (PFM) m, m's output in the request's lineage is durable (Algorithm 2 l.4-8). Note the
paper's l.8 reads ``wait(durable_seqs[m] <= m_seq)``; the intended condition, which §IV-C and the
proof in §IV-F state, is that the backup waits *until* ``durable_seqs[m] >= m_seq``. After
applying, the backup notifies its next stateful models (l.9-10) — the frontend counts as one.

``strawman``: applies at once and notifies the frontend (which waits for every stateful operator
in a reply's lineage, §IV-C). ``remus``: applies at once; the ack releases the primary's held
outputs. Every applied state is acknowledged to the primary, which frees its snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from stateful.checker import ObsApplied
from stateful.core.common import fold_seen
from stateful.core.effects import Effect, Observe, Send
from stateful.core.operator import NodeContext
from stateful.core.primary import Snapshot
from stateful.graph import FRONTEND
from stateful.messages import Durable, Mode, OutputRecord, Payload, StateAck, StateUpdate

logger = logging.getLogger(__name__)


class BackupRole:
    def __init__(self, ctx: NodeContext, op: str, epoch: int, primary: str | None) -> None:
        self.ctx = ctx
        self.op = op
        self.epoch = epoch
        self.primary = primary
        self.applied_batch = -1
        """-1 until the first (overwrite) state arrives."""
        self.applied_seq = 0
        self.received_batch = -1
        self.tensors: Mapping[str, Payload] = {}
        self.log: dict[int, OutputRecord] = {}
        self.buffer: dict[int, StateUpdate] = {}
        self.gc_upto = 0
        topo = ctx.config.graph.topology
        self.pfm = topo.pfm[op]
        self.nfm = topo.nfm[op]

    @property
    def mode(self) -> Mode:
        return self.ctx.config.options.mode

    def on_state(self, src: str, msg: StateUpdate) -> list[Effect]:
        if src != self.primary or msg.epoch != self.epoch or msg.op != self.op:
            return []
        if msg.batch_no <= self.applied_batch:
            return [self._ack()]  # a duplicate: batch numbers only grow within an epoch
        if msg.overwrite:
            self.buffer = {b: m for b, m in self.buffer.items() if b > msg.batch_no}
        self.buffer[msg.batch_no] = msg
        self.received_batch = max(self.received_batch, msg.batch_no)
        return [self._ack(), *self.try_apply()]

    def _ack(self) -> Send:
        return Send(self.primary or "", StateAck(op=self.op, epoch=self.epoch,
                                                 received_batch=self.received_batch,
                                                 applied_batch=self.applied_batch,
                                                 cv=self.ctx.config.version))

    def _next(self) -> StateUpdate | None:
        if not self.buffer:
            return None
        overwrites = [b for b, m in self.buffer.items() if m.overwrite]
        if overwrites:
            first = max(overwrites)
            self.buffer = {b: m for b, m in self.buffer.items() if b >= first}
        candidate = self.buffer[min(self.buffer)]
        if candidate.overwrite or (self.applied_batch >= 0
                                   and candidate.batch_no == self.applied_batch + 1):
            return candidate
        return None

    def _deps_durable(self, msg: StateUpdate) -> bool:
        """Algorithm 2 l.5-8: every PFM output in these requests' lineages is durable."""
        if self.mode is not Mode.NSPB:
            return True
        durability = self.ctx.durability
        for record in msg.records:
            for m in self.pfm:
                entry = record.lineage.get(m)
                if entry is not None and not durability.covers(m, entry):
                    return False
        return True

    def try_apply(self) -> list[Effect]:
        out: list[Effect] = []
        while not self.ctx.durability.frozen:
            msg = self._next()
            if msg is None or not self._deps_durable(msg):
                break
            del self.buffer[msg.batch_no]
            out += self._apply(msg)
        return out

    def _apply(self, msg: StateUpdate) -> list[Effect]:
        first = self.applied_batch < 0
        if msg.overwrite:
            self.log = {}
        for record in msg.records:
            if record.request_id > self.gc_upto:
                self.log[record.seq] = record
        self.applied_batch = msg.batch_no
        self.applied_seq = msg.last_seq
        self.tensors = msg.tensors
        self.collect(msg.gc_upto)
        out: list[Effect] = []
        if self.ctx.config.options.observe and msg.records:
            out.append(Observe(ObsApplied(
                op=self.op, node=self.ctx.node,
                records=tuple((r.request_id, r.lineage) for r in msg.records))))
        out.append(self._ack())
        if first:  # tell the manager this operator is protected again
            out.append(Send(self.ctx.config.manager, Durable(
                op=self.op, epoch=self.epoch, seq=self.applied_seq, cv=self.ctx.config.version)))
        return out + self.announce()

    def announce(self) -> list[Effect]:
        """Algorithm 2 l.9-10: tell the next stateful models (and the frontend) what is durable."""
        if self.applied_batch < 0 or self.mode in (Mode.BARE, Mode.REMUS):
            return []
        targets = self.nfm if self.mode is Mode.NSPB else frozenset({FRONTEND})
        msg = Durable(op=self.op, epoch=self.epoch, seq=self.applied_seq,
                      cv=self.ctx.config.version)
        out: list[Effect] = []
        for target in sorted(targets):
            if target == FRONTEND:
                out.append(Send(self.ctx.config.frontend, msg))
                continue
            where = self.ctx.config.placements.get(target)
            if where is not None and where.backup is not None:
                out.append(Send(where.backup, msg))
        return out

    def base(self) -> tuple[Snapshot, dict[int, OutputRecord]] | None:
        """The applied state to promote from, or None if this backup never got one."""
        if self.applied_batch < 0:
            return None
        return Snapshot(self.applied_batch, self.applied_seq, self.tensors), dict(self.log)

    def collect(self, upto: int) -> None:
        if upto > self.gc_upto:
            self.gc_upto = upto
            self.log = {s: r for s, r in self.log.items() if r.request_id > upto}

    def seen(self, into: dict[str, int]) -> None:
        for record in self.log.values():
            fold_seen(record.lineage, into)
