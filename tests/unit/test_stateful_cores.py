"""The protocol cores stepped by hand: Algorithm 2 at the backup, NSPB/Remus gates at the
primary, the frontend's durability rule, fences, and the manager's recovery rounds."""

from __future__ import annotations

import pytest

from stateful.checker import ObsApplied
from stateful.core.coordinator import Coordinator, initial_config
from stateful.core.effects import (
    Compute,
    Effect,
    Kill,
    LoadState,
    Observe,
    RecoveryDone,
    Reply,
    Retrieve,
    Send,
    Update,
)
from stateful.core.frontend import ClientRequest, FrontendNode
from stateful.core.replica_node import ReplicaNode
from stateful.graph import FRONTEND, GraphSpec, OperatorSpec
from stateful.messages import (
    Configure,
    Data,
    Durable,
    Fence,
    FenceAck,
    FencePoint,
    Freeze,
    FreezeAck,
    GraphConfig,
    LineageEntry,
    Mode,
    OutputRecord,
    Payload,
    RequestMeta,
    Resume,
    ResumeAck,
    RollbackPoint,
    RuntimeOptions,
    StateAck,
    StateUpdate,
)

P = Payload(shape=(1,), data=b"\0\0\0\0")


def chain(batch_size: int = 2) -> GraphSpec:
    """frontend -> a (stateful) -> s (stateless) -> b (stateful) -> frontend."""
    ops = (OperatorSpec(name="a", kind="lstm", stateful=True),
           OperatorSpec(name="s", kind="mlp", stateful=False),
           OperatorSpec(name="b", kind="lstm", stateful=True))
    return GraphSpec(name="chain", operators=ops, batch_size=batch_size,
                     edges=((FRONTEND, "a"), ("a", "s"), ("s", "b"), ("b", FRONTEND)))


def config(mode: Mode = Mode.NSPB, window: int = 2) -> GraphConfig:
    return initial_config(chain(), RuntimeOptions(mode=mode, window=window, observe=True))


def node(name: str, cfg: GraphConfig) -> tuple[ReplicaNode, list[Effect]]:
    n = ReplicaNode(name)
    return n, n.on_message("manager", Configure(config=cfg))


def rec(rid: int, seq: int, **lineage: int) -> OutputRecord:
    return OutputRecord(request_id=rid, seq=seq, meta=RequestMeta(entries=("a",)), payload=P,
                        lineage={op: LineageEntry(0, s, "d") for op, s in lineage.items()})


def state(batch_no: int, *records: OutputRecord, overwrite: bool = False) -> StateUpdate:
    last = max((r.seq for r in records), default=0)
    return StateUpdate(op="b", epoch=0, batch_no=batch_no, last_seq=last, overwrite=overwrite,
                       tensors={"h:x": P}, records=records)


def sends(effects: list[Effect], kind: type) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def applied(effects: list[Effect], receipt: bool = True) -> list[int]:
    """Batches a backup applied: every apply acks at once; a received state is acked first."""
    acks = [s.msg.applied_batch for s in sends(effects, StateAck)]
    return acks[1:] if receipt else acks


# -- backup: Algorithm 2 ------------------------------------------------------------------------

def test_nspb_backup_waits_until_the_previous_stateful_output_is_durable() -> None:
    cfg = config()
    b, _ = node("b.b0", cfg)
    b.on_message("b.p0", state(0, overwrite=True))
    out = b.on_message("b.p0", state(1, rec(1, 1, a=5, s=1, b=1)))
    assert not applied(out), "applied before a's seq 5 is durable"
    assert sends(out, StateAck)[0].msg.received_batch == 1
    assert b.on_message("a.b0", Durable(op="a", epoch=0, seq=4)) == []
    out = b.on_message("a.b0", Durable(op="a", epoch=0, seq=5))
    assert applied(out, receipt=False) == [1]
    notify = sends(out, Durable)
    assert [(s.dst, s.msg.seq) for s in notify] == [(cfg.frontend, 1)]  # b's NFM: the frontend
    assert any(isinstance(e, Observe) and isinstance(e.event, ObsApplied) for e in out)


def test_backup_applies_in_batch_order_and_overwrite_supersedes() -> None:
    b, _ = node("b.b0", config(Mode.STRAWMAN))
    out = b.on_message("b.p0", state(2, rec(2, 2, b=2)))
    assert not applied(out), "nothing applied before an overwrite"
    b.on_message("b.p0", state(0, overwrite=True))
    out = b.on_message("b.p0", state(1, rec(1, 1, b=1)))
    assert applied(out) == [1, 2]
    out = b.on_message("b.p0", state(1, rec(1, 1, b=1)))  # a duplicate
    assert not applied(out)
    out = b.on_message("b.p0", state(5, rec(1, 1, b=1), rec(2, 2, b=2), overwrite=True))
    assert applied(out) == [5]


