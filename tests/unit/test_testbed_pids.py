"""The testbed never signals a pid that names another process than the one it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from deploy import processes as pr
from deploy import testbed as tb


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            process_group=0)


def test_start_ticks_is_stable_and_none_for_a_gone_process() -> None:
    mine = pr.start_ticks(os.getpid())
    assert mine is not None and mine == pr.start_ticks(os.getpid())
    gone = subprocess.Popen(["true"])  # noqa: S607
    gone.wait()
    assert pr.start_ticks(gone.pid) is None


def test_spawn_records_the_start_time(tmp_path: Path) -> None:
    state = tb.TestbedState(run_dir=str(tmp_path), controller_url="http://127.0.0.1:1",
                            redis_port=1, artifacts=str(tmp_path))
    info = tb._spawn(state, "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert info.started is not None and info.started == pr.start_ticks(info.pid)
        loaded = tb.TestbedState.load(tmp_path).processes["sleeper"]
        assert loaded.started == info.started
        assert pr.alive(loaded.pid, loaded.started)
    finally:
        assert pr.signal_group(info, signal.SIGKILL)
        os.waitpid(info.pid, 0)


def test_a_reused_pid_is_not_signalled_nor_counted_alive() -> None:
    process = _sleeper()
    try:
        real = pr.start_ticks(process.pid)
        assert real is not None
        # The record says the pid's process started at another time: a reused pid.
        other = pr.ProcessInfo("agent-s1", process.pid, "log", [], started=real - 1)
        assert pr.reused(process.pid, other.started)
        assert not pr.alive(process.pid, other.started)
        assert not pr.signal_group(other, signal.SIGKILL)
        assert not pr.signal_process(process.pid, real - 1, signal.SIGKILL)
        assert process.poll() is None  # still running: nothing was sent
        assert pr.signal_process(process.pid, real, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_record_without_a_start_time_trusts_the_pid() -> None:
    process = _sleeper()
    try:
        info = pr.ProcessInfo("old", process.pid, "log", [])
        assert pr.alive(info.pid, info.started)
        assert pr.signal_group(info, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        assert not pr.signal_group(info, signal.SIGKILL)  # gone: nothing to signal
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
