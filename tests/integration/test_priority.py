"""The heartbeat process and the monitor run real-time where permitted, and nothing inherits it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, subprocess, sys
from understudy.wire.priority import raise_priority
got = raise_priority(-5)
child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                       capture_output=True, text=True, check=True)
print(json.dumps({"got": got, "policy": os.sched_getscheduler(0) & 0xff,
                  "child": int(child.stdout)}))
"""


def _probe(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, env={**os.environ, **env}, timeout=30)
    return json.loads(done.stdout)


def _realtime_permitted() -> bool:
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_RR, "
             "os.sched_param(1))"], capture_output=True, timeout=30)
    except OSError:
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _realtime_permitted(), reason="real-time scheduling not permitted here")
def test_realtime_where_permitted_and_not_inherited() -> None:
    result = _probe({})
    assert result["got"] == "realtime"
    assert result["policy"] == os.SCHED_RR
    assert result["child"] == os.SCHED_OTHER  # SCHED_RESET_ON_FORK


def test_switch_off_keeps_the_normal_class() -> None:
    result = _probe({"UNDERSTUDY_REALTIME": "0"})
    assert result["got"] in ("nice", "normal")
    assert result["policy"] == os.SCHED_OTHER
