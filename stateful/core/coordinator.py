"""The manager's recovery protocol for service graphs (HAMS §IV-E), as a pure state machine.

``on_replica_failed(operator, replica)`` is the failure signal: the local runtime calls it when a
replica process dies; the controller's detector will call it for a failed server's replicas.
One recovery runs at a time; failures that arrive meanwhile queue for the next one (their nodes
stop being waited for at once). A recovery is three broadcast rounds to every live node:

1. ``Freeze``: the backups of the operators to fence stop applying and report what they
   applied; D = that (§IV-E "contacts its backup to get the max output sequence"). When a
   backup is gone too, or a stateless replica or a backup failed, every live node freezes and
   reports what it applied, what it acted on as durable and the largest seq it saw; D is the max
   (covering a backup that died after notifying), and freezing first makes D exact.
2. ``Fence`` rounds: each operator whose primary failed gets a new epoch and fence (epoch, D);
   nodes purge every queued input, log entry and pending reply built on its output after D, and
   a stateful primary whose state holds such an output reports itself tainted (§IV-E "stateful
   models that have processed requests whose lineage shows a larger sequence than max_seq").
   Tainted operators are fenced in the next round at their own D (one that rolls back: at its
   rollback point, see 3), until no new taint: an operator rolled back to D re-executes its
   outputs after D, so whoever consumed those is tainted too (the paper checks one level; the
   fixpoint is what the proof of §IV-F needs).
3. ``Resume``: the new placements. A fenced operator's backup is promoted and its old primary,
   if alive, rejoins as backup by state overwrite; if the backup is gone (correlated failure) the
   primary rolls back to a snapshot it retained: the newest that holds no purged output and
   depends only on durable outputs (its fence point; at least D). A failed stateless operator
   (or, in ``bare``, a stateful one) restarts on a warm standby, numbering after the largest seq
   seen. Every node then resends its output log and the frontend its unanswered requests
   (predecessors "resend according to the lineage"; receivers drop duplicates by request id).

Rounds that a node does not answer within ``round_timeout_s`` treat that node as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stateful.core.effects import Effect, Kill, LaunchSpare, RecoveryDone, Send, StartTimer
from stateful.errors import InvalidGraphError, ReplicaUnavailableError
from stateful.graph import MANAGER, GraphSpec
from stateful.messages import (
    Configure,
    Durable,
    Fence,
    FenceAck,
    FencePoint,
    Freeze,
    FreezeAck,
    GraphConfig,
    Mode,
    Placement,
    Resume,
    ResumeAck,
    RollbackPoint,
    RuntimeOptions,
)

logger = logging.getLogger(__name__)


@dataclass
class _Recovery:
    id: int
    failed: frozenset[str]
    started_at: float
    phase: str = "freeze"
    round: int = 0
    awaiting: set[str] = field(default_factory=set)
    reports: list[FreezeAck] = field(default_factory=list)
    durable: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    fenced: dict[str, FencePoint] = field(default_factory=dict)
    tainted: set[str] = field(default_factory=set)
    pending: list[str] = field(default_factory=list)
    """Operators to fence once the current freeze round is answered."""
    exact: set[str] = field(default_factory=set)
    """Operators whose durable point the freezes so far pinned down."""
    everyone: bool = False
    """Whether every live node has been frozen already."""
    backup_applied: dict[str, int] = field(default_factory=dict)
    """What each fenced operator's current backup has applied (absent: nothing yet)."""
    points: dict[str, tuple[RollbackPoint, ...]] = field(default_factory=dict)
    """The states each tainted primary could roll back to (its latest report)."""
    promoted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)


def initial_config(graph: GraphSpec, options: RuntimeOptions) -> GraphConfig:
    """Placements for a fresh deployment: ``<op>.p0`` / ``<op>.b0`` / ``<op>.s0``."""
    placements = {}
    for op in graph.operators:
        if op.stateful and options.mode is not Mode.BARE:
            placements[op.name] = Placement(primary=f"{op.name}.p0", backup=f"{op.name}.b0")
        elif op.stateful:
            placements[op.name] = Placement(primary=f"{op.name}.p0")
        else:
            placements[op.name] = Placement(primary=f"{op.name}.s0")
    return GraphConfig(version=1, graph=graph, options=options, placements=placements)