def test_strawman_and_remus_backups_apply_at_once() -> None:
    for mode, notifies in ((Mode.STRAWMAN, 1), (Mode.REMUS, 0)):
        b, _ = node("b.b0", config(mode))
        b.on_message("b.p0", state(0, overwrite=True))
        out = b.on_message("b.p0", state(1, rec(1, 1, a=5, b=1)))
        assert applied(out) == [1]
        assert len(sends(out, Durable)) == notifies


def test_states_from_an_old_epoch_or_a_stranger_are_ignored() -> None:
    b, _ = node("b.b0", config())
    assert b.on_message("x.p9", state(0, overwrite=True)) == []
    old = state(0, overwrite=True).model_copy(update={"epoch": 7})
    assert b.on_message("b.p0", old) == []


# -- primary: NSPB and Remus gates ----------------------------------------------------------

def feed(primary: ReplicaNode, rid: int) -> list[Effect]:
    rec_in = OutputRecord(request_id=rid, seq=rid, lineage={}, payload=P,
                          meta=RequestMeta(entries=("a",)))
    return primary.on_message(FRONTEND, Data(src_op=FRONTEND, records=(rec_in,), cv=1))


def start_primary(mode: Mode, window: int = 2) -> tuple[ReplicaNode, list[Effect]]:
    p, out = node("a.p0", config(mode, window))
    gen = p.generation
    assert [type(e) for e in out] == [LoadState, Retrieve]
    out = p.on_retrieved(gen, 0, {"h:x": P})
    assert sends(out, StateUpdate)[0].msg.overwrite
    return p, out


def test_nspb_primary_releases_at_once_and_retrieves_during_next_compute() -> None:
    p, _ = start_primary(Mode.NSPB)
    gen = p.generation
    p.on_message("a.b0", StateAck(op="a", epoch=0, received_batch=0, applied_batch=0))
    out = feed(p, 1)
    assert [type(e) for e in out] == [Compute]
    out = p.on_compute_done(gen, 1, [P])
    assert [s.dst for s in sends(out, Data)] == ["s.s0"], "outputs leave before the state"
    assert [type(e) for e in out if not isinstance(e, Send | Observe)] == [Update]
    feed(p, 2)
    out = p.on_update_done(gen, 1)
    kinds = [type(e) for e in out]
    assert Retrieve in kinds and Compute in kinds, "state 1 is copied while batch 2 computes"
    out = p.on_compute_done(gen, 2, [P])
    assert sends(out, Data) and not any(isinstance(e, Update) for e in out), \
        "update 2 must wait for the retrieval of state 1"
    out = p.on_retrieved(gen, 1, {"h:x": P})
    assert sends(out, StateUpdate)[0].msg.batch_no == 1
    assert any(isinstance(e, Update) for e in out)


def test_window_one_waits_until_the_backup_received_the_previous_state() -> None:
    p, _ = start_primary(Mode.NSPB, window=1)
    gen = p.generation
    feed(p, 1)
    out = p.on_compute_done(gen, 1, [P])
    assert sends(out, Data) and not any(isinstance(e, Update) for e in out)
    out = p.on_message("a.b0", StateAck(op="a", epoch=0, received_batch=0, applied_batch=-1))
    assert [type(e) for e in out] == [Update]


def test_remus_primary_stops_to_copy_and_holds_outputs_until_acked() -> None:
    p, _ = start_primary(Mode.REMUS)
    gen = p.generation
    p.on_message("a.b0", StateAck(op="a", epoch=0, received_batch=0, applied_batch=0))
    feed(p, 1)
    out = p.on_compute_done(gen, 1, [P])
    assert not sends(out, Data), "Remus holds outputs"
    feed(p, 2)
    out = p.on_update_done(gen, 1)
    assert [type(e) for e in out] == [Retrieve], "no compute while the state is copied"
    out = p.on_retrieved(gen, 1, {"h:x": P})
    assert sends(out, StateUpdate) and any(isinstance(e, Compute) for e in out)
    out = p.on_message("a.b0", StateAck(op="a", epoch=0, received_batch=1, applied_batch=1))
    assert [r.request_id for s in sends(out, Data) for r in s.msg.records] == [1]


