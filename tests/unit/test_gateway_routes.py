"""The gateway's routing table: events and snapshots in, routes out (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.routes import RouteChange, RoutingTable
from gateway.routes import _same_place as same_place
from understudy.client import Location, location_of_event

ENDPOINTS = {"s1": ("127.0.0.1:8001", "127.0.0.1:9001"), "s2": ("127.0.0.1:8002", "127.0.0.1:9002"),
             "s3": ("127.0.0.1:8003", "127.0.0.1:9003")}


def event(seq: int, app: str, kind: str, server: str | None = None, variant: str = "v_large",
          **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"seq": seq, "app_id": app, "kind": kind, "reason": "",
                           "server_id": server, "endpoint": None, "model_name": None,
                           "variant": None, "role": None, "accuracy": None}
    if server is not None:
        http, grpc = ENDPOINTS[server]
        doc.update(endpoint={"http": http, "grpc": grpc}, model_name=f"{app}__{variant}",
                   variant=variant, role="primary", accuracy=0.9)
    doc.update(extra)
    return doc


def view(app: str, server: str | None, variant: str = "v_large",
         backups: tuple[tuple[str, str, str], ...] = (), reason: str = "") -> dict[str, Any]:
    serving = None
    if server is not None:
        http, grpc = ENDPOINTS[server]
        serving = {"server_id": server, "variant": variant, "role": "primary", "accuracy": 1.0,
                   "model_name": f"{app}__{variant}", "endpoint": {"http": http, "grpc": grpc}}
    return {"app_id": app, "serving": serving, "reason": reason, "status": "serving",
            "backups": [{"server_id": s, "variant": v, "state": st, "role": "warm",
                         "accuracy": 0.5} for s, v, st in backups]}


SERVERS = {s: {"server_id": s, "http": h, "grpc": g, "state": "up"}
           for s, (h, g) in ENDPOINTS.items()}


def test_serving_events_set_the_route_and_report_the_move() -> None:
    table = RoutingTable()
    first = table.apply(event(1, "a", "serving", "s1"))
    assert first == RouteChange("a", None, table.apps["a"].serving)
    route = table.apps["a"].serving
    assert route is not None and (route.server_id, route.model_name, route.http) == (
        "s1", "a__v_large", "127.0.0.1:8001")
    moved = table.apply(event(2, "a", "warm_switch", "s2", "v_small", failed_server="s1"))
    assert moved is not None and moved.left_server == "s1"
    assert table.apps["a"].serving.server_id == "s2"  # type: ignore[union-attr]
    assert table.apps["a"].version == 2 and table.last_seq == 2


def test_a_backup_is_kept_per_server_consumed_by_a_switch_and_lost_with_its_server() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    change = table.apply(event(2, "a", "backup_ready", "s2", "v_small", role="warm"))
    assert change is not None and change.before == change.after  # serving did not move
    assert set(table.apps["a"].backups) == {"s2"}
    assert table.apps["a"].backups["s2"].model_name == "a__v_small"
    table.apply(event(3, "a", "backup_ready", "s3", "v_small", role="warm"))
    table.apply(event(4, "a", "warm_switch", "s2", "v_small", failed_server="s1"))
    assert set(table.apps["a"].backups) == {"s3"}  # the promoted backup is no backup
    table.apply(event(5, "a", "interim_serving", "s1", "v_tiny", failed_server="s3"))
    assert table.apps["a"].backups == {}  # s3 failed: its backup is gone


def test_replayed_and_duplicate_events_change_nothing() -> None:
    events = [event(1, "a", "serving", "s1"), event(2, "b", "serving", "s2"),
              event(3, "a", "warm_switch", "s3", failed_server="s1"),
              event(4, "a", "backup_ready", "s2", "v_small")]
    table = RoutingTable()
    for e in events:
        table.apply(e)
    before = table.to_doc()
    versions = {a: r.version for a, r in table.apps.items()}
    for e in events:  # a reconnect that replays from an older seq
        assert table.apply(e) is None
    assert table.to_doc() == before
    assert {a: r.version for a, r in table.apps.items()} == versions


def test_unrecoverable_unplaced_and_deleted_apps() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    gone = table.apply(event(2, "a", "unrecoverable", reason="no room left"))
    assert gone is not None and gone.after is None and gone.left_server is None
    assert table.apps["a"].serving is None and table.apps["a"].reason == "no room left"
    table.apply(event(3, "b", "unplaced", reason="too big"))
    assert table.apps["b"].serving is None and table.apps["b"].reason == "too big"
    deleted = table.apply(event(4, "a", "deleted", reason="deleted by request"))
    assert deleted is not None and deleted.deleted and "a" not in table.apps
    assert table.apply(event(5, "zzz", "deleted")) is None  # never known: nothing to do
    back = table.apply(event(6, "a", "serving", "s2"))  # registered again
    assert back is not None and table.apps["a"].serving.server_id == "s2"  # type: ignore[union-attr]


def test_events_that_name_no_place_move_nothing_but_count() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    assert table.apply(event(2, "a", "take_back")) is None
    assert table.apps["a"].serving.server_id == "s1"  # type: ignore[union-attr]
    assert table.last_seq == 2
    same = table.apply(event(3, "a", "serving", "s1"))  # the same replica again
    assert same is None and table.apps["a"].version == 1


def test_a_new_variant_on_the_same_server_is_a_change_but_leaves_no_server() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "interim_serving", "s1", "v_tiny"))
    change = table.apply(event(2, "a", "upgraded", "s1", "v_large"))
    assert change is not None and change.left_server is None
    assert table.apps["a"].serving.model_name == "a__v_large"  # type: ignore[union-attr]


def test_snapshot_replaces_the_table_and_only_later_events_apply() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    table.apply(event(2, "old", "serving", "s1"))
    changes = table.apply_snapshot(
        [view("a", "s2", backups=(("s3", "v_small", "ready"), ("s1", "v_small", "loading"))),
         view("c", None, reason="no room")], SERVERS)
    assert {c.app_id: c.deleted for c in changes} == {"a": False, "old": True}
    assert table.apps["a"].serving.server_id == "s2"  # type: ignore[union-attr]
    assert set(table.apps["a"].backups) == {"s3"}  # only ready backups
    assert table.apps["a"].backups["s3"].http == "127.0.0.1:8003"
    assert table.apps["c"].serving is None and table.apps["c"].reason == "no room"
    assert "old" not in table.apps
    # An event already reflected in the snapshot (seq <= last seen) is not applied again.
    assert table.apply(event(2, "a", "serving", "s1")) is None
    assert table.apply(event(3, "a", "warm_switch", "s3", "v_small")) is not None


def test_snapshot_skips_backups_on_failed_or_unknown_servers() -> None:
    servers = {**SERVERS, "s3": {**SERVERS["s3"], "state": "failed"}}
    table = RoutingTable()
    table.apply_snapshot([view("a", "s1", backups=(("s3", "v_small", "ready"),
                                                   ("s9", "v_small", "ready"),
                                                   ("s2", "v_small", "ready")))], servers)
    assert set(table.apps["a"].backups) == {"s2"}


def test_the_table_survives_a_round_trip_through_its_document() -> None:
    table = RoutingTable()
    table.apply(event(1, "a", "serving", "s1"))
    table.apply(event(2, "a", "backup_ready", "s2", "v_small"))
    table.apply(event(3, "b", "unrecoverable", reason="nothing fits"))
    copy = RoutingTable.from_doc(table.to_doc())
    assert copy.to_doc() == table.to_doc()
    assert copy.last_seq == 3 and copy.apps["b"].reason == "nothing fits"
    assert copy.apply(event(2, "a", "serving", "s3")) is None  # seqs kept: no replay regress


@pytest.mark.parametrize("doc", [{}, {"version": 99}, {"version": 1, "apps": {}},
                                 {"version": 1, "last_seq": 1, "apps": {"a": {"serving": 3}}}])
def test_a_malformed_document_is_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RoutingTable.from_doc(doc)


def test_the_sdk_and_the_gateway_share_the_event_rule() -> None:
    assert location_of_event(event(1, "a", "unrecoverable")) == (True, None)
    assert location_of_event(event(1, "a", "deleted")) == (True, None)
    assert location_of_event(event(1, "a", "backup_ready", "s2")) == (False, None)
    assert location_of_event(event(1, "a", "take_back")) == (False, None)
    moves, location = location_of_event(event(7, "a", "failback", "s1"))
    assert moves and location == Location("127.0.0.1:8001", "127.0.0.1:9001", "a__v_large",
                                          "s1", "v_large", 0.9, 7)


def test_same_place_compares_the_replica_not_its_metadata() -> None:
    a = Location("h:1", "g:1", "a__v", "s1", "v", 0.9, 1)
    assert same_place(a, Location("h:1", "g:1", "a__v", "s1", "v", 0.8, 5))
    assert not same_place(a, Location("h:2", "g:1", "a__v", "s1", "v", 0.9, 1))
    assert same_place(None, None) and not same_place(a, None)