class Coordinator:
    def __init__(self, *, clock: Callable[[], float], node: str = MANAGER,
                 round_timeout_s: float = 2.0,
                 spare_rank: Callable[[str, str | None], int | None] | None = None) -> None:
        self.node = node
        self.spare_rank = spare_rank
        """``(standby, partner) -> rank``, lower is better, None for "never": which standby to
        pair with the operator's other replica (a cluster deployment refuses standbys on the
        partner's server while another server is up, so a new backup never shares its
        primary's server). No function: the oldest standby."""
        self.short: set[str] = set()
        self._together = False
        """Operators left without a replica because every standby was refused; one extra
        standby is launched for each (once, until it is filled)."""
        self.clock = clock
        self.round_timeout_s = round_timeout_s
        self.config: GraphConfig | None = None
        self.spares: list[str] = []
        self.dead: set[str] = set()
        self.queued: set[str] = set()
        self.recovery: _Recovery | None = None
        self.recoveries = 0
        self.taken = 0
        self.synced: dict[str, tuple[str, int]] = {}
        """Operator -> (backup node, epoch) that has applied a state (protected again)."""
        self.seen: dict[str, int] = {}
        """Largest seq per operator any freeze reported: a late restart numbers after it."""

    # -- inputs ------------------------------------------------------------------------------

    def deploy(self, config: GraphConfig, spares: Iterable[str] = ()) -> list[Effect]:
        """Install the first placement and tell every node (and the frontend)."""
        self.spares = list(spares)
        return self._publish(config)

    def on_replicas_failed(self, replicas: Iterable[tuple[str | None, str]]) -> list[Effect]:
        """Several replicas failed together (their server did): one recovery for them all.

        Signalled one by one, the first would start a recovery alone and the others queue for
        the next.
        """
        out: list[Effect] = []
        self._together = True
        try:
            for operator, replica in replicas:
                out += self.on_replica_failed(operator, replica)
        finally:
            self._together = False
        if self.recovery is None and self.queued:
            out += self._start()
        return out

    def on_replica_failed(self, operator: str | None, replica: str) -> list[Effect]:
        """The failure signal (process death, missed heartbeats, RPC timeout)."""
        if replica in self.dead or self.config is None:
            return []
        if replica in self.spares:
            self.spares.remove(replica)
            self.dead.add(replica)
            return [Kill(replica), LaunchSpare(1)]
        role = self.config.roles.get(replica)
        if role is None:
            logger.info("failure of %s ignored: it holds no role", replica)
            return []
        if operator is not None and role[0] != operator:
            logger.warning("failure signal names %s for %s, which serves %s", operator, replica,
                           role[0])
        logger.warning("replica %s (%s of %s) failed", replica, role[1], role[0])
        self.dead.add(replica)
        self.queued.add(replica)
        out: list[Effect] = [Kill(replica)]
        rec = self.recovery
        if rec is None:
            return out if self._together else out + self._start()
        if replica in rec.awaiting:
            rec.awaiting.discard(replica)
            if not rec.awaiting:
                out += self._advance()
        return out

    def reconfigure(self, graph: GraphSpec) -> list[Effect]:
        """Publish a new spec of the same graph (e.g. another batch size); not in a recovery."""
        if self.config is None or self.recovery is not None:
            raise ReplicaUnavailableError("no deployed graph, or a recovery is running")
        old = self.config.graph
        if (graph.operators, graph.edges) != (old.operators, old.edges):
            raise InvalidGraphError("only the batch size and seed of a deployed graph can change")
        return self._publish(self.config.evolve(graph=graph))

    def on_spare_ready(self, node: str, address: str | None = None) -> list[Effect]:
        """A blank standby process is listening; use it where a replica is missing."""
        self.spares.append(node)
        if self.config is None:
            return []
        addresses = dict(self.config.addresses)
        if address is not None:
            addresses[node] = address
        config = self.config.evolve(addresses=addresses)
        self.config = config
        return [] if self.recovery is not None else self._repair()

    def on_message(self, src: str, msg: object) -> list[Effect]:
        if isinstance(msg, Durable):
            where = self.config.placements.get(msg.op) if self.config else None
            if where is not None and where.backup == src and where.epoch == msg.epoch:
                self.synced[msg.op] = (src, msg.epoch)
            return []
        rec = self.recovery
        if rec is None or src not in rec.awaiting:
            return []
        if isinstance(msg, FreezeAck) and msg.recovery == rec.id and rec.phase == "freeze":
            rec.reports.append(msg)
        elif isinstance(msg, FenceAck) and (msg.recovery, msg.round) == (rec.id, rec.round):
            rec.tainted.update(msg.tainted)
            for op in msg.tainted:
                rec.points[op] = msg.points
        elif not (isinstance(msg, ResumeAck) and msg.recovery == rec.id
                  and rec.phase == "resume"):
            return []
        rec.awaiting.discard(src)
        return self._advance() if not rec.awaiting else []

    def on_timer(self, key: str) -> list[Effect]:
        rec = self.recovery
        if rec is None or key != self._timer_key(rec) or not rec.awaiting:
            return []
        late = sorted(rec.awaiting)
        logger.error("recovery %d: %s did not answer %s within %.1f s; declaring them failed",
                     rec.id, late, rec.phase, self.round_timeout_s)
        out: list[Effect] = []
        for node in late:
            self.dead.add(node)
            self.queued.add(node)
            out.append(Kill(node))
        rec.awaiting.clear()
        return out + self._advance()

    @property
    def busy(self) -> bool:
        return self.recovery is not None

    # -- rounds ------------------------------------------------------------------------------

    def _live(self) -> set[str]:
        assert self.config is not None
        return (set(self.config.nodes) - self.dead) | {self.config.frontend}

    def _timer_key(self, rec: _Recovery) -> str:
        return f"round:{rec.id}:{rec.phase}:{rec.round}"

    def _broadcast(self, rec: _Recovery, msg: object, nodes: set[str]) -> list[Effect]:
        rec.awaiting = set(nodes)
        out: list[Effect] = [Send(n, msg) for n in sorted(nodes)]  # type: ignore[arg-type]
        return out + [StartTimer(self._timer_key(rec), self.round_timeout_s)]

    def _start(self) -> list[Effect]:
        self.recoveries += 1
        rec = _Recovery(id=self.recoveries, failed=frozenset(self.queued),
                        started_at=self.clock())
        self.queued = set()
        self.recovery = rec
        logger.info("recovery %d starts for %s", rec.id, sorted(rec.failed))
        assert self.config is not None
        roles = [self.config.roles.get(n, ("", ""))[1] for n in rec.failed]
        return self._freeze(rec, self._failed_primaries(rec),
                            everyone=any(role != "primary" for role in roles))

    def _freeze(self, rec: _Recovery, ops: list[str], everyone: bool = False) -> list[Effect]:
        """Freeze what decides the durable points of ``ops`` before fencing them.

        With its backup alive, an operator's durable point is what that backup applied (every
        notify anyone acted on came from it, after applying), so freezing the backups is enough.
        A lost backup, or a failed stateless replica or backup (whose replacement needs the
        largest seq anyone saw), asks every live node.
        """
        assert self.config is not None
        rec.pending = ops
        rec.phase = "freeze"
        backups = [self.config.placements[op].backup for op in ops]
        if everyone or any(b is None or b in self.dead for b in backups):
            rec.exact |= self.config.graph.topology.stateful
            rec.everyone = True
            return self._broadcast(rec, Freeze(recovery=rec.id), self._live())
        rec.exact |= set(ops)
        return self._broadcast(rec, Freeze(recovery=rec.id), {b for b in backups if b})

    def _advance(self) -> list[Effect]:
        rec = self.recovery
        assert rec is not None and self.config is not None
        if rec.phase == "freeze":
            self._merge_reports(rec)
            unsynced = [op for op in rec.pending if op not in rec.backup_applied]
            if unsynced and not rec.everyone:
                # A backup that has not applied its first (overwrite) state yet does not know
                # the durable point: its predecessor may have announced states it never got.
                return self._freeze(rec, rec.pending, everyone=True)
            return self._fence(rec.pending)
        if rec.phase == "fence":
            new = sorted(rec.tainted - set(rec.fenced))
            if any(op not in rec.exact for op in new):
                return self._freeze(rec, new)
            return self._fence(new)
        return self._done(rec)

    def _merge_reports(self, rec: _Recovery) -> None:
        assert self.config is not None
        for report in rec.reports:
            for source in (report.applied, report.durable):
                for op, seq in source.items():
                    rec.durable[op] = max(rec.durable.get(op, 0), seq)
            for op, seq in report.applied.items():
                if self.config.placements[op].backup == report.node:
                    rec.backup_applied[op] = seq
            for op, seq in report.seen.items():
                rec.seen[op] = max(rec.seen.get(op, 0), seq)
                self.seen[op] = max(self.seen.get(op, 0), seq)

    def _failed_primaries(self, rec: _Recovery) -> list[str]:
        assert self.config is not None
        if self.config.options.mode is Mode.BARE:
            return []
        stateful = self.config.graph.topology.stateful
        return sorted(op for op, where in self.config.placements.items()
                      if op in stateful and where.primary in self.dead)

    def _fence(self, ops: list[str]) -> list[Effect]:
        rec = self.recovery
        assert rec is not None and self.config is not None
        if not ops:
            return self._resume(rec)
        fences = {op: FencePoint(self.config.placements[op].epoch + 1, self._fence_seq(op, rec))
                  for op in ops}
        rec.fenced.update(fences)
        rec.phase = "fence"
        rec.round += 1
        logger.info("recovery %d round %d fences %s", rec.id, rec.round, fences)
        return self._broadcast(rec, Fence(recovery=rec.id, round=rec.round, fences=fences),
                               self._live())

    def _fence_seq(self, op: str, rec: _Recovery) -> int:
        """Where ``op``'s new epoch starts: the durable point D, or later for a rollback.

        A promoted backup starts from what it applied (D). A primary that rolls back instead
        (its backup is gone or behind, §IV-C) goes to its newest retained state that holds no
        purged output and whose inputs from other stateful operators are durable: HAMS's
        s_b^{n-1}. That state is at least D, and at least any state the lost backup applied
        without anyone hearing of it, which a rollback to D would silently undo.
        """
        assert self.config is not None
        durable = rec.durable.get(op, 0)
        where = self.config.placements[op]
        primary_alive = where.primary is not None and where.primary not in self.dead
        backup_alive = where.backup is not None and where.backup not in self.dead
        promotes = backup_alive and rec.backup_applied.get(op, -1) >= durable
        if not primary_alive or promotes or not rec.everyone:
            return durable
        known = dict(rec.durable)  # every durable point: an everyone-freeze pinned them down
        for other, point in rec.fenced.items():
            known[other] = max(known.get(other, 0), point.seq)
        newest = max((p.seq for p in rec.points.get(op, ())
                      if all(seq <= known.get(m, 0) for m, seq in p.deps.items())), default=0)
        if newest > durable:
            logger.info("recovery %d: %s rolls back to its retained state at seq %d (durable "
                        "point %d)", rec.id, op, newest, durable)
        return max(durable, newest)

    def _resume(self, rec: _Recovery) -> list[Effect]:
        assert self.config is not None
        placements = dict(self.config.placements)
        for op, point in sorted(rec.fenced.items()):
            placements[op] = self._refenced(op, placements[op], point, rec)
        placements = self._fill(placements, rec.restarted, seen=rec.seen)
        config = self.config.evolve(version=self.config.version + 1, placements=placements,
                                    fences={**self.config.fences, **rec.fenced})
        self.config = config
        rec.phase = "resume"
        return self._broadcast(rec, Resume(recovery=rec.id, config=config),
                               self._live()) + self._launches()

    def _refenced(self, op: str, where: Placement, point: FencePoint,
                  rec: _Recovery) -> Placement:
        primary_alive = where.primary is not None and where.primary not in self.dead
        backup_alive = where.backup is not None and where.backup not in self.dead
        synced = rec.backup_applied.get(op, -1) >= point.seq
        if backup_alive and (synced or not primary_alive):
            if not synced:
                logger.error("operator %s: its backup %s has not caught up with the durable "
                             "point %d and the primary is gone (two failures of one operator)",
                             op, where.backup, point.seq)
            rec.promoted.append(op)
            return Placement(primary=where.backup, backup=where.primary if primary_alive else None,
                             epoch=point.epoch, start_seq=point.seq)
        if primary_alive:
            # The backup is gone or still catching up: roll the primary back to its snapshot
            # at the durable point (§IV-C); a live backup stays and gets a fresh overwrite.
            rec.rolled_back.append(op)
            return Placement(primary=where.primary, backup=where.backup if backup_alive else None,
                             epoch=point.epoch, start_seq=point.seq)
        logger.error("operator %s lost both replicas; restarting it empty (outside HAMS's "
                     "failure model)", op)
        return Placement(primary=None, backup=None, epoch=point.epoch, start_seq=point.seq)

    def _fill(self, placements: dict[str, Placement], restarted: list[str],
              seen: dict[str, int] | None = None) -> dict[str, Placement]:
        """Replace dead replicas with standbys; record stateless/bare restarts."""
        assert self.config is not None
        mode = self.config.options.mode
        stateful = self.config.graph.topology.stateful
        for op in sorted(placements):
            where = placements[op]
            wants_backup = op in stateful and mode is not Mode.BARE
            # A dead stateful primary is the next recovery's job (promotion from its backup);
            # only a stateless operator, a bare one, or one that lost both replicas restarts.
            if where.primary is None or (where.primary in self.dead and not wants_backup):
                partner = where.backup if where.backup not in self.dead else None
                spare = self._take_spare(partner, op)
                if spare is not None:
                    restarted.append(op)
                start = (seen or {}).get(op, where.start_seq)
                where = Placement(primary=spare, backup=where.backup, epoch=where.epoch + 1,
                                  start_seq=max(start, where.start_seq))
            if where.backup in self.dead or (wants_backup and where.backup is None):
                where = where.model_copy(update={"backup": self._take_spare(where.primary, op)
                                                 if wants_backup else None})
            placements[op] = where
        return placements

    def _take_spare(self, partner: str | None = None, op: str | None = None) -> str | None:
        self.spares = [n for n in self.spares if n not in self.dead]
        candidates = self.spares
        if self.spare_rank is not None:
            rank = self.spare_rank
            ranked = [(r, i, n) for i, n in enumerate(self.spares)
                      if (r := rank(n, partner)) is not None]
            candidates = [n for _, _, n in sorted(ranked)]  # the best, oldest first
        if not candidates:
            if self.spares and op is not None and op not in self.short:
                self.short.add(op)  # every standby refused: ask for one more
                self.taken += 1
            return None
        node = candidates[0]
        self.spares.remove(node)
        self.taken += 1
        if op is not None:
            self.short.discard(op)
        return node

    def _done(self, rec: _Recovery) -> list[Effect]:
        self.recovery = None
        done = RecoveryDone(recovery=rec.id, failed=tuple(sorted(rec.failed)),
                            promoted=tuple(rec.promoted), rolled_back=tuple(rec.rolled_back),
                            restarted=tuple(rec.restarted), started_at=rec.started_at,
                            finished_at=self.clock())
        logger.info("recovery %d done in %.1f ms: promoted %s, rolled back %s, restarted %s",
                    rec.id, (done.finished_at - done.started_at) * 1e3, done.promoted,
                    done.rolled_back, done.restarted)
        out: list[Effect] = [done]
        if self.queued:
            return out + self._start()
        return out + self._repair()

    def _repair(self) -> list[Effect]:
        """Give standbys that arrived during a recovery to replicas still missing."""
        if self.config is None or not self.spares:
            return []
        placements = self._fill(dict(self.config.placements), restarted=[], seen=self.seen)
        if placements == self.config.placements:
            return []
        return self._publish(self.config.evolve(placements=placements))

    def _launches(self) -> list[Effect]:
        """Replace the standbys taken since the last call (a warm pool of constant size)."""
        count, self.taken = self.taken, 0
        return [LaunchSpare(count)] if count else []

    def _publish(self, config: GraphConfig) -> list[Effect]:
        if self.config is not None:
            config = config.evolve(version=self.config.version + 1)
        self.config = config
        msg = Configure(config=config)
        return [Send(n, msg) for n in sorted(set(config.nodes) | {config.frontend})] + \
            self._launches()
