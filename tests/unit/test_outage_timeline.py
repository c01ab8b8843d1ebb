"""A client's outage timeline from a run's records (events, gateway moves, request stamps)."""

from __future__ import annotations

from deploy.gateway_load import stamp
from deploy.outage import client_outages
from deploy.timeline import format_timeline, timeline

AT = 1000.0


def test_the_timeline_names_each_step_and_the_loads_on_the_new_server() -> None:
    failure = {"servers": ["s1"], "at": AT, "serving_before": ["a"]}
    requests = [stamp("a", "gateway", 50.0, AT - 0.02, AT - 0.01, "ok", server_id="s1"),
                stamp("a", "gateway", 50.0, AT + 0.01, AT + 0.30, "ok", attempts=2,
                      server_id="s2"),
                stamp("a", "gateway", 50.0, AT + 0.31, AT + 0.32, "ok", server_id="s2")]
    events = [{"app_id": "a", "kind": "warm_switch", "server_id": "s2", "failed_server": "s1",
               "failure_at": AT + 0.005, "time": AT + 0.012},
              {"app_id": "b", "kind": "backup_loaded", "server_id": "s2", "load_s": 0.2,
               "time": AT + 0.5},
              {"app_id": "c", "kind": "backup_loaded", "server_id": "s3", "load_s": 0.2,
               "time": AT + 0.5}]
    moves = [(AT + 0.015, "a", "s1")]
    (outage,) = client_outages([failure], requests)
    line = timeline(outage, failure, events, requests, moves)
    assert line["outage_ms"] == 300.0
    assert (line["detected_ms"], line["notified_ms"], line["gateway_moved_ms"]) == (5.0, 12.0,
                                                                                    15.0)
    assert [r["sent_ms"] for r in line["requests"]] == [-20.0, 10.0]
    assert line["requests"][1]["attempts"] == 2
    assert [(x["app_id"], x["started_ms"], x["done_ms"]) for x in line["loads_on_new_server"]
            ] == [("b", 300.0, 500.0)]
    text = format_timeline(line)
    assert "gateway moved 15.0" in text and "load on s2: b" in text
