"""One replica node (HAMS's proxy, §III-A): hosts whichever role the newest config gives it.

A node is a process (or a simulated host). Its role follows the manager's ``GraphConfig``
(desired state, STYLE.md 3): stateless operator, stateful primary, stateful backup, or none (a
blank standby). Role changes the config implies:

- backup -> primary of a new epoch: promotion from the last applied state (§IV-E);
- primary -> backup: the old (alive) primary rejoins as backup and waits for an overwrite;
- primary -> primary of a new epoch: roll back to the retained snapshot at ``start_seq``
  (correlated failure of an upstream primary and this operator's backup, §IV-C);
- anything else: start fresh from the operator's initial state.

During a recovery the node answers ``Freeze`` (stop applying states and taking notifies; report
what it applied, acted on and saw), ``Fence`` (purge dead speculation; report taint) and
``Resume`` (install placements, thaw, resend logs, re-announce durable points).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from stateful.checker import ObsPromoted
from stateful.core.backup import BackupRole
from stateful.core.common import Durability
from stateful.core.effects import Effect, LoadState, Observe, Send
from stateful.core.operator import StatelessRole, frontend_route
from stateful.core.primary import PrimaryRole, Snapshot
from stateful.errors import UnexpectedMessageError
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
    OutputRecord,
    Payload,
    Resume,
    ResumeAck,
    StateAck,
    StateUpdate,
)

logger = logging.getLogger(__name__)

Role = StatelessRole | PrimaryRole | BackupRole


class ReplicaNode:
    def __init__(self, node: str) -> None:
        self.node = node
        self.installed: GraphConfig | None = None
        self.durability = Durability()
        self.generation = 0
        self.role: Role | None = None
        self.gc_upto = 0
        """The newest collect watermark this node heard of; new roles start from it."""
        self.early: list[tuple[str, object]] = []
        """Data-plane messages sent under a newer config than this node's."""

    @property
    def config(self) -> GraphConfig:
        """The installed config (roles exist only once one is)."""
        if self.installed is None:
            raise UnexpectedMessageError(f"{self.node} has no config yet")
        return self.installed

    def route(self, op: str) -> str | None:
        return None if self.installed is None else frontend_route(self.installed, op)

    # -- messages ----------------------------------------------------------------------------

    def on_message(self, src: str, msg: object) -> list[Effect]:
        cv = getattr(msg, "cv", None)
        if cv is not None and (self.installed is None or cv > self.installed.version):
            # Sent under a config this node has not installed yet (configs travel on other
            # links): hold it until that config arrives, or it would reach the wrong role.
            self.early.append((src, msg))
            return []
        role = self.role
        if isinstance(msg, Data):
            if isinstance(role, StatelessRole | PrimaryRole):
                return role.on_data(msg)
            return []
        if isinstance(msg, StateUpdate):
            return role.on_state(src, msg) if isinstance(role, BackupRole) else []
        if isinstance(msg, StateAck):
            return role.on_state_ack(src, msg) if isinstance(role, PrimaryRole) else []
        if isinstance(msg, Durable):
            moved = self.durability.notify(msg)
            return role.try_apply() if moved and isinstance(role, BackupRole) else []
        if isinstance(msg, Collect):
            self.gc_upto = max(self.gc_upto, msg.upto)
            if role is not None:
                role.collect(msg.upto)
            return []
        return self._control(src, msg)

    def _control(self, src: str, msg: object) -> list[Effect]:
        if isinstance(msg, Configure):
            old = self.installed
            out = self._install(msg.config)
            role = self.role
            if (old is not None and isinstance(role, StatelessRole | PrimaryRole)
                    and any(frontend_route(old, s) != frontend_route(self.config, s)
                            for s in self.config.graph.topology.succs[role.op])):
                out += role.resync()  # a successor moved outside a recovery (a standby arrived)
            return out
        if isinstance(msg, Freeze):
            return [Send(src, self._freeze(msg.recovery))]
        if isinstance(msg, Fence):
            self.durability.fence(msg.fences)
            tainted = self.role.on_fence(msg.fences) if isinstance(
                self.role, StatelessRole | PrimaryRole) else False
            op = self.role.op if tainted and self.role is not None else None
            points = self.role.rollback_points(self.durability.fences) if tainted and isinstance(
                self.role, PrimaryRole) else []
            return [Send(src, FenceAck(recovery=msg.recovery, round=msg.round, node=self.node,
                                       tainted=(op,) if op else (), points=tuple(points)))]
        if isinstance(msg, Resume):
            out = self._install(msg.config)
            self.durability.thaw()
            if isinstance(self.role, StatelessRole | PrimaryRole):
                out += self.role.resync() + self.role.pump()
            elif isinstance(self.role, BackupRole):
                out += self.role.try_apply()
            return out + [Send(src, ResumeAck(recovery=msg.recovery, node=self.node))]
        logger.warning("%s: dropping unexpected %s from %s", self.node, type(msg).__name__, src)
        return []

    def _freeze(self, recovery: int) -> FreezeAck:
        self.durability.frozen = True
        seen: dict[str, int] = {}
        applied: dict[str, int] = {}
        if self.role is not None:
            self.role.seen(seen)
            if isinstance(self.role, BackupRole) and self.role.applied_batch >= 0:
                applied[self.role.op] = self.role.applied_seq
        return FreezeAck(recovery=recovery, node=self.node, applied=applied,
                         durable=dict(self.durability.seqs), seen=seen)

    # -- executor completions --------------------------------------------------------------

    def on_compute_done(self, generation: int, batch_no: int,
                        outputs: list[Payload]) -> list[Effect]:
        if generation != self.generation or not isinstance(self.role, StatelessRole | PrimaryRole):
            return []
        return self.role.on_compute_done(batch_no, outputs)

    def on_update_done(self, generation: int, batch_no: int) -> list[Effect]:
        if generation != self.generation or not isinstance(self.role, PrimaryRole):
            return []
        return self.role.on_update_done(batch_no)

    def on_retrieved(self, generation: int, batch_no: int,
                     tensors: Mapping[str, Payload]) -> list[Effect]:
        if generation != self.generation or not isinstance(self.role, PrimaryRole):
            return []
        return self.role.on_retrieved(batch_no, tensors)

    def on_timer(self, key: str) -> list[Effect]:
        return []

    # -- configuration ---------------------------------------------------------------------

    def _install(self, config: GraphConfig) -> list[Effect]:
        if self.installed is not None and config.version <= self.installed.version:
            return []
        self.installed = config
        self.durability.fence(config.fences)
        out = self._assume(config)
        early, self.early = self.early, []
        for src, msg in early:
            out += self.on_message(src, msg)
        return out

    def _assume(self, config: GraphConfig) -> list[Effect]:
        """Take the role ``config`` gives this node."""
        assigned = config.roles.get(self.node)
        out: list[Effect] = []
        if assigned is None:
            if self.role is not None:
                logger.info("%s: no role in config v%d; idle", self.node, config.version)
                self._new_generation(None)
            return out
        op, kind = assigned
        where = config.placements[op]
        if kind == "stateless":
            if not (isinstance(self.role, StatelessRole) and self.role.op == op):
                stateless = StatelessRole(self, op, where.epoch, where.start_seq + 1)
                stateless.collect(self.gc_upto)
                self._new_generation(stateless)
                out.append(LoadState(self.generation, op, None))
            return out + self._pump()
        if kind == "backup":
            current = self.role
            if (isinstance(current, BackupRole) and current.op == op
                    and current.epoch == where.epoch):
                return out + current.announce()
            backup = BackupRole(self, op, where.epoch, where.primary)
            backup.collect(self.gc_upto)
            self._new_generation(backup)
            return out + backup.announce()
        return out + self._install_primary(op, where.epoch, where.start_seq, where.backup)

    def _new_generation(self, role: Role | None) -> None:
        self.generation += 1
        self.role = role

    def _pump(self) -> list[Effect]:
        return self.role.pump() if isinstance(self.role, StatelessRole | PrimaryRole) else []

    def _install_primary(self, op: str, epoch: int, start_seq: int,
                         backup: str | None) -> list[Effect]:
        role = self.role
        if isinstance(role, PrimaryRole) and role.op == op and role.epoch == epoch:
            return role.attach_backup(backup) + role.pump()
        base: tuple[Snapshot, dict[int, OutputRecord]] | None = None
        if isinstance(role, BackupRole | PrimaryRole):
            # A request no longer in the log was collected: carry the watermark over, or the new
            # role would take a resent, already answered request as new.
            gc = role.gc_upto if isinstance(role, BackupRole) else role.stage.gc_upto
            self.gc_upto = max(self.gc_upto, gc)
        if isinstance(role, BackupRole) and role.op == op:
            base = role.base()
            if base is not None and role.applied_seq != start_seq:
                logger.error("%s: promoted at seq %d but the manager's durable point is %d",
                             self.node, role.applied_seq, start_seq)
        elif isinstance(role, PrimaryRole) and role.op == op:
            base = role.rollback_base(start_seq)
        if (base is None and start_seq > 0 and isinstance(role, BackupRole | PrimaryRole)
                and role.op == op):
            logger.error("%s: no state at seq %d for %s; restarting it empty (state lost)",
                         self.node, start_seq, op)
        out: list[Effect] = []
        if base is None:
            primary = PrimaryRole(self, op, epoch, base=None, start_seq=start_seq)
            self._new_generation(primary)
            out.append(LoadState(self.generation, op, None))
        else:
            snap, log = base
            primary = PrimaryRole(self, op, epoch, base=snap, start_seq=snap.last_seq, log=log)
            self._new_generation(primary)
            out.append(LoadState(self.generation, op, snap.tensors))
            if self.config.options.observe:
                out.append(Observe(ObsPromoted(op=op, node=self.node, epoch=epoch,
                                               start_seq=snap.last_seq)))
        primary.collect(self.gc_upto)
        out += primary.start()
        return out + primary.attach_backup(backup) + primary.pump()
