"""CPU the machine spends tearing down one SIGKILLed server (Triton, runtime, model workers).

Usage: ``python bench/kill_cost.py [--repeats 5] [--models 4]``.

Why: on the live testbed all six servers share this machine, so when the bench SIGKILLs one,
the kernel's teardown of its processes (their memory, threads and sockets) runs on the same
two cores as the survivors' interim loads, and at the same moment: detection takes ~12 ms, the
teardown longer. On a real cluster that CPU belongs to the dead machine. This bench starts one
Triton with the torch runtime, loads ``--models`` demo variants through the native backend,
SIGKILLs every process of it at once, and reports how long until all are dead and how much CPU
the whole machine was busy for from the kill to 200 ms later (``/proc/stat``; the machine
should be otherwise idle). Medians over the repeats; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.profiler import link_model  # noqa: E402
from agent.triton import TritonServer  # noqa: E402
from agent.triton_config import TritonConfig  # noqa: E402
from model_repo.artifacts import find_variant  # noqa: E402
from model_repo.runtime import runtime_stats  # noqa: E402
from understudy.wire.ports import free_ports  # noqa: E402

VARIANTS = ("mobilenet_v3_large", "convnext_base", "shufflenet_v2_x2_0", "efficientnet_b7",
            "convnext_small", "mobilenet_v3_small")
TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 0.2


def busy_ticks() -> int:
    """Clock ticks the machine spent busy (all but idle and iowait) since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values) - values[3] - values[4]


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def one_kill(models: int) -> tuple[int, float, float]:
    """Start, load, SIGKILL everything; (processes, ms until all dead, busy CPU ms)."""
    with tempfile.TemporaryDirectory(prefix="kill-cost-") as scratch:
        work = Path(scratch)
        http, grpc, metrics = free_ports(3)
        server = TritonServer(TritonConfig(
            model_repository=work / "repository", work_dir=work / "triton", http_port=http,
            grpc_port=grpc, metrics_port=metrics))
        store = REPO / "runs" / "artifacts"
        for index, variant in enumerate(VARIANTS[:models]):
            link_model(server.config.model_repository, find_variant(store, variant),
                       server.model_backend, f"m{index}")
        server.start()
        try:
            for index in range(models):
                server.load(f"m{index}")
            assert server.process is not None and server.runtime is not None  # noqa: S101
            pids = [server.process.pid, server.runtime.pid]
            pids += [w["pid"] for w in runtime_stats(server.runtime_socket)]
            time.sleep(1.0)  # let the loads' after-effects settle
            before, started = busy_ticks(), time.perf_counter()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            while any(alive(pid) for pid in pids):
                time.sleep(0.0005)
            dead = time.perf_counter() - started
            time.sleep(max(0.0, SETTLE_S - dead))
            busy = (busy_ticks() - before) / TICKS
        finally:
            server.stop()
    return len(pids), 1000 * dead, 1000 * busy


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", type=int, default=4, choices=range(1, len(VARIANTS) + 1))
    args = parser.parse_args()
    runs = [one_kill(args.models) for _ in range(args.repeats)]
    for processes, dead_ms, busy_ms in runs:
        print(f"{processes} processes dead {dead_ms:.1f} ms after the SIGKILL; machine busy "
              f"{busy_ms:.0f} ms of CPU in the {1000 * SETTLE_S:.0f} ms from the kill")
    print(json.dumps({"models": args.models, "repeats": args.repeats, "cores": os.cpu_count(),
                      "dead_ms": round(statistics.median(r[1] for r in runs), 1),
                      "busy_cpu_ms": round(statistics.median(r[2] for r in runs))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
