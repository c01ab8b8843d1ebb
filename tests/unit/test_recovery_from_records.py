"""Recovery counted from the records (issue 21, Build item 5).

Every app served from a failed server counts as affected, whether or not an event named the
failed server: ``deploy.report`` (the testbed report) and ``bench/failover.py`` both count so.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from deploy.report import (
    analyse,
    recovery_from_records,
    serving_elsewhere,
    serving_on,
    summary,
)

REPO = Path(__file__).resolve().parents[2]


def view(app_id: str, server_id: str | None, status: str = "serving") -> dict[str, Any]:
    """An app as ``GET /v1/apps`` shows it (the fields counted here)."""
    serving = {"server_id": server_id, "variant": "v"} if server_id else None
    return {"app_id": app_id, "status": status, "serving": serving}


def event(app_id: str, kind: str, server_id: str, at: float,
          failed_server: str | None = None) -> dict[str, Any]:
    return {"app_id": app_id, "kind": kind, "server_id": server_id, "variant": "v",
            "accuracy": 0.9, "time": at, "failed_server": failed_server,
            "failure_at": at - 0.1 if failed_server else None}


def test_the_apps_served_from_the_failed_servers_are_the_affected_ones() -> None:
    apps = [view("a", "s1"), view("b", "s2"), view("c", None, "unavailable"), view("d", "s1")]
    assert serving_on(apps, ["s1"]) == ["a", "d"]
    assert serving_on(apps, ["s1", "s2"]) == ["a", "b", "d"]


def test_recovered_means_serving_again_from_a_server_that_did_not_fail() -> None:
    after = [view("a", "s3"), view("b", "s1"), view("c", None, "recovering"),
             view("d", "s4", "degraded"), view("e", "s3", "recovering")]
    assert serving_elsewhere(["a", "b", "c", "d", "e", "gone"], after, ["s1"]) == ["a", "d"]


def test_recovery_from_records_sums_the_failures_that_recorded_both_sets() -> None:
    failures = [
        {"server": "s1", "serving_before": ["a", "b", "c"], "recovered": ["a", "c"]},
        {"server": "s2", "serving_before": ["d"], "recovered": ["d"]},
        {"server": "s3"},  # an older record: not counted
    ]
    assert recovery_from_records(failures) == (4, 3)
    assert recovery_from_records([]) == (0, 0)


def test_the_report_counts_an_app_no_event_named() -> None:
    at = 100.0
    failures = [{"servers": ["s1"], "at": at, "serving_before": ["a", "b", "c"]}]
    events = [
        event("a", "interim_serving", "s2", at + 1.0, failed_server="s1"),  # named
        event("b", "serving", "s3", at + 2.0),  # placed elsewhere, no event named s1
    ]  # c: nothing at all
    outcomes = {o.app_id: o for o in analyse(failures, events, [])}
    assert sorted(outcomes) == ["a", "b", "c"]
    assert (outcomes["a"].named, outcomes["a"].recovered) == (True, True)
    assert (outcomes["b"].named, outcomes["b"].recovered, outcomes["b"].how) == (
        False, True, "progressive")
    assert (outcomes["c"].recovered, outcomes["c"].how) == (False, "unrecoverable")
    figures = summary(list(outcomes.values()))
    assert figures["affected"] == 3 and figures["recovery_rate"] == 2 / 3
    assert figures["affected_named_by_events"] == 1
    assert figures["recovery_rate_from_events"] == 1.0


def _bench() -> ModuleType:
    path = REPO / "bench" / "failover.py"
    spec = importlib.util.spec_from_file_location("bench_failover", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_failover"] = module
    spec.loader.exec_module(module)
    return module


def test_the_failover_bench_counts_recovery_from_the_records() -> None:
    bench = _bench()
    row = {"how": "progressive", "notify_ms": 900.0, "interim_load_ms": 500.0,
           "interim_load_now_ms": None, "interim_own_load_ms": None, "interims_in_failure": 1,
           "upgrade_ms": None, "mttr_ms": 800.0, "detect_ms": 100.0, "delivery_ms": 1.0,
           "accuracy_before": 0.9, "accuracy_after": 0.8}
    # Two apps served from s1; one recovered (named by its event), one never heard of.
    failures = [{"server": "s1", "at": 0.0, "serving_before": ["a", "b"], "recovered": ["a"]}]
    figures = bench.figures([row], failures)
    assert (figures["affected"], figures["recovery_rate"]) == (2, 0.5)
    assert (figures["affected_named_by_events"], figures["recovery_rate_from_events"]) == (1, 1.0)
