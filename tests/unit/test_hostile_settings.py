"""Start-up settings keep the wire's bounds: what the controller would refuse fails at start.

An agent started with a NaN capacity or a 5e-324 ms heartbeat used to start, say hello, be
refused (1008) and reconnect forever; the controller's uvicorn took websocket frames up to its
16 MiB default, four times the protocol's limit, and refused them only once read whole.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig
from understudy.cli.agent import parse_capacity
from understudy.cli.controller import server_options
from understudy.cli.main import main
from understudy.wire.bounds import MAX_RESOURCES
from understudy.wire.protocol import MAX_FRAME_BYTES


def test_the_controller_server_refuses_frames_over_the_protocol_limit() -> None:
    assert server_options()["ws_max_size"] == MAX_FRAME_BYTES


@pytest.mark.parametrize("text, problem", [
    ("memory_mb=nan", "finite"),
    ("memory_mb=inf", "finite"),
    ("memory_mb=-inf", "finite"),
    ("memory_mb=1e10", "finite"),
    ("memory_mb=-1", "finite"),
    ("memory_mb=100,gpu/0=1", "capacity resource 'gpu/0'"),
    ("memory_mb=100," + ",".join(f"r{i}=1" for i in range(MAX_RESOURCES)), "at most"),
    ("memory_mb", "NAME=NUMBER"),
    ("compute=100", "memory_mb"),
])
def test_a_capacity_the_controller_would_refuse_fails_to_parse(text: str, problem: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        parse_capacity(text)


def test_a_capacity_within_the_bounds_parses() -> None:
    assert parse_capacity("memory_mb=8000, compute=1e9") == {"memory_mb": 8000.0,
                                                             "compute": 1e9}


def _config(**changes: Any) -> dict[str, Any]:
    return {"server_id": "s1", "site_id": "a", "controller_url": "http://127.0.0.1:1",
            "capacity": {"memory_mb": 1000.0}, "artifacts": "/tmp/store",  # noqa: S108
            "run_dir": Path("/tmp/run"), **changes}  # noqa: S108


@pytest.mark.parametrize("changes, field", [
    ({"capacity": {"memory_mb": float("nan")}}, "capacity.memory_mb"),
    ({"capacity": {"memory_mb": float("inf")}}, "capacity.memory_mb"),
    ({"capacity": {"memory_mb": 2e9}}, "capacity.memory_mb"),
    ({"capacity": {"bad name": 1.0}}, "capacity"),
    ({"heartbeat_interval_ms": 5e-324}, "heartbeat_interval_ms"),
    ({"heartbeat_interval_ms": 60_001.0}, "heartbeat_interval_ms"),
    ({"heartbeat_interval_ms": float("nan")}, "heartbeat_interval_ms"),
    ({"server_id": ""}, "server_id"),
    ({"server_id": "s/1"}, "server_id"),
    ({"site_id": "x" * 129}, "site_id"),
    ({"server_type": "a b"}, "server_type"),
    ({"reconnect_max_s": float("inf")}, "reconnect_max_s"),
])
def test_agent_settings_the_hello_would_break_are_refused(changes: dict[str, Any],
                                                          field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AgentConfig(**_config(**changes))
    assert any(".".join(str(p) for p in e["loc"]).startswith(field)
               for e in caught.value.errors()), caught.value


def test_agent_settings_at_the_bounds_are_accepted() -> None:
    config = AgentConfig(**_config(heartbeat_interval_ms=1.0, capacity={"memory_mb": 1e9}))
    assert config.heartbeat_interval_ms == 1.0


def test_the_agent_command_fails_at_start_with_the_reason(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["agent", "--server-id", "s1", "--site", "a", "--capacity", "memory_mb=nan"])
    assert exited.value.code == 2
    assert "memory_mb=nan must be a finite number" in capsys.readouterr().err
    monkeypatch.setenv("UNDERSTUDY_AGENT_CAPACITY", '{"memory_mb": NaN}')
    with caplog.at_level(logging.ERROR):
        code = main(["agent", "--server-id", "s1", "--site", "a", "--controller-url",
                     "http://127.0.0.1:1", "--artifacts", "/tmp/store",  # noqa: S108
                     "--run-dir", "/tmp/run", "--heartbeat-ms", "5e-324"])  # noqa: S108
    assert code == 2
    assert "invalid agent settings" in caplog.text
    assert "capacity.memory_mb" in caplog.text and "heartbeat_interval_ms" in caplog.text
