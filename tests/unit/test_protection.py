"""Protection of an app by extra instances and parity models: the spec, the pure placement
(``policies.protection``: independence), and the controller's converging decision."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controller.decide.apps import needs_placement
from controller.decide.protection import decide_protection
from controller.records import AppRecord, AppSpec, Replica, ServerState
from controller.snapshot import application, build_snapshot
from policies.actions import LoadVariant, UnloadVariant
from policies.model import Role
from policies.protection import ProtectionNeed, independent, place_protection
from tests.unit.controller_harness import (
    LARGE,
    app_record,
    families,
    replica,
    server_record,
)
from understudy.wire.protocol import ModelState

FAMILIES = families()
PARITY = f"{LARGE}_parity_k2"
NOW = 100.0


def servers(*failed: str, memory_mb: float = 1000.0) -> dict[str, Any]:
    return {s: server_record(s, memory_mb, ServerState.FAILED if s in failed else ServerState.UP)
            for s in ("s1", "s2", "s3", "s4")}


def parity(server_id: str, variant: str = PARITY,
           state: ModelState = ModelState.READY) -> Replica:
    return Replica(server_id=server_id, variant=variant, role=Role.PARITY, state=state,
                   accuracy=0.0, since=0.0)


def protected(replicas: list[Replica], protection: str = "parity:2", **spec: Any) -> AppRecord:
    return app_record("a", replicas, serving=("s1", LARGE), variant=LARGE,
                      protection=protection, **spec)


def decide(record: AppRecord, *failed: str, memory_mb: float = 1000.0,
           others: tuple[AppRecord, ...] = ()) -> tuple[Any, tuple[str, ...]]:
    known = servers(*failed, memory_mb=memory_mb)
    apps = {record.app_id: record, **{o.app_id: o for o in others}}
    snapshot = build_snapshot(FAMILIES, known, apps)
    return decide_protection(record, snapshot, known, FAMILIES, NOW)


def loads(decision: Any) -> list[tuple[str, str, Role]]:
    return [(a.server_id, a.variant, a.role) for s in decision.stages for a in s.actions
            if isinstance(a, LoadVariant)]


def unloads(decision: Any) -> list[tuple[str, str]]:
    return [(a.server_id, a.variant) for s in decision.stages for a in s.actions
            if isinstance(a, UnloadVariant)]


# --- the spec -------------------------------------------------------------------------------

def test_protection_modes_are_validated_and_parity_implies_k_instances() -> None:
    spec = AppSpec(app_id="a", family="f", protection="parity:3")
    assert (spec.parity_k, spec.instance_count, spec.parity_count) == (3, 3, 1)
    assert not spec.warm_protected and spec.parity_encoder == "addition"
    both = AppSpec(app_id="a", family="f", protection="replicas+parity:2:concat", instances=4)
    assert (both.parity_count, both.warm_protected, both.parity_encoder) == (
        2, True, "concatenation")
    assert AppSpec(app_id="a", family="f").instance_count == 1
    for bad in ({"protection": "parity:5"}, {"protection": "parity"},
                {"protection": "parity:2", "instances": 3}, {"instances": 0},
                {"instances": 9}):
        with pytest.raises(ValidationError):
            AppSpec(app_id="a", family="f", **bad)


def test_a_critical_app_protected_by_parity_alone_gets_no_warm_backup() -> None:
    only_parity = protected([replica("s1", LARGE)], critical=True)
    both = protected([replica("s1", LARGE)], protection="replicas+parity:2", critical=True)
    assert not application(only_parity).critical and application(both).critical


# --- the pure placement ---------------------------------------------------------------------

def test_parity_models_go_apart_from_every_instance_and_from_each_other() -> None:
    record = protected([replica("s1", LARGE)], instances=4)
    snapshot = build_snapshot(FAMILIES, servers(memory_mb=2000), {"a": record})
    plan = place_protection(snapshot, ProtectionNeed(
        "a", LARGE, instances=1, parity=2, parity_variant=PARITY,
        instance_servers=frozenset({"s1"})))
    by_role = {role: [p.server_id for p in plan.placements if p.role is role]
               for role in (Role.INSTANCE, Role.PARITY)}
    assert len(by_role[Role.INSTANCE]) == 1 and len(by_role[Role.PARITY]) == 2
    instance_servers = {"s1", *by_role[Role.INSTANCE]}
    assert all(independent(s, instance_servers) for s in by_role[Role.PARITY])
    assert len(set(by_role[Role.PARITY])) == 2 and plan.unplaced == ()


def test_without_an_independent_server_the_parity_model_is_not_placed() -> None:
    record = protected([replica("s1", LARGE)], instances=4)
    snapshot = build_snapshot(FAMILIES, servers("s4"), {"a": record})
    plan = place_protection(snapshot, ProtectionNeed(
        "a", LARGE, parity=1, parity_variant=PARITY,
        instance_servers=frozenset({"s1", "s2", "s3"})))
    assert plan.placements == () and "apart from the app's instances" in plan.unplaced[0]


def test_placement_honours_room_and_exclusions() -> None:
    record = protected([replica("s1", LARGE)], excluded_servers=["s2"])
    full = app_record("b", [replica("s3", LARGE)], serving=("s3", LARGE), variant=LARGE)
    snapshot = build_snapshot(FAMILIES, servers(memory_mb=500), {"a": record, "b": full})
    plan = place_protection(snapshot, ProtectionNeed(
        "a", LARGE, instances=1, parity=1, parity_variant=PARITY,
        instance_servers=frozenset({"s1"})))
    # s2 excluded, s3 full (400 of 500 MB used): s4 takes the instance, nothing is left.
    assert [(p.server_id, p.role) for p in plan.placements] == [("s4", Role.INSTANCE)]
    assert len(plan.unplaced) == 1


# --- the controller's decision --------------------------------------------------------------

def test_a_new_parity_app_gets_its_second_instance_and_an_independent_parity_model() -> None:
    record = protected([replica("s1", LARGE)])
    decision, unplaced = decide(record)
    placed = loads(decision)
    assert [role for _, _, role in placed] == [Role.INSTANCE, Role.PARITY]
    (instance_server, _, _), (parity_server, parity_variant, _) = placed
    assert instance_server != "s1" and parity_server not in {"s1", instance_server}
    assert parity_variant == PARITY and unplaced == ()
    assert {(r.role, r.state) for r in record.replicas if r.server_id != "s1"} == {
        (Role.INSTANCE, ModelState.LOADING), (Role.PARITY, ModelState.LOADING)}
    assert decide(record)[0] is None  # converged: nothing more


def test_a_parity_model_lost_with_its_server_is_placed_again_elsewhere() -> None:
    record = protected([replica("s1", LARGE), replica("s2", LARGE, Role.INSTANCE),
                        parity("s3")])
    record.replicas = [r for r in record.replicas if r.server_id != "s3"]  # failover forgot it
    decision, _ = decide(record, "s3")
    assert loads(decision) == [("s4", PARITY, Role.PARITY)]


def test_a_replica_on_a_server_gone_down_is_forgotten_and_announced() -> None:
    record = protected([replica("s1", LARGE), replica("s2", LARGE, Role.INSTANCE),
                        parity("s3")])
    decision, _ = decide(record, "s2")
    assert [e.kind for e in decision.events] == ["instance_removed"]
    assert loads(decision) == [("s4", LARGE, Role.INSTANCE)]
    assert all(r.server_id != "s2" for r in record.replicas)


def test_a_parity_model_next_to_an_instance_is_moved_away() -> None:
    # The app's primary recovered onto the parity model's server.
    record = protected([replica("s3", LARGE), replica("s2", LARGE, Role.INSTANCE),
                        parity("s3")])
    record.serving = ("s3", LARGE)
    decision, _ = decide(record, "s1")
    assert unloads(decision) == [("s3", PARITY)]
    assert loads(decision) == [("s4", PARITY, Role.PARITY)]
    assert [e.kind for e in decision.events] == ["parity_removed"]


def test_an_app_left_with_only_instances_still_needs_its_primary() -> None:
    record = protected([replica("s2", LARGE, Role.INSTANCE), parity("s3")])
    record.serving = None
    assert needs_placement(record)
