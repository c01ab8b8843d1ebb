"""The SDK's routing table: events, replays, gaps, and reads that race the event stream."""

from __future__ import annotations

from typing import Any

from understudy.sdk.locations import location_of_event
from understudy.sdk.routes import RouteTable


def event(seq: int, app: str, kind: str, server: str | None = None, variant: str = "v",
          **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"seq": seq, "app_id": app, "kind": kind, **extra}
    if server is not None:
        doc.update(server_id=server, endpoint={"http": f"{server}:8000", "grpc": f"{server}:8001"},
                   model_name=f"{app}__{variant}", variant=variant, accuracy=0.9)
    return doc


def view(server: str | None, app: str = "a", variant: str = "v") -> dict[str, Any]:
    if server is None:
        return {"app_id": app, "serving": None, "reason": "no room"}
    return {"app_id": app, "serving": {
        "server_id": server, "endpoint": {"http": f"{server}:8000", "grpc": f"{server}:8001"},
        "model_name": f"{app}__{variant}", "variant": variant, "accuracy": 0.9}}


def table_with(app: str, server: str) -> RouteTable:
    table = RouteTable()
    table.begin_read(app)
    table.end_read(app, view(server, app))
    return table


def test_a_switch_moves_the_app_and_says_which_server_it_left() -> None:
    table = table_with("a", "s1")
    change = table.apply(event(1, "a", "warm_switch", "s2", failed_server="s1"))
    assert change is not None and change.left_server == "s1"
    route = table.get("a")
    assert route is not None and route.serving is not None
    assert route.serving.server_id == "s2" and route.seq == 1


def test_replays_untracked_apps_and_backups_change_nothing() -> None:
    table = table_with("a", "s1")
    assert table.apply(event(5, "a", "warm_switch", "s2")) is not None
    assert table.apply(event(5, "a", "warm_switch", "s2")) is None  # the replay
    assert table.apply(event(4, "a", "failback", "s1")) is None  # older than the app's last
    assert table.apply(event(6, "b", "serving", "s3")) is None  # an app not in use
    assert table.get("b") is None
    assert table.apply(event(7, "a", "backup_ready", "s3")) is None
    route = table.get("a")
    assert route is not None and route.serving is not None and route.serving.server_id == "s2"
    assert table.last_seq == 7


def test_an_unrecoverable_app_is_served_nowhere_with_its_reason() -> None:
    table = table_with("a", "s1")
    change = table.apply(event(1, "a", "unrecoverable", reason="no room left"))
    assert change is not None and change.after is None and change.left_server is None
    route = table.get("a")
    assert route is not None and route.serving is None and route.reason == "no room left"


def test_a_deleted_app_leaves_the_table() -> None:
    table = table_with("a", "s1")
    change = table.apply(event(1, "a", "deleted"))
    assert change is not None and change.deleted
    assert table.get("a") is None


def test_a_skipped_sequence_number_is_a_gap() -> None:
    table = RouteTable()
    assert not table.gap(event(9, "x", "serving", "s1"))  # nothing seen yet
    table.apply(event(9, "x", "serving", "s1"))
    assert not table.gap(event(10, "x", "serving", "s1"))
    assert table.gap(event(12, "x", "serving", "s1"))


def test_events_that_arrive_during_a_read_apply_after_it() -> None:
    table = RouteTable()
    table.apply(event(3, "z", "serving", "s9"))
    table.begin_read("a")
    # The stream moves the app while its view is on the way; the view is older.
    assert table.apply(event(4, "a", "warm_switch", "s2")) is None
    change = table.end_read("a", view("s1"))
    assert change is not None and change.after is not None and change.after.server_id == "s2"
    route = table.get("a")
    assert route is not None and route.seq == 4
    # A replay of the held event changes nothing now.
    assert table.apply(event(4, "a", "warm_switch", "s2")) is None


def test_a_read_again_of_a_deleted_app_deletes_it_and_a_failed_read_keeps_the_route() -> None:
    table = table_with("a", "s1")
    table.begin_read("a")
    table.apply(event(1, "a", "warm_switch", "s2"))
    change = table.abort_read("a")  # the controller could not answer: the held event applies
    assert change is not None and change.after is not None and change.after.server_id == "s2"
    table.begin_read("a")
    change = table.end_read("a", None)
    assert change is not None and change.deleted and table.get("a") is None


def test_the_rule_of_which_events_move_an_app() -> None:
    assert location_of_event(event(1, "a", "unplaced")) == (True, None)
    assert location_of_event(event(1, "a", "backup_ready", "s2")) == (False, None)
    moves, location = location_of_event(event(7, "a", "failback", "s1"))
    assert moves and location is not None and location.seq == 7