def test_fence_taints_a_primary_that_consumed_lost_speculation() -> None:
    cfg = config()
    b, _ = node("b.p0", cfg)
    gen = b.generation
    b.on_retrieved(gen, 0, {"h:x": P})
    data = Data(src_op="s", records=(rec(1, 1, a=7, s=1),), cv=1)
    b.on_message("s.s0", data)
    out = b.on_message("manager", Fence(recovery=1, round=1, fences={"a": FencePoint(1, 6)}))
    assert sends(out, FenceAck)[0].msg.tainted == ("b",)
    s, _ = node("s.s0", cfg)
    s.on_message("a.p0", Data(src_op="a", records=(rec(2, 7, a=7),), cv=1))
    out = s.on_message("manager", Fence(recovery=1, round=1, fences={"a": FencePoint(1, 6)}))
    assert sends(out, FenceAck)[0].msg.tainted == ()
    assert s.on_message("a.p0", Data(src_op="a", records=(rec(3, 8, a=8),), cv=1)) == [], \
        "dead inputs arriving after the fence are dropped"


def test_a_backup_never_applies_a_state_built_on_fenced_speculation() -> None:
    """a's new epoch announcing seq 6 durable covers its own seq 5, not the lost epoch-0 seq 5
    this buffered state was built on (a's fence: epoch 1 from seq 4)."""
    b, _ = node("b.b0", config())
    b.on_message("b.p0", state(0, overwrite=True))
    b.on_message("b.p0", state(1, rec(1, 1, a=5, s=1, b=1)))
    b.on_message("manager", Fence(recovery=1, round=1, fences={"a": FencePoint(1, 4)}))
    out = b.on_message("a.b0", Durable(op="a", epoch=1, seq=6))
    assert not applied(out, receipt=False)


def test_a_tainted_primary_reports_the_retained_states_it_can_roll_back_to() -> None:
    b, _ = node("b.p0", config())
    gen = b.generation
    b.on_retrieved(gen, 0, {"h:x": P})
    for batch_no, (first, a_seqs) in enumerate([(1, (2, 3)), (3, (5, 6))], start=1):
        records = tuple(rec(first + i, first + i, a=a, s=first + i) for i, a in enumerate(a_seqs))
        assert [type(e) for e in b.on_message("s.s0", Data(src_op="s", records=records, cv=1))] \
            == [Compute]
        assert Update in [type(e) for e in b.on_compute_done(gen, batch_no, [P, P])]
        assert [type(e) for e in b.on_update_done(gen, batch_no)] == [Retrieve]
        b.on_retrieved(gen, batch_no, {"h:x": P})
        b.on_message("b.b0", StateAck(op="b", epoch=0, received_batch=batch_no, applied_batch=0))
    out = b.on_message("manager", Fence(recovery=1, round=1, fences={"a": FencePoint(1, 4)}))
    ack = sends(out, FenceAck)[0].msg
    assert ack.tainted == ("b",)
    assert ack.points == (RollbackPoint(seq=0), RollbackPoint(seq=2, deps={"a": 3})), \
        "the state after batch 2 holds a's lost seq 5"


# -- frontend ----------------------------------------------------------------------------------

def test_frontend_releases_a_reply_only_when_durable() -> None:
    for mode, durable_ops in ((Mode.NSPB, ["b"]), (Mode.STRAWMAN, ["a", "b"]), (Mode.BARE, [])):
        fe = FrontendNode()
        fe.on_message("manager", Configure(config=config(mode)))
        rid, out = fe.submit(ClientRequest(inputs={"a": P}))
        assert sends(out, Data)[0].dst == "a.p0"
        out = fe.on_message("b.p0", Data(src_op="b", records=(rec(rid, 1, a=1, s=1, b=1),), cv=1))
        replies = [e for e in out if isinstance(e, Reply)]
        for op in durable_ops:
            assert not replies
            out = fe.on_message(f"{op}.b0", Durable(op=op, epoch=0, seq=1))
            replies = [e for e in out if isinstance(e, Reply)]
        assert [r.request_id for r in replies] == [rid]


def test_frontend_rejects_requests_for_unknown_entries() -> None:
    fe = FrontendNode()
    fe.on_message("manager", Configure(config=config()))
    with pytest.raises(ValueError, match="entry operators"):
        fe.submit(ClientRequest(inputs={"s": P}))


# -- manager -----------------------------------------------------------------------------------

