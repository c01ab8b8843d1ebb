"""Hostile values in records and request bodies: refused on the way in, quarantined on load.

Pure code only: the records' rules (``controller.records``), the in-memory copy's load and the
check before every write (``controller.record_cache``). The same paths against a real Redis are
in ``tests/integration/test_hostile_controller.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from controller.errors import InvalidRecordError
from controller.record_cache import RecordCache, checked_app, checked_server
from controller.records import AppRecord, AppSpec, ConfigPatch, RuntimeConfig, ServerRecord

TEN_MB = "x" * 10_000_000


def _server_json(**changes: Any) -> str:
    record = {"server_id": "s1", "site_id": "a", "capacity": {"memory_mb": 100.0}, **changes}
    return json.dumps(record)


def _app_json(app_id: str = "a") -> str:
    return AppRecord(spec=AppSpec(app_id=app_id, family="mobilenet_v3")).model_dump_json()


def test_a_load_keeps_the_valid_records_and_hands_back_the_others() -> None:
    cache = RecordCache()
    rejected = cache.load(
        apps={"a": _app_json("a"), "b": "{not json", "c": _app_json("other"),
              "d": json.dumps({"spec": {"app_id": "d", "family": "f", "latency_slo_ms": None},
                               "replicas": [{"server_id": "", "variant": "v",
                                             "role": "primary"}]})},
        servers={"s1": _server_json(),
                 # What a NaN capacity became once written: null.
                 "s2": _server_json(server_id="s2", capacity={"memory_mb": None}),
                 "": _server_json(server_id=""),
                 "s4": _server_json(server_id="s4", capacity={"memory_mb": 1e300})},
        revision=3)
    view = cache.view()
    assert list(view.apps) == ["a"] and list(view.servers) == ["s1"]
    reasons = {(r.hash_name, r.record_id): r.reason for r in rejected}
    assert set(reasons) == {("apps", "b"), ("apps", "c"), ("apps", "d"), ("servers", "s2"),
                            ("servers", ""), ("servers", "s4")}
    assert "but its app_id is 'other'" in reasons["apps", "c"]
    assert "replicas.0.server_id" in reasons["apps", "d"]
    assert "capacity.memory_mb" in reasons["servers", "s2"]
    assert all(len(reason) <= 500 for reason in reasons.values())
    assert cache.copy_servers().keys() == {"s1"} and cache.apps_on("s1") == []


def test_a_record_that_would_not_read_back_is_never_written() -> None:
    server = ServerRecord(server_id="s1", site_id="a", capacity={"memory_mb": 1.0})
    server.capacity = {"memory_mb": float("nan")}  # assignment skips validation
    with pytest.raises(InvalidRecordError, match="capacity"):
        checked_server(server)
    app = AppRecord(spec=AppSpec(app_id="a", family="f"))
    app.serving = ("", "v")
    with pytest.raises(InvalidRecordError, match="serving"):
        checked_app(app)
    app.serving = ("s1", "v")
    app_id, raw, parsed = checked_app(app)
    assert app_id == "a" and parsed.serving == ("s1", "v") and json.loads(raw)["spec"]


def test_a_written_record_is_served_as_parsed() -> None:
    cache = RecordCache()
    cache.load({}, {}, 0)
    app_id, raw, parsed = checked_app(AppRecord(spec=AppSpec(app_id="a", family="f")))
    assert cache.written(1, apps=[(app_id, raw)], parsed_apps={app_id: parsed})
    assert cache.app("a") is parsed  # not parsed a second time


@pytest.mark.parametrize("body, field", [
    ({"latency_slo_ms": float("inf")}, "latency_slo_ms"),
    ({"latency_slo_ms": float("nan")}, "latency_slo_ms"),
    ({"max_rate_rps": float("inf")}, "max_rate_rps"),
    ({"family": TEN_MB}, "family"),
    ({"family": "mobile net"}, "family"),
    ({"variant": "a__b"}, "variant"),
    ({"variant": TEN_MB}, "variant"),
    ({"pinned_server": ""}, "pinned_server"),
    ({"pinned_site": TEN_MB}, "pinned_site"),
    ({"excluded_servers": [TEN_MB]}, "excluded_servers.0"),
    ({"excluded_sites": ["*"]}, "excluded_sites.0"),
])
def test_app_specs_refuse_non_finite_numbers_and_unbounded_strings(body: dict[str, Any],
                                                                    field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        AppSpec.model_validate({"app_id": "a", "family": "mobilenet_v3", **body})
    assert [".".join(str(p) for p in e["loc"]) for e in refused.value.errors()] == [field]


@pytest.mark.parametrize("patch", [
    {"heartbeat_interval_ms": 5e-324}, {"heartbeat_interval_ms": 0.5},
    {"heartbeat_interval_ms": float("inf")}, {"time_limit_s": 5e-324},
    {"time_limit_s": float("nan")}, {"alpha": float("nan")}, {"mip_rel_gap": float("-inf")},
])
def test_config_refuses_tiny_and_non_finite_settings(patch: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        ConfigPatch.model_validate(patch)
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(patch)


def test_sane_settings_still_pass() -> None:
    patch = ConfigPatch(heartbeat_interval_ms=1.0, time_limit_s=0.1)
    assert RuntimeConfig(**patch.model_dump(exclude_none=True)).heartbeat_interval_ms == 1.0
