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


def test_the_best_held_model_of_an_app_is_adopted_and_a_loading_one_is_kept_loading() -> None:
    apps = {"a": _app("a", [], serving=None), "b": _app("b", [], serving=None)}
    inventory = [_item("a", "small"), _item("a", "large"), _item("a", "medium"),
                 _item("b", "large", ModelState.LOADING), _item("ghost", "large"),
                 _item("a", "small", ModelState.UNLOADING)]
    result = take_back("s1", inventory, apps, _accuracy)
    assert result.adopted == (("a", "large"),) and result.backups == ()
    assert [r.variant for r in apps["a"].replicas] == ["large"]
    assert result.loading == (("b", "large"),)
    assert [(r.variant, r.role, r.state) for r in apps["b"].replicas] == [
        ("large", Role.UPGRADE, ModelState.LOADING)]


def test_a_model_already_in_the_records_is_not_adopted_twice() -> None:
    home = _replica("s1", "large", Role.PRIMARY, ModelState.LOADING)
    apps = {"a": _app("a", [home], serving=None)}
    result = take_back("s1", [_item("a", "large")], apps, _accuracy)
    assert result.adopted == ()
    assert apps["a"].replicas == [home]


# --- in-flight loads (issue 21): never an interim over a target, never a target a stray ----


def test_a_loading_target_held_is_kept_and_the_held_interim_serves_meanwhile() -> None:
    """The server of a recovery, declared failed mid-recovery, forgot both; both come back."""
    apps = {"a": _app("a", [], serving=None)}
    inventory = [_item("a", "small"), _item("a", "large", ModelState.LOADING)]
    result = take_back("s2", inventory, apps, _accuracy)
    assert result.adopted == (("a", "small"),)  # serves at once, as an interim
    assert result.loading == (("a", "large"),)
    assert sorted((r.variant, r.role, r.state) for r in apps["a"].replicas) == [
        ("large", Role.UPGRADE, ModelState.LOADING), ("small", Role.INTERIM, ModelState.READY)]


def test_a_held_loading_target_beats_a_new_recovery_of_equal_rank_which_is_retired() -> None:
    interim = _replica("s3", "small", Role.INTERIM, ModelState.LOADING)
    target = _replica("s3", "large", Role.UPGRADE, ModelState.LOADING)
    apps = {"a": _app("a", [interim, target], serving=None, home=("s9", "large"))}
    inventory = [_item("a", "small"), _item("a", "large", ModelState.LOADING)]
    result = take_back("s2", inventory, apps, _accuracy)
    assert result.loading == (("a", "large"),) and result.adopted == (("a", "small"),)
    assert interim.state is ModelState.UNLOADING and target.state is ModelState.UNLOADING
    assert result.retired == ()  # both still loading: unloaded when their loads complete


def test_with_only_a_loading_target_held_what_is_on_its_way_stays_as_interims() -> None:
    target = _replica("s3", "medium", Role.UPGRADE, ModelState.LOADING)
    apps = {"a": _app("a", [target], serving=None)}
    result = take_back("s1", [_item("a", "large", ModelState.LOADING)], apps, _accuracy)
    assert result.loading == (("a", "large"),)
    # Whichever load ends first serves; the medium one never goes over the large one.
    assert (target.role, target.state) == (Role.INTERIM, ModelState.LOADING)


def test_a_held_interim_serves_while_a_better_recovery_target_loads_elsewhere() -> None:
    interim = _replica("s3", "small", Role.INTERIM, ModelState.LOADING)
    target = _replica("s3", "large", Role.UPGRADE, ModelState.LOADING)
    apps = {"a": _app("a", [interim, target], serving=None, home=("s9", "large"))}
    result = take_back("s2", [_item("a", "small")], apps, _accuracy)
    assert result.adopted == (("a", "small"),)
    held = apps["a"].replica("s2", "small")
    assert held is not None and held.role is Role.INTERIM  # never promoted over the target
    assert interim.state is ModelState.UNLOADING  # the held one does its job
    assert (target.role, target.state) == (Role.UPGRADE, ModelState.LOADING)


def test_a_held_model_below_home_with_nothing_else_serves_as_an_interim() -> None:
    apps = {"a": _app("a", [], serving=None)}  # home s1/large is down
    result = take_back("s2", [_item("a", "small")], apps, _accuracy)
    assert result.adopted == (("a", "small"),)
    held = apps["a"].replica("s2", "small")
    assert held is not None and held.role is Role.INTERIM
