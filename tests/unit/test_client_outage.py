"""Client-observed outage from the clients' request stamps (deploy/outage.py)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.gateway_load import stamp
from deploy.outage import (
    affected_apps,
    client_outages,
    outage_figures,
    outcome_of,
    percentile,
    request_counts,
)

AT = 1000.0


def ok(sent: float, done: float, server: str = "s2", app: str = "a", via: str = "gateway",
       rate: float = 5.0, variant: str = "v") -> dict[str, Any]:
    return stamp(app, via, rate, sent, done, "ok", server_id=server, variant=variant)


def bad(sent: float, done: float, outcome: str = "error", app: str = "a",
        via: str = "gateway", rate: float = 5.0) -> dict[str, Any]:
    return stamp(app, via, rate, sent, done, outcome, error="why")


def failure(servers: tuple[str, ...] = ("s1",), apps: tuple[str, ...] = ("a",),
            at: float = AT) -> dict[str, Any]:
    return {"at": at, "servers": list(servers), "serving_before": list(apps)}


def steady(start: float, stop: float, rate: float = 5.0, server: str = "s1",
           **kw: Any) -> list[dict[str, Any]]:
    """Requests every 1/rate s from ``start`` to ``stop``, each answered 5 ms later."""
    records, t = [], start
    while t < stop:
        records.append(ok(t, t + 0.005, server=server, rate=rate, **kw))
        t += 1.0 / rate
    return records


def test_warm_switch_outage_runs_from_the_failure_to_the_first_answer_elsewhere() -> None:
    records = steady(AT - 1.0, AT, server="s1")  # last answer 995 ms after AT - 1 s: AT - 0.195
    records += [ok(AT + 0.05, AT + 0.13, server="s2", variant="small"),
                *steady(AT + 0.25, AT + 2.0, server="s2")]
    [seen] = client_outages([failure()], records)
    assert seen.app_id == "a" and seen.client == "gateway@5"
    assert seen.outage_ms == pytest.approx(130.0)
    assert seen.answered_by == "s2/small"
    last_before = max(r["done_at"] for r in records if r["done_at"] <= AT)
    assert seen.longest_gap_ms == pytest.approx((AT + 0.13 - last_before) * 1000, abs=0.01)
    assert seen.recovered and seen.errors == 0 and seen.lost == 0


def test_an_answer_of_the_dying_server_just_after_the_kill_is_no_recovery() -> None:
    records = [ok(AT - 0.01, AT + 0.001, server="s1"), ok(AT + 0.2, AT + 0.3, server="s2")]
    [seen] = client_outages([failure()], records)
    assert seen.outage_ms == pytest.approx(300.0)
    # ... but it was an answer: the gap counts from it
    assert seen.longest_gap_ms == pytest.approx(299.0)


def test_a_request_caught_in_flight_and_resent_counts_at_its_answer() -> None:
    records = [ok(AT - 0.4, AT - 0.39, server="s1"), ok(AT - 0.002, AT + 0.08, server="s2")]
    [seen] = client_outages([failure()], records)
    assert seen.outage_ms == pytest.approx(80.0)
    assert seen.requests == 1  # in flight across the failure: in its window


def test_a_client_never_served_again_has_no_outage_and_a_gap_to_the_window_end() -> None:
    records = [ok(AT - 0.2, AT - 0.19, server="s1"),
               *[bad(AT + i * 0.2, AT + i * 0.2 + 0.1) for i in range(5)],
               bad(AT + 1.0, AT + 1.05, outcome="lost")]
    [seen] = client_outages([failure()], records, ends=[AT + 1.5])
    assert seen.outage_ms is None and not seen.recovered
    assert seen.longest_gap_ms == pytest.approx(1690.0)
    assert (seen.requests, seen.errors, seen.lost) == (6, 5, 1)


def test_the_next_failure_ends_the_window() -> None:
    records = [ok(AT - 0.2, AT - 0.19, server="s1"), ok(AT + 2.0, AT + 2.1, server="s2"),
               ok(AT + 4.9, AT + 4.95, server="s2")]
    first, second = client_outages([failure(), failure(("s3",), at=AT + 1.0)], records)
    assert first.failure == 0 and first.outage_ms is None
    assert first.longest_gap_ms == pytest.approx(1190.0)  # to the second failure
    assert second.failure == 1 and second.outage_ms == pytest.approx(1100.0)


def test_a_stall_after_the_first_answer_shows_in_the_longest_gap() -> None:
    records = [ok(AT - 0.2, AT - 0.19, server="s1"), ok(AT + 0.05, AT + 0.06, server="s2"),
               ok(AT + 0.2, AT + 1.4, server="s2"), ok(AT + 1.4, AT + 1.41, server="s2")]
    [seen] = client_outages([failure()], records)
    assert seen.outage_ms == pytest.approx(60.0)
    assert seen.longest_gap_ms == pytest.approx(1340.0)


def test_a_client_stalled_again_at_the_window_end_counts_the_trailing_gap() -> None:
    records = [ok(AT - 0.2, AT - 0.19, server="s1"), ok(AT + 0.05, AT + 0.06, server="s2"),
               bad(AT + 0.2, AT + 5.0, outcome="lost")]
    [seen] = client_outages([failure()], records, ends=[AT + 2.0])
    assert seen.outage_ms == pytest.approx(60.0)
    assert seen.longest_gap_ms == pytest.approx(1940.0)


def test_each_client_of_an_app_is_judged_apart_and_absent_ones_are_left_out() -> None:
    gateway = steady(AT - 1.0, AT + 1.0, rate=5.0, via="gateway", server="s1")
    for record in gateway:
        if record["sent_at"] > AT:
            record["server_id"] = "s2"
    sdk = [ok(AT - 0.02, AT - 0.01, server="s1", via="sdk", rate=50.0),
           ok(AT + 0.04, AT + 0.045, server="s2", via="sdk", rate=50.0)]
    late = [ok(AT + 0.5, AT + 0.51, server="s2", via="sdk", rate=5.0)]  # started after
    other = steady(AT - 1.0, AT + 1.0, app="b", server="s3")  # not affected
    seen = client_outages([failure()], gateway + sdk + late + other)
    assert sorted(o.client for o in seen) == ["gateway@5", "sdk@50"]
    assert {o.app_id for o in seen} == {"a"}
    assert next(o for o in seen if o.via == "sdk").outage_ms == pytest.approx(45.0)


def test_affected_apps_come_from_the_record_else_from_who_answered() -> None:
    records = [ok(AT - 0.5, AT - 0.49, server="s1", app="b"),
               ok(AT - 0.5, AT - 0.49, server="s2", app="c"),
               ok(AT - 5.0, AT - 4.9, server="s1", app="d")]  # too long before
    assert affected_apps(failure(apps=("x",)), records) == ["x"]
    assert affected_apps({"at": AT, "servers": ["s1"]}, records) == ["b"]


def test_request_counts_every_request_by_outcome_and_client() -> None:
    records = [ok(1, 2), bad(2, 3), bad(3, 4, outcome="lost"),
               ok(1, 2, via="sdk", rate=50.0), bad(1, 2, via="sdk", rate=50.0)]
    counts = request_counts(records)
    assert (counts["requests"], counts["ok"], counts["errors_returned"],
            counts["lost_requests"]) == (5, 2, 2, 1)
    assert counts["by_client"] == {"gateway@5": {"requests": 3, "errors": 1, "lost": 1},
                                   "sdk@50": {"requests": 2, "errors": 1, "lost": 0}}


def test_records_without_an_outcome_field_count_from_ok() -> None:
    assert outcome_of({"ok": True}) == "ok"
    assert outcome_of({"ok": False, "error": "x"}) == "error"
    assert outcome_of({"ok": False, "outcome": "lost"}) == "lost"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_figures_group_by_how_and_client() -> None:
    records = [ok(AT - 0.1, AT - 0.09, server="s1"), ok(AT + 0.05, AT + 0.07),
               ok(AT - 0.1, AT - 0.09, server="s1", app="b"), ok(AT + 0.5, AT + 0.9, app="b"),
               ok(AT - 0.1, AT - 0.09, server="s1", app="c")]
    outages = client_outages([failure(apps=("a", "b", "c"))], records, ends=[AT + 1.0])
    figures = outage_figures(outages, {(0, "a"): "warm", (0, "b"): "progressive",
                                       (0, "c"): "progressive"})
    assert figures["warm/gateway@5"]["outage_p50_ms"] == pytest.approx(70.0)
    progressive = figures["progressive/gateway@5"]
    assert progressive["samples"] == 2 and progressive["not_recovered"] == 1
    assert progressive["outage_p50_ms"] == pytest.approx(900.0)
