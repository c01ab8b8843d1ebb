"""Stateful replicas never outlive the process that launched them (real processes, SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A launcher like a local graph's runtime: starts one replica, reports its pid, then waits.
LAUNCHER = """
import subprocess, sys, time
import os
child = subprocess.Popen([sys.executable, "-m", "stateful.replica_main", "--node", "lifetime.p0",
                          "--parent-pid", str(os.getpid())],
                         stdout=subprocess.PIPE)
print(child.pid, flush=True)
child.stdout.readline()  # the replica's address: it is up
print("ready", flush=True)
time.sleep(600)
"""


def _niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return int(stat.read().split(") ", 1)[1].split()[16])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_replica_exits_when_its_launcher_is_killed() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                text=True, env=env, cwd=REPO)
    assert launcher.stdout is not None
    replica = int(launcher.stdout.readline())
    try:
        assert launcher.stdout.readline().strip() == "ready"
        assert _alive(replica)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        deadline = time.monotonic() + 10
        while _alive(replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(replica), "the replica outlived its SIGKILLed launcher"
    finally:
        if _alive(replica):
            os.kill(replica, signal.SIGKILL)
        launcher.kill()


def test_a_replica_whose_launcher_is_gone_exits_at_once() -> None:
    # A launcher that died between the spawn and the replica's PR_SET_PDEATHSIG: the replica's
    # parent is no longer the pid it was given.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "stateful.replica_main", "--node", "late.p0",
                           "--parent-pid", str(os.getpid() + 1_000_000)],
                          env=env, cwd=REPO, capture_output=True, timeout=30, check=False)
    assert done.returncode == 1 and not done.stdout


def test_an_agents_replica_runs_at_its_niceness_and_dies_with_it(tmp_path: Path) -> None:
    # The agent's supervisor starts replicas without a preexec_fn (vfork): the niceness comes
    # from `nice`, the parent-death signal from the replica itself.
    script = f"""
import asyncio, sys
from pathlib import Path
from agent.replicas import ReplicaSupervisor
from understudy.wire.protocol import StartReplicaCommand

async def main():
    supervisor = ReplicaSupervisor(Path({str(tmp_path)!r}), nice=7)
    info, _ = await supervisor.start(StartReplicaCommand(command_id="1", graph="g", node="n.p0"))
    print(info.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=env, cwd=REPO)
    assert agent.stdout is not None
    replica = int(agent.stdout.readline())
    try:
        assert _niceness(replica) == 7
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(replica) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(replica), "the replica outlived its SIGKILLed agent"
    finally:
        if _alive(replica):
            os.kill(replica, signal.SIGKILL)
        agent.kill()
