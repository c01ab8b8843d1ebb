"""Taking back a server after a false alarm: which models are re-adopted, what is retired."""

from __future__ import annotations

from controller.decide.takeback import take_back
from controller.records import AppRecord, AppSpec, Replica
from policies.model import Role
from understudy.wire.protocol import InventoryItem, ModelState

ACCURACY = {"small": 0.6, "medium": 0.8, "large": 0.9}


def _accuracy(_family: str, variant: str) -> float:
    return ACCURACY[variant]


def _item(app_id: str, variant: str, state: ModelState = ModelState.READY) -> InventoryItem:
    return InventoryItem(model_name=f"{app_id}__{variant}", app_id=app_id, variant=variant,
                         state=state)


def _replica(server: str, variant: str, role: Role,
             state: ModelState = ModelState.READY) -> Replica:
    return Replica(server_id=server, variant=variant, role=role, state=state,
                   accuracy=ACCURACY[variant])


def _app(app_id: str, replicas: list[Replica], serving: tuple[str, str] | None,
         home: tuple[str, str] = ("s1", "large")) -> AppRecord:
    return AppRecord(spec=AppSpec(app_id=app_id, family="f"), replicas=replicas,
                     serving=serving, home=home)


def test_a_promoted_warm_backup_becomes_a_backup_again_and_the_home_model_is_adopted() -> None:
    backup = _replica("s2", "small", Role.PRIMARY)  # promoted by the failover
    apps = {"a": _app("a", [backup], serving=("s2", "small"))}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == (("a", "large"),)
    assert result.retired == ()
    assert backup.role is Role.WARM and backup.state is ModelState.READY
    adopted = apps["a"].replica("s1", "large")
    assert adopted is not None
    assert (adopted.role, adopted.state) == (Role.UPGRADE, ModelState.READY)


def test_interim_and_target_of_the_failover_are_retired() -> None:
    interim = _replica("s2", "small", Role.INTERIM)
    target = _replica("s2", "medium", Role.UPGRADE, ModelState.LOADING)
    stale = _replica("s3", "small", Role.INTERIM)  # another ready interim, not serving
    apps = {"a": _app("a", [interim, target, stale], serving=("s2", "small"))}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == (("a", "large"),)
    # The serving interim is left to advance() (it retires it when it switches); the ready
    # interim that does not serve is retired here; the loading target is marked so that its
    # load, when it completes, unloads it.
    assert result.retired == (("a", "s3", "small"),)
    assert interim.state is ModelState.READY
    assert target.state is ModelState.UNLOADING and stale.state is ModelState.UNLOADING


def test_a_model_no_better_than_what_serves_comes_back_as_a_warm_backup() -> None:
    target = _replica("s2", "large", Role.PRIMARY)
    apps = {"a": _app("a", [target], serving=("s2", "large"), home=("s3", "large"))}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == () and result.retired == ()
    assert result.backups == (("a", "large"),)
    held = apps["a"].replica("s1", "large")
    assert held is not None and (held.role, held.state) == (Role.WARM, ModelState.READY)
    assert target.role is Role.PRIMARY


def test_the_home_model_serves_again_over_an_equally_accurate_promoted_backup() -> None:
    backup = _replica("s2", "large", Role.PRIMARY)  # a full-size warm backup
    apps = {"a": _app("a", [backup], serving=("s2", "large"), home=("s1", "large"))}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == (("a", "large"),)
    assert backup.role is Role.WARM


def test_a_better_replica_on_its_way_is_not_preempted() -> None:
    interim = _replica("s2", "small", Role.INTERIM)
    target = _replica("s2", "large", Role.UPGRADE, ModelState.LOADING)
    apps = {"a": _app("a", [interim, target], serving=("s2", "small"))}
    result = take_back("s1", [_item("a", "medium")], apps, _accuracy)
    assert result.adopted == ()
    assert result.backups == (("a", "medium"),)
    assert target.state is ModelState.LOADING


def test_the_best_held_model_of_an_app_is_adopted_and_only_ready_ones_count() -> None:
    apps = {"a": _app("a", [], serving=None), "b": _app("b", [], serving=None)}
    inventory = [_item("a", "small"), _item("a", "large"), _item("a", "medium"),
                 _item("b", "large", ModelState.LOADING), _item("ghost", "large")]
    result = take_back("s1", inventory, apps, _accuracy)
    assert result.adopted == (("a", "large"),) and result.backups == ()
    assert [r.variant for r in apps["a"].replicas] == ["large"]
    assert apps["b"].replicas == []


def test_a_model_already_in_the_records_is_not_adopted_twice() -> None:
    home = _replica("s1", "large", Role.PRIMARY, ModelState.LOADING)
    apps = {"a": _app("a", [home], serving=None)}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == ()
    assert apps["a"].replicas == [home]
