"""How long an agent's event loop stalls while it starts a replica process.

Usage: ``python bench/spawn_stall.py [--spawns N] [--replicas N] [--nice N]``.

The agent's heartbeats (every 20 ms, a server failed after 50 ms of silence) share one asyncio
loop with everything else the agent does, so a fork that holds the GIL shows up directly as a
heartbeat gap. This process imports what the agent imports (``agent.daemon``: the same address
space to copy on a fork) and runs a 1 ms ticker on its loop; the stall of a spawn is the
ticker's worst lateness from just before the spawn until it returned.

Two phases:

* ``spawn``: ``subprocess.Popen`` of a child that does nothing (``sleep``) on a worker thread,
  with a ``preexec_fn`` (what ``agent/replicas.py`` used: CPython must fork, holding the GIL
  while the kernel copies the page tables) and without one (CPython may vfork), and the same
  on the loop itself; isolates the process creation from whatever the child does next;
* ``replica``: ``agent.replicas.ReplicaSupervisor.start`` of real ``stateful.replica_main``
  processes (one at a time, then three at once as a server gets them for a graph), the worst
  lateness over the whole start, torch import and CPU contention included; ``idle-same-window``
  is the worst lateness over an equally long window with nothing started (the machine's own
  noise). Run it at the agent's niceness (``nice -n -5``, as the testbed starts agents) to
  see what the agent sees.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import agent.daemon  # noqa: E402, F401 - the agent's footprint, as a fork copies it
from agent.processes import child_setup  # noqa: E402
from agent.replicas import ReplicaSupervisor  # noqa: E402
from understudy.wire.protocol import StartReplicaCommand  # noqa: E402

TICK_S = 0.001


class Ticker:
    """A 1 ms sleeper on the loop; ``worst`` is its largest lateness since ``reset``."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def reset(self) -> None:
        self.worst = 0.0

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.worst = max(self.worst, time.perf_counter() - before - TICK_S)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _measure(ticker: Ticker, action: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    await asyncio.sleep(0.05)  # a quiet loop first
    ticker.reset()
    result = await action()
    await asyncio.sleep(0.005)  # the ticker's own wake-up after the stall
    return ticker.worst * 1e3, result


def _popen(preexec: bool, nice: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603
        ["sleep", "30"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, preexec_fn=child_setup(nice) if preexec else None)


async def spawn_phase(ticker: Ticker, spawns: int, nice: int) -> dict[str, list[float]]:
    loop = asyncio.get_running_loop()
    thread = ThreadPoolExecutor(1)
    results: dict[str, list[float]] = {}
    for where in ("thread", "loop"):
        for preexec in (True, False):
            name = f"{'preexec' if preexec else 'plain'}-{where}"
            stalls = []
            for _ in range(spawns):
                if where == "thread":
                    def action(p: bool = preexec) -> Awaitable[subprocess.Popen[bytes]]:
                        return loop.run_in_executor(thread, _popen, p, nice)
                else:
                    async def action(p: bool = preexec) -> subprocess.Popen[bytes]:
                        return _popen(p, nice)
                stall, process = await _measure(ticker, action)
                process.kill()
                await asyncio.to_thread(process.wait)
                stalls.append(stall)
            results[name] = stalls
    thread.shutdown()
    return results


async def replica_phase(ticker: Ticker, replicas: int, nice: int) -> dict[str, list[float]]:
    run_dir = Path(tempfile.mkdtemp(prefix="spawn-stall-"))
    supervisor = ReplicaSupervisor(run_dir, nice=nice)
    serial: list[float] = []
    counter = 0

    def command() -> StartReplicaCommand:
        nonlocal counter
        counter += 1
        return StartReplicaCommand(command_id=str(counter), graph="bench", node=f"r{counter}")

    idle: list[float] = []
    try:
        for _ in range(replicas):
            started = time.perf_counter()
            stall, _info = await _measure(ticker, lambda: supervisor.start(command()))
            took = time.perf_counter() - started
            serial.append(stall)
            # The same window with nothing started: what the machine's load alone costs.
            stall, _ = await _measure(ticker, lambda t=took: asyncio.sleep(t))
            idle.append(stall)
    finally:
        await supervisor.close()
    together = []
    for _ in range(max(1, replicas // 3)):
        supervisor = ReplicaSupervisor(run_dir, nice=nice)
        try:
            stall, _ = await _measure(ticker, lambda s=supervisor: asyncio.gather(
                *(s.start(command()) for _ in range(3))))
            together.append(stall)
        finally:
            await supervisor.close()
    return {"replica-serial": serial, "idle-same-window": idle,
            "replica-three-at-once": together}


def _summary(stalls: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(stalls), 2),
            "max_ms": round(max(stalls), 2), "n": len(stalls)}


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python bench/spawn_stall.py")
    parser.add_argument("--spawns", type=int, default=20, help="spawns per variant")
    parser.add_argument("--replicas", type=int, default=6, help="real replica starts")
    parser.add_argument("--nice", type=int, default=5, help="replica niceness (as the agent)")
    options = parser.parse_args(argv)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ticker = Ticker()
    ticker.start()
    results = await spawn_phase(ticker, options.spawns, options.nice)
    if options.replicas:
        results.update(await replica_phase(ticker, options.replicas, options.nice))
    ticker.stop()
    summary = {name: _summary(stalls) for name, stalls in results.items()}
    print(f"python {sys.version.split()[0]}, this process {rss_mb:.0f} MB RSS (agent imports)")
    print(f"{'variant':<24}{'median ms':>10}{'max ms':>10}{'n':>5}")
    for name, s in summary.items():
        print(f"{name:<24}{s['median_ms']:>10.2f}{s['max_ms']:>10.2f}{s['n']:>5}")
    return {"rss_mb": round(rss_mb, 1), **{k.replace("-", "_"): v for k, v in summary.items()}}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
