"""The store's in-memory copy of the records (``controller.record_cache.RecordCache``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.record_cache import RecordCache, RecordsView
from controller.records import AppRecord, AppSpec, AppStatus, Replica, ServerRecord
from policies.model import Role


def _app(app_id: str, reason: str = "") -> AppRecord:
    return AppRecord(spec=AppSpec(app_id=app_id, family="f"), reason=reason,
                     replicas=[Replica(server_id="s1", variant="v", role=Role.PRIMARY)])


def _raw(app_id: str, reason: str = "") -> tuple[str, str]:
    return app_id, _app(app_id, reason).model_dump_json()


def _server(server_id: str, site: str = "x") -> tuple[str, str]:
    record = ServerRecord(server_id=server_id, site_id=site, capacity={"memory_mb": 1.0})
    return server_id, record.model_dump_json()


def _loaded(*app_ids: str, revision: int = 7) -> RecordCache:
    cache = RecordCache()
    cache.load(dict(_raw(a) for a in app_ids), dict([_server("s1")]), revision)
    return cache


def test_written_records_are_read_back_in_id_order() -> None:
    cache = _loaded("m", "c")
    assert cache.written(8, apps=[_raw("a"), _raw("z"), _raw("m", "changed")],
                         servers=[_server("s2", "y")])
    assert cache.written(9, deleted_apps=["c", "never-there"])
    view = cache.view()
    assert view.revision == 9 and list(view.app_ids) == ["a", "m", "z"] == list(view.apps)
    assert view.apps["m"].reason == "changed"
    assert {s: r.site_id for s, r in view.servers.items()} == {"s1": "x", "s2": "y"}
    assert cache.app_ids() == ["a", "m", "z"] and cache.copy_app("c") is None


def test_a_write_that_does_not_follow_the_cached_revision_empties_the_cache() -> None:
    cache = _loaded("a")
    # Revision 9 after 7: a write the cache never saw happened in between.
    assert not cache.written(9, apps=[_raw("b")])
    assert not cache.loaded and cache.app_ids() == [] and cache.copy_app("a") is None
    # Nothing is applied while it is not loaded either: the store loads it afresh.
    assert not cache.written(10, apps=[_raw("c")])
    cache.load(dict([_raw("a"), _raw("b"), _raw("c")]), {}, 10)
    assert cache.loaded and cache.app_ids() == ["a", "b", "c"]


def test_shared_records_are_read_only_and_copies_are_private() -> None:
    cache = _loaded("a")
    shared = cache.view().apps["a"]
    with pytest.raises(ValidationError):
        shared.status = AppStatus.SERVING
    with pytest.raises(ValidationError):
        shared.replicas[0].state = "ready"  # type: ignore[assignment]
    with pytest.raises(ValidationError):
        shared.put_replica(Replica(server_id="s2", variant="v", role=Role.WARM))
    with pytest.raises(ValidationError):
        cache.view().servers["s1"].connected = True
    copy = cache.copy_app("a")
    assert copy is not None
    copy.status = AppStatus.SERVING
    copy.replicas.clear()
    assert cache.view().apps["a"].status is AppStatus.PENDING
    assert len(cache.view().apps["a"].replicas) == 1
    assert cache.copy_apps()["a"].status is AppStatus.PENDING
    assert cache.copy_servers()["s1"] is not cache.copy_servers()["s1"]


def test_a_view_keeps_its_records_and_unchanged_records_keep_their_identity() -> None:
    cache = _loaded("a", "b")
    before = cache.view()
    assert cache.view() is before  # built once per revision
    assert cache.written(8, apps=[_raw("b", "new")])
    after = cache.view()
    assert before.apps["b"].reason == "" and list(before.apps) == ["a", "b"]
    assert after.apps["b"].reason == "new"
    assert after.apps["a"] is before.apps["a"]  # unchanged: the same parsed record
    assert after.apps["b"] is not before.apps["b"]


_IDS = st.sampled_from([f"app-{i}" for i in range(12)])
_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), _IDS, st.text("abc", max_size=3)),
    st.tuples(st.just("delete"), _IDS, st.just(""))), max_size=40)


@settings(max_examples=60, deadline=None)
@given(initial=st.sets(_IDS), ops=_OPS)
def test_the_cache_always_equals_the_records_written(initial: set[str],
                                                      ops: list[tuple[str, str, str]]) -> None:
    model = {a: _app(a).model_dump_json() for a in initial}
    cache = RecordCache()
    cache.load(model, {}, 0)
    for revision, (op, app_id, reason) in enumerate(ops, start=1):
        if op == "put":
            model[app_id] = _app(app_id, reason).model_dump_json()
            assert cache.written(revision, apps=[(app_id, model[app_id])])
        else:
            model.pop(app_id, None)
            assert cache.written(revision, deleted_apps=[app_id])
    view: RecordsView = cache.view()
    assert list(view.app_ids) == sorted(model) == cache.app_ids()
    assert {a: r.model_dump_json() for a, r in view.apps.items()} == model
    assert {a: cache.app_json(a) for a in model} == model