def test_recovery_rounds_promote_the_backup_and_follow_taint() -> None:
    cfg = config()
    clock = iter(range(100))
    mgr = Coordinator(clock=lambda: float(next(clock)))
    mgr.deploy(cfg, spares=["spare.0"])
    out = mgr.on_replica_failed("a", "a.p0")
    assert Kill("a.p0") in out
    freeze = sends(out, Freeze)
    assert [s.dst for s in freeze] == ["a.b0"], "a's live backup alone decides a's durable point"
    out = mgr.on_message("a.b0", FreezeAck(recovery=1, node="a.b0", applied={"a": 4}))
    fence = sends(out, Fence)
    assert fence[0].msg.fences == {"a": FencePoint(1, 4)}
    assert {s.dst for s in fence} == {"a.b0", "s.s0", "b.p0", "b.b0", FRONTEND}
    for s in fence:
        out = mgr.on_message(s.dst, FenceAck(recovery=1, round=1, node=s.dst,
                                             tainted=("b",) if s.dst == "b.p0" else ()))
    assert [s.dst for s in sends(out, Freeze)] == ["b.b0"], "b consumed lost speculation"
    out = mgr.on_message("b.b0", FreezeAck(recovery=1, node="b.b0", applied={"b": 3}))
    fence = sends(out, Fence)
    assert fence[0].msg.fences == {"b": FencePoint(1, 3)}
    for s in fence:
        out = mgr.on_message(s.dst, FenceAck(recovery=1, round=2, node=s.dst))
    resume = sends(out, Resume)
    new = resume[0].msg.config.placements
    assert (new["a"].primary, new["a"].backup, new["a"].start_seq) == ("a.b0", "spare.0", 4)
    assert (new["b"].primary, new["b"].backup, new["b"].start_seq) == ("b.b0", "b.p0", 3)
    for s in resume:
        out = mgr.on_message(s.dst, ResumeAck(recovery=1, node=s.dst))
    done = [e for e in out if isinstance(e, RecoveryDone)]
    assert done and done[0].promoted == ("a", "b") and not mgr.busy


def test_a_rollback_keeps_the_newest_retained_state_whose_inputs_are_durable() -> None:
    """a's primary and b's backup fail together; b's primary consumed a's lost speculation.
    b rolls back to the newest state it retained that depends only on durable outputs of a
    (HAMS §IV-C's s_b^{n-1}), not to the last state anyone heard b's dead backup apply: that
    backup may have applied more before it died, unheard, and a rollback below it would undo a
    durable state."""
    mgr = Coordinator(clock=lambda: 0.0)
    mgr.deploy(config(), spares=["spare.0", "spare.1"])
    out = mgr.on_replicas_failed([("a", "a.p0"), ("b", "b.b0")])
    freeze = sends(out, Freeze)
    assert {s.dst for s in freeze} == {"a.b0", "s.s0", "b.p0", FRONTEND}
    for s in freeze:
        report = FreezeAck(recovery=1, node=s.dst, applied={"a": 4} if s.dst == "a.b0" else {},
                           durable={"b": 3} if s.dst == FRONTEND else {})
        out = mgr.on_message(s.dst, report)
    fence = sends(out, Fence)
    assert fence[0].msg.fences == {"a": FencePoint(1, 4)}
    points = (RollbackPoint(seq=3, deps={"a": 2}), RollbackPoint(seq=5, deps={"a": 4}),
              RollbackPoint(seq=7, deps={"a": 6}))
    for s in fence:
        tainted = s.dst == "b.p0"
        out = mgr.on_message(s.dst, FenceAck(recovery=1, round=1, node=s.dst,
                                             tainted=("b",) if tainted else (),
                                             points=points if tainted else ()))
    fence = sends(out, Fence)
    assert fence[0].msg.fences == {"b": FencePoint(1, 5)}, "state 7 holds a's lost seq 6"
    for s in fence:
        out = mgr.on_message(s.dst, FenceAck(recovery=1, round=2, node=s.dst))
    new = sends(out, Resume)[0].msg.config.placements
    assert (new["b"].primary, new["b"].start_seq) == ("b.p0", 5)
    assert new["b"].backup in {"spare.0", "spare.1"}


def test_a_silent_node_is_declared_failed_after_the_round_timeout() -> None:
    mgr = Coordinator(clock=lambda: 0.0, round_timeout_s=0.5)
    mgr.deploy(config())
    out = mgr.on_replica_failed("s", "s.s0")
    for s in sends(out, Freeze):
        if s.dst != "b.b0":
            mgr.on_message(s.dst, FreezeAck(recovery=1, node=s.dst))
    out = mgr.on_timer("round:1:freeze:0")
    assert Kill("b.b0") in out and "b.b0" in mgr.dead
