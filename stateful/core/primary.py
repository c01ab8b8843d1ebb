"""The primary of a stateful operator: compute, update, retrieve and ship states (HAMS §III-B, §IV).

Per batch n, by mode (the same pipeline; only the gates differ):

- ``nspb``: compute(n) runs while the state of batch n-1 is retrieved (§IV-B: the compute phase
  only reads the state); outputs are released downstream as soon as compute(n) ends (§IV-C,
  speculation); update(n) waits until state n-1 is retrieved (never mid-update) and until at
  most ``window`` shipped states are not yet received by the backup (§III-B step 3 with
  ``window`` = 1). Then state n is retrieved during compute(n+1) and shipped.
- ``strawman``: the same primary; only the backup and the frontend differ (§IV-C).
- ``remus``: after update(n) the primary stops: compute(n+1) waits for the retrieval of state n;
  outputs of batch n are held until the backup acknowledges that it applied state n (§III-B).
- ``bare``: compute, release, update; no retrieval, no backup.

The primary keeps complete snapshots from the backup's last applied state onwards, so that if
its backup fails together with an upstream primary it can roll back to the durable point by
overwriting its state (§IV-C, correlated failures).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from stateful.core.common import is_dead
from stateful.core.effects import Effect, Retrieve, Send, Update
from stateful.core.operator import Batch, NodeContext, OperatorRole
from stateful.messages import (
    FencePoint,
    Mode,
    OutputRecord,
    Payload,
    RollbackPoint,
    StateAck,
    StateUpdate,
)

logger = logging.getLogger(__name__)

MAX_RETAINED = 256
"""Snapshots kept for rollback; beyond this the oldest unshipped ones are dropped (logged)."""


@dataclass(frozen=True)
class Snapshot:
    """A complete state as after batch ``batch_no`` (whose last output is ``last_seq``)."""

    batch_no: int
    last_seq: int
    tensors: Mapping[str, Payload]


class PrimaryRole(OperatorRole):
    def __init__(self, ctx: NodeContext, op: str, epoch: int, *, base: Snapshot | None,
                 start_seq: int, log: Mapping[int, OutputRecord] | None = None) -> None:
        super().__init__(ctx, op, epoch, next_seq=start_seq + 1)
        self.log = dict(log or {})
        for record in self.log.values():
            self.stage.done[record.request_id] = record.seq
        self.batch_no = base.batch_no if base else 0
        self.computed: Batch | None = None
        self.updating: Batch | None = None
        self.state_batch = self.batch_no
        self.state_seq = start_seq
        """Last output seq reflected in the model's state (batch ``state_batch``)."""
        self.retrieved_batch = base.batch_no if base else -1
        self.unshipped: dict[int, Batch] = {}
        self.retained: dict[int, Snapshot] = {base.batch_no: base} if base else {}
        self.backup: str | None = None
        self.backup_fresh = True
        self.shipped = self.received = self.applied = self.batch_no
        self.held: dict[int, list[OutputRecord]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> list[Effect]:
        """A fresh primary retrieves its initial state (batch 0) to seed its backup."""
        if self.mode is Mode.BARE or self.retained:
            return self.pump()
        return [Retrieve(self.ctx.generation, 0)]

    def attach_backup(self, node: str | None) -> list[Effect]:
        """Follow the configured backup; a new one gets the complete state (overwrite)."""
        if self.mode is Mode.BARE or node == self.backup:
            return []
        self.backup = node
        self.backup_fresh = True
        if node is None or not self.retained:
            return []
        return self._ship(self.retained[max(self.retained)], [])

    def rollback_base(self, start_seq: int) -> tuple[Snapshot, dict[int, OutputRecord]] | None:
        """The retained snapshot ending at ``start_seq`` and the log up to it, if kept."""
        for snap in self.retained.values():
            if snap.last_seq == start_seq:
                return snap, {s: r for s, r in self.log.items() if s <= start_seq}
        return None

    # -- pipeline --------------------------------------------------------------------------

    def _window_ok(self) -> bool:
        if self.backup is None:
            return True
        return self.shipped - self.received < self.ctx.config.options.window

    def pump(self) -> list[Effect]:
        if self.frozen:
            return []
        out: list[Effect] = []
        retrieved = self.retrieved_batch == self.state_batch
        if (self.computed is not None and self.updating is None
                and (self.mode is Mode.BARE or retrieved) and self._window_ok()):
            self.updating, self.computed = self.computed, None
            out.append(Update(self.ctx.generation, self.updating.batch_no))
        if (self.computing is None and self.computed is None and self.updating is None
                and (self.mode is not Mode.REMUS or retrieved)):
            formed = self._form_batch()
            if formed is not None:
                self.computing, effect = formed
                out.append(effect)
        return out

    def on_compute_done(self, batch_no: int, outputs: list[Payload]) -> list[Effect]:
        batch = self.computing
        if batch is None or batch.batch_no != batch_no or self.frozen:
            return []
        self.computing = None
        batch.records = self._records(batch, outputs)
        for record in batch.records:
            self.log[record.seq] = record
        self.computed = batch
        if self.mode is Mode.REMUS:
            self.held[batch_no] = batch.records
            return self.pump()
        return self.release(batch.records) + self.pump()

    def on_update_done(self, batch_no: int) -> list[Effect]:
        batch = self.updating
        if batch is None or batch.batch_no != batch_no or self.frozen:
            return []
        self.updating = None
        self.state_batch = batch_no
        self.state_seq = batch.last_seq
        out: list[Effect] = []
        if self.mode is not Mode.BARE:
            self.unshipped[batch_no] = batch
            out.append(Retrieve(self.ctx.generation, batch_no))
        return out + self.pump()

    def on_retrieved(self, batch_no: int, tensors: Mapping[str, Payload]) -> list[Effect]:
        if self.frozen or batch_no != self.state_batch:
            return []
        batch = self.unshipped.pop(batch_no, None)
        snap = Snapshot(batch_no, self.state_seq, tensors)
        self.retrieved_batch = batch_no
        self.retained[batch_no] = snap
        out = self._ship(snap, batch.records if batch is not None else [])
        self._prune()
        return out + self.pump()

    def _ship(self, snap: Snapshot, records: list[OutputRecord]) -> list[Effect]:
        if self.backup is None:
            return []
        if self.backup_fresh:
            records = [r for r in self.log.values() if r.seq <= snap.last_seq]
            self.received = snap.batch_no - 1  # the new backup has received nothing yet
        msg = StateUpdate(op=self.op, epoch=self.epoch, batch_no=snap.batch_no,
                          last_seq=snap.last_seq, overwrite=self.backup_fresh,
                          tensors=dict(snap.tensors), records=tuple(records),
                          gc_upto=self.stage.gc_upto, cv=self.ctx.config.version)
        self.backup_fresh = False
        self.shipped = snap.batch_no
        return [Send(self.backup, msg)]

    def on_state_ack(self, src: str, ack: StateAck) -> list[Effect]:
        if src != self.backup or ack.epoch != self.epoch:
            return []
        self.received = max(self.received, ack.received_batch)
        self.applied = max(self.applied, ack.applied_batch)
        self._prune()
        out: list[Effect] = []
        for batch_no in sorted(b for b in self.held if b <= self.applied):
            out += self.release(self.held.pop(batch_no))
        return out + self.pump()

    def _prune(self) -> None:
        """Keep snapshots a rollback may need (applied..shipped) and the latest (overwrite)."""
        if not self.retained:
            return
        latest = max(self.retained)
        for batch_no in list(self.retained):
            if batch_no < self.applied or (self.shipped < batch_no < latest):
                del self.retained[batch_no]
        if len(self.retained) > MAX_RETAINED:
            logger.warning("%s: backup %s lags %d states behind; dropping the oldest snapshots",
                           self.op, self.backup, len(self.retained))
            for batch_no in sorted(self.retained)[1:-MAX_RETAINED + 1]:
                del self.retained[batch_no]

    # -- recovery --------------------------------------------------------------------------

    def released_log(self) -> list[OutputRecord]:
        held = {r.seq for records in self.held.values() for r in records}
        return [r for s, r in self.log.items() if s not in held]

    def on_fence(self, fences: dict[str, FencePoint]) -> bool:
        """Purge dead inputs; True (and stop) when this state holds lost speculation (§IV-E)."""
        self.stage.purge(fences)
        in_flight = [b for b in (self.computing, self.computed, self.updating) if b is not None]
        tainted = any(is_dead(r.lineage, fences) for r in self.log.values()) or any(
            is_dead(item.lineage, fences) for b in in_flight for item in b.items)
        if tainted:
            self.frozen = True
        return tainted

    def rollback_points(self, fences: Mapping[str, FencePoint]) -> list[RollbackPoint]:
        """The retained states this (tainted, frozen) primary could roll back to, oldest first.

        A state qualifies while no output up to its last seq is dead under ``fences``; each
        comes with the largest seq of every other stateful operator its outputs depend on, so
        the manager can keep the newest one whose dependencies are durable (§IV-C: M_b's
        primary rolls back to s_b^{n-1}, the state before the lost speculation, which is not
        necessarily the last state its backup was heard to apply).
        """
        stateful = self.ctx.config.graph.topology.stateful
        records = sorted(self.log.values(), key=lambda r: r.seq)
        points: list[RollbackPoint] = []
        deps: dict[str, int] = {}
        i = 0
        for batch_no in sorted(self.retained):
            snap = self.retained[batch_no]
            while i < len(records) and records[i].seq <= snap.last_seq:
                record = records[i]
                if is_dead(record.lineage, fences):
                    return points  # every later state holds this output too
                for op, entry in record.lineage.items():
                    if op != self.op and op in stateful and entry.seq > deps.get(op, 0):
                        deps[op] = entry.seq
                i += 1
            points.append(RollbackPoint(seq=snap.last_seq, deps=dict(deps)))
        return points
