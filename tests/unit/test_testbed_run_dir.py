"""A new testbed in a used run directory starts clean (Redis would reload the old apps)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deploy import testbed_state as tb
from deploy.processes import ProcessInfo


def _previous(run_dir: Path, pid: int) -> None:
    state = tb.TestbedState(run_dir=str(run_dir), controller_url="http://127.0.0.1:1", redis_port=1,
                         artifacts=str(run_dir / "artifacts"),
                         processes={"redis": ProcessInfo("redis", pid, "log", ["redis-server"])})
    run_dir.mkdir(parents=True, exist_ok=True)
    state.save()
    (run_dir / "appendonlydir").mkdir()
    (run_dir / "appendonlydir" / "appendonly.aof.1.incr.aof").write_text("old apps")
    (run_dir / "agents" / "s1" / "artifact-cache" / "v").mkdir(parents=True)
    (run_dir / "agents" / "s1" / "artifact-cache" / "v" / "weights.pt").write_bytes(b"w")
    (run_dir / "agents" / "s1" / "repository").mkdir()
    (run_dir / "artifacts" / "mobilenet_v3").mkdir(parents=True)
    (run_dir / "report.png").write_bytes(b"png")
    (run_dir / "credentials").mkdir()
    (run_dir / "credentials" / "admin.token").write_text("old")


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])  # noqa: S607 - a process that is gone at once
    process.wait()
    return process.pid


def test_a_stopped_testbeds_state_is_removed_and_artifacts_kept(tmp_path: Path) -> None:
    _previous(tmp_path, _dead_pid())
    tb.clear_previous_run(tmp_path)
    assert not (tmp_path / "appendonlydir").exists()
    assert not (tmp_path / "credentials").exists()  # a new testbed makes new credentials
    assert not (tmp_path / "agents" / "s1" / "repository").exists()
    assert (tmp_path / "agents" / "s1" / "artifact-cache" / "v" / "weights.pt").exists()
    assert not (tmp_path / "testbed.json").exists()
    assert (tmp_path / "artifacts" / "mobilenet_v3").is_dir()
    assert (tmp_path / "report.png").exists()


def test_a_running_testbed_is_not_touched(tmp_path: Path) -> None:
    _previous(tmp_path, os.getpid())
    with pytest.raises(tb.TestbedError, match="still runs"):
        tb.clear_previous_run(tmp_path)
    assert (tmp_path / "appendonlydir").exists()


def test_an_empty_or_missing_directory_is_fine(tmp_path: Path) -> None:
    tb.clear_previous_run(tmp_path / "new")
    tb.clear_previous_run(tmp_path)
