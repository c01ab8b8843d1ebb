"""The list endpoints' presentation: pages, filters, rendered app views, batch results."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.record_cache import ReadOnlyAppRecord, ReadOnlyServerRecord
from controller.records import AppSpec, AppStatus, ServerState
from controller.views import (
    NEXT_CURSOR,
    AppFilter,
    RenderedViews,
    ServerFilter,
    app_view,
    batch_result,
    next_headers,
    page,
    page_of,
)
from tests.unit.controller_harness import LARGE, SMALL, app_record, replica, server_record


def _walk(ids: list[str], limit: int, keep: object = None) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        found = page(ids, cursor, limit, keep)  # type: ignore[arg-type]
        pages.append(found.ids)
        if found.next_cursor is None:
            return pages
        assert found.next_cursor == found.ids[-1]
        cursor = found.next_cursor


@settings(max_examples=100, deadline=None)
@given(ids=st.sets(st.text("abcdef", min_size=1, max_size=4)), limit=st.integers(1, 7),
       kept=st.sets(st.text("abcdef", min_size=1, max_size=4)))
def test_walking_the_pages_visits_every_kept_id_once_in_order(ids: set[str], limit: int,
                                                              kept: set[str]) -> None:
    ordered = sorted(ids)
    for keep, expected in ((None, ordered), (kept.__contains__, sorted(ids & kept))):
        pages = _walk(ordered, limit, keep)
        assert [i for p in pages for i in p] == expected
        assert all(len(p) <= limit for p in pages)
        assert all(pages[:-1])  # only the last page can be empty (when nothing matches)


def test_a_cursor_that_was_deleted_still_continues_after_it() -> None:
    assert page(["a", "c", "e"], "b", 10).ids == ["c", "e"]
    assert page(["a", "c", "e"], "e", 10) == page([], None, 10)
    assert page(["a", "b", "c"], None, 2).next_cursor == "b"
    assert page(["a", "b"], None, 2).next_cursor is None  # nothing follows: no next page


def test_next_page_headers_carry_the_filters_and_the_cursor() -> None:
    assert next_headers("/v1/apps", {"limit": "2"}, None) == {}
    headers = next_headers("/v1/apps", {"limit": "2", "status": "serving", "cursor": "a"}, "k")
    assert headers[NEXT_CURSOR] == "k"
    link = headers["Link"]
    assert link.endswith('>; rel="next"')
    url = urlparse(link[1:link.index(">")])
    assert url.path == "/v1/apps"
    assert parse_qs(url.query) == {"limit": ["2"], "status": ["serving"], "cursor": ["k"]}


def _servers() -> dict[str, ReadOnlyServerRecord]:
    return {s: ReadOnlyServerRecord.model_validate_json(server_record(s).model_dump_json())
            for s in ("s1", "s3")}


def _shared(record: object) -> ReadOnlyAppRecord:
    return ReadOnlyAppRecord.model_validate_json(record.model_dump_json())  # type: ignore[attr-defined]


def test_app_filters_match_status_spec_and_where_the_app_is_served() -> None:
    servers = _servers()
    on_s1 = _shared(app_record("a", [replica("s1", LARGE)], serving=("s1", LARGE),
                               critical=True))
    on_s3 = _shared(app_record("b", [replica("s3", SMALL)], serving=("s3", SMALL),
                               status=AppStatus.DEGRADED))
    nowhere = _shared(app_record("c", [], serving=None, status=AppStatus.UNAVAILABLE))
    apps = [on_s1, on_s3, nowhere]

    def kept(wanted: AppFilter) -> list[str]:
        return [a.app_id for a in apps if wanted.keeps(a, servers)]

    assert AppFilter().empty and kept(AppFilter()) == ["a", "b", "c"]
    assert not AppFilter(site="x").empty
    assert kept(AppFilter(server_id="s1")) == ["a"]
    assert kept(AppFilter(site="site-b")) == ["b"]  # s3's site
    assert kept(AppFilter(variant=SMALL)) == ["b"]
    assert kept(AppFilter(status=AppStatus.UNAVAILABLE)) == ["c"]
    assert kept(AppFilter(critical=True)) == ["a"] and kept(AppFilter(critical=False)) == ["b", "c"]
    assert kept(AppFilter(family="f", server_id="s3")) == ["b"]
    assert kept(AppFilter(family="other")) == []


def test_server_filters_and_pages_of_a_mapping() -> None:
    servers = {s: server_record(s) for s in ("s4", "s1", "s3", "s2")}
    servers["s2"].state = ServerState.FAILED
    up = ServerFilter(state=ServerState.UP)
    found, cursor = page_of(servers, None, 2, up.keeps)
    assert [s.server_id for s in found] == ["s1", "s3"] and cursor == "s3"
    found, cursor = page_of(servers, cursor, 2, up.keeps)
    assert [s.server_id for s in found] == ["s4"] and cursor is None
    site_a = ServerFilter(site="site-a")
    assert [s.server_id for s in page_of(servers, None, 10, site_a.keeps)[0]] == ["s1", "s2"]


def test_a_rendered_view_changes_with_its_record_or_its_serving_servers_endpoint() -> None:
    rendered = RenderedViews()
    servers = _servers()
    record = _shared(app_record("a", [replica("s1", LARGE)], serving=("s1", LARGE)))
    first = rendered.json(record, servers)
    assert json.loads(first) == app_view(record, servers).model_dump(mode="json")
    assert json.loads(first)["serving"]["endpoint"]["http"] == servers["s1"].http
    assert rendered.json(record, servers) is first  # not rendered again

    moved = {**servers, "s1": ReadOnlyServerRecord.model_validate(
        {**servers["s1"].model_dump(), "http": "http://elsewhere:1"})}
    assert json.loads(rendered.json(record, moved))["serving"]["endpoint"]["http"] == \
        "http://elsewhere:1"
    changed = _shared(app_record("a", [replica("s1", LARGE)], serving=("s1", LARGE),
                                 status=AppStatus.DEGRADED))
    assert json.loads(rendered.json(changed, moved))["status"] == "degraded"

    other = _shared(app_record("b", [], serving=None, status=AppStatus.PENDING))
    assert json.loads(rendered.list_json([changed, other], moved)) == [
        json.loads(rendered.json(changed, moved)), json.loads(rendered.json(other, moved))]
    assert "a" in rendered and "b" in rendered
    rendered.prune({"b": other})  # "a" was deleted
    assert "a" not in rendered and "b" in rendered


def test_batch_results_name_each_app_in_order() -> None:
    specs = [AppSpec(app_id=a, family="f") for a in ("x", "y", "z")]
    result = batch_result(specs, [True, False, True])
    assert (result.created, result.conflicts) == (2, 1)
    assert [(r.app_id, r.outcome) for r in result.results] == [
        ("x", "created"), ("y", "conflict"), ("z", "created")]
    assert "already registered" in result.results[1].detail
