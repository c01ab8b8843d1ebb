"""build_snapshot reuses each unchanged app's share and never a stale one."""

from __future__ import annotations

from controller.record_cache import RecordCache
from controller.snapshot import build_snapshot
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    SMALL,
    app_record,
    families,
    replica,
    server_record,
)


def test_a_changed_record_or_capacity_is_seen_by_the_next_snapshot() -> None:
    cache = RecordCache()
    a = app_record("a", [replica("s1", LARGE), replica("s2", SMALL, Role.WARM)],
                   serving=("s1", LARGE))
    servers = {s: server_record(s) for s in ("s1", "s2", "s3")}
    cache.load({"a": a.model_dump_json()}, {s: r.model_dump_json() for s, r in servers.items()},
               1)
    view = cache.view()
    first = build_snapshot(families(), view.servers, view.apps)
    assert first.primary_by_app["a"].server_id == "s1"
    again = build_snapshot(families(), view.servers, view.apps)
    assert again.placements == first.placements

    a.serving = ("s2", SMALL)  # switched to its backup
    cache.written(2, apps=[("a", a.model_dump_json())])
    view = cache.view()
    switched = build_snapshot(families(), view.servers, view.apps)
    assert switched.primary_by_app["a"].server_id == "s2"
    assert {(p.server_id, p.role) for p in switched.placements} == {
        ("s1", Role.UPGRADE), ("s2", Role.PRIMARY)}

    # Every server shrinks below the app's primary: it is left out, not reused as it was.
    small = {s: server_record(s, memory_mb=50.0) for s in servers}
    shrunk = build_snapshot(families(), small, view.apps)
    assert shrunk.apps == () and shrunk.placements == ()
    # And back: the app is planned again.
    assert build_snapshot(families(), view.servers, view.apps).apps[0].app_id == "a"
