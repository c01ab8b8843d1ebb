"""What backing the torch runtime's heap with huge pages saves (model_repo/huge_pages.py).

Usage: ``python bench/runtime_huge_pages.py [--repeats 6] [--children 8]``. Two parts, each
run with the collapse off (``UNDERSTUDY_HEAP_HUGE_PAGES=0``) and on, in the same process
tree, alternating:

* **fork and exit**: a process imports torch, freezes its heap as the runtime does (and
  collapses it into huge pages, or not), forks ``--children`` idle children, then SIGKILLs
  them; reported: a fork's time, the time until all are reaped and the machine's busy CPU
  time from the kill to 200 ms later (``/proc/stat``; the machine should be otherwise idle);
* **a load after a kill**: two Tritons with the torch runtime; A holds 4 models. A model
  (mobilenet_v3_small) is loaded on B on a quiet machine, then right after every process of
  A is SIGKILLed, as a failover's interim load runs next to a dead server's teardown on the
  shared testbed.

Medians over the repeats; the last line is one JSON object with the ratios (off / on).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kill_cost import TICKS, VARIANTS, busy_ticks  # noqa: E402

from model_repo.huge_pages import SWITCH_ENV  # noqa: E402

SETTLE_S = 0.2


def fork_and_exit(children: int, repeats: int) -> dict[str, float]:
    """In this process: import torch, prepare the heap as the runtime does, fork, kill."""
    import gc

    import torch

    from model_repo.huge_pages import collapse_heap

    torch.set_num_threads(1)
    gc.collect()
    gc.freeze()
    report = collapse_heap()
    forks, reaped, busy = [], [], []
    for _ in range(repeats):
        pids = []
        for _ in range(children):
            started = time.perf_counter()
            pid = os.fork()
            if pid == 0:  # an idle worker: one small tensor, then wait to be killed
                torch.zeros(16)
                signal.pause()
                os._exit(0)
            forks.append(time.perf_counter() - started)
            pids.append(pid)
        time.sleep(0.5)
        before, started = busy_ticks(), time.perf_counter()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        reaped.append(time.perf_counter() - started)
        time.sleep(SETTLE_S)
        busy.append((busy_ticks() - before) / TICKS)
    return {"fork_ms": 1000 * statistics.median(forks),
            "reaped_ms": 1000 * statistics.median(reaped),
            "busy_cpu_ms": 1000 * statistics.median(busy),
            "huge_mb": report.huge_mb if report is not None else 0.0}


def load_after_kill(repeats: int) -> dict[str, float]:
    """In this process: quiet loads on B, and loads on B right after A is SIGKILLed."""
    from agent.profiler import link_model
    from agent.triton import TritonServer
    from agent.triton_config import TritonConfig
    from model_repo.artifacts import find_variant
    from model_repo.runtime import runtime_stats
    from understudy.wire.ports import free_ports

    store = REPO / "runs" / "artifacts"

    def server(work: Path, name: str, variants: list[str]) -> TritonServer:
        http, grpc, metrics = free_ports(3)
        triton = TritonServer(TritonConfig(
            model_repository=work / name / "repository", work_dir=work / name / "triton",
            http_port=http, grpc_port=grpc, metrics_port=metrics, nice=5))
        for index, variant in enumerate(variants):
            link_model(triton.config.model_repository, find_variant(store, variant),
                       triton.model_backend, f"m{index}")
        return triton

    quiet, after_kill = [], []
    with tempfile.TemporaryDirectory(prefix="huge-pages-") as scratch:
        work = Path(scratch)
        b = server(work, "b", ["mobilenet_v3_small"] * (2 * repeats))
        b.start()
        try:
            for index in range(repeats):
                a = server(work, f"a{index}", list(VARIANTS[:4]))
                a.start()
                try:
                    for model in range(4):
                        a.load(f"m{model}")
                    time.sleep(1.0)
                    quiet.append(b.load(f"m{2 * index}"))
                    time.sleep(0.5)
                    assert a.process is not None and a.runtime is not None  # noqa: S101
                    pids = [a.process.pid, a.runtime.pid]
                    pids += [w["pid"] for w in runtime_stats(a.runtime_socket)]
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    after_kill.append(b.load(f"m{2 * index + 1}"))
                finally:
                    a.stop()
                time.sleep(0.3)
        finally:
            b.stop()
    return {"quiet_load_ms": 1000 * statistics.median(quiet),
            "load_after_kill_ms": 1000 * statistics.median(after_kill)}


def _in_child(part: str, huge: bool, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, SWITCH_ENV: "1" if huge else "0"}
    out = subprocess.run(
        [sys.executable, __file__, "--part", part, "--repeats", str(args.repeats),
         "--children", str(args.children)],
        env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--part", choices=("fork", "load"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "fork":
        print(json.dumps(fork_and_exit(args.children, args.repeats)))
        return 0
    if args.part == "load":
        print(json.dumps(load_after_kill(args.repeats)))
        return 0
    results: dict[str, dict[str, float]] = {}
    for part in ("fork", "load"):
        for huge in (False, True):
            figures = _in_child(part, huge, args)
            key = "on" if huge else "off"
            results.setdefault(key, {}).update(figures)
            print(f"{part:4s} huge pages {key:3s}: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    off, on = results["off"], results["on"]
    summary = {"children": args.children, "repeats": args.repeats,
               **{f"{k}_off": round(off[k], 1) for k in off},
               **{f"{k}_on": round(on[k], 1) for k in on},
               "fork_ratio": round(off["fork_ms"] / on["fork_ms"], 2),
               "teardown_cpu_ratio": round(off["busy_cpu_ms"] / max(on["busy_cpu_ms"], 1.0), 2),
               "load_after_kill_ratio": round(off["load_after_kill_ms"]
                                              / on["load_after_kill_ms"], 2)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
