"""CPU cost of one model load, by process, and wall time of 1..N concurrent loads, per backend.

Usage: ``python bench/load_cpu.py [--variant mobilenet_v3_small] [--repeats 6] [--concurrent 3]
[--backends understudy,python]``.

Why: a failover's interim loads run at once, and on the live testbed all six servers share this
machine's two cores. If a load is CPU-bound, N concurrent loads cannot finish in the time of
one. For each backend (the native ``understudy`` backend, then Triton's Python backend, in the
same process) this bench starts one Triton (with the torch runtime) and measures, per load,
the CPU seconds of the Python stub Triton starts for the model (Python backend only), of the
runtime worker that builds it, and of Triton and the runtime themselves (scheduler run time
from ``/proc``; the runtime's share includes forking the spare that replaces the one the load
took), then the wall time of 1..N loads of distinct copies of the variant started together.
Medians over the repeats; the last line is one JSON object with each backend's figures and the
Python backend's over the native one's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.profiler import link_model  # noqa: E402
from agent.triton import TritonServer  # noqa: E402
from agent.triton_config import TritonConfig  # noqa: E402
from model_repo.artifacts import find_variant  # noqa: E402
from model_repo.native_backend import NATIVE_BACKEND, PYTHON_BACKEND  # noqa: E402
from understudy.wire.ports import free_ports  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_s(pid: int) -> float:
    """CPU seconds of a live process (0 once it is gone), in nanoseconds' precision.

    The sum of its live threads' scheduler run time (``/proc/PID/task/*/schedstat``): a load
    now costs the worker ~10 ms, which ``/proc/PID/stat``'s 10 ms ticks round to 0 or 10.
    A thread that has exited no longer counts; where none is readable, the ticks are used.
    """
    total, found = 0, False
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as handle:
                    total += int(handle.read().split()[0])
                    found = True
    except OSError:
        return 0.0
    if found:
        return total / 1e9
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS if fields else 0.0


def process_tree(roots: list[int]) -> dict[int, str]:
    """Every live descendant of ``roots`` (roots included), with its command name."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = {}, list(roots)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii") as handle:
                found[pid] = handle.read().strip()
        except OSError:
            continue
        todo.extend(children.get(pid, []))
    return found


def _role(pid: int, name: str, server: TritonServer) -> str:
    if server.process is not None and pid == server.process.pid:
        return "triton"
    if server.runtime is not None and pid == server.runtime.pid:
        return "runtime"
    return "stub" if name.startswith("triton_python") else "worker"


def measure_cpu(server: TritonServer, model: str) -> tuple[float, dict[str, float]]:
    """One load: its wall time and the CPU seconds it cost, by role."""
    roots = [p.pid for p in (server.process, server.runtime) if p is not None]
    before = {pid: cpu_s(pid) for pid in process_tree(roots)}
    started = time.perf_counter()
    server.load(model)
    wall = time.perf_counter() - started
    by_role: dict[str, float] = {}
    for pid, name in process_tree(roots).items():
        role = _role(pid, name, server)
        by_role[role] = by_role.get(role, 0.0) + cpu_s(pid) - before.get(pid, 0.0)
    server.unload(model)
    return wall, by_role


def measure_concurrent(server: TritonServer, models: list[str]) -> list[float]:
    """Wall time of each of ``models`` loaded at the same instant."""
    with ThreadPoolExecutor(len(models)) as pool:
        walls = list(pool.map(server.load, models))
    for model in models:
        server.unload(model)
    return walls


def measure_backend(backend: str, args: argparse.Namespace) -> dict[str, object]:
    """Every figure of one backend on a fresh Triton."""
    with tempfile.TemporaryDirectory(prefix="load-cpu-") as scratch:
        work = Path(scratch)
        http, grpc, metrics = free_ports(3)
        server = TritonServer(TritonConfig(
            model_repository=work / "repository", work_dir=work / "triton", http_port=http,
            grpc_port=grpc, metrics_port=metrics, model_load_threads=args.concurrent,
            model_backend=backend))
        models = [f"copy{i}__{args.variant}" for i in range(args.concurrent)]
        entry = find_variant(REPO / "runs" / "artifacts", args.variant)
        for model in models:
            link_model(server.config.model_repository, entry, server.model_backend, model)
        server.start()
        try:
            measure_cpu(server, models[0])  # the runtime's first fork is slower; not counted
            single = [measure_cpu(server, models[0]) for _ in range(args.repeats)]
            concurrent = {n: [measure_concurrent(server, models[:n]) for _ in range(args.repeats)]
                          for n in range(1, args.concurrent + 1)}
        finally:
            server.stop()
    roles = sorted({role for _, by_role in single for role in by_role})
    cpu_ms = {role: round(1000 * statistics.median(b.get(role, 0.0) for _, b in single))
              for role in roles}
    print(f"[{backend}] one load of {args.variant}: wall median "
          f"{1000 * statistics.median(w for w, _ in single):.0f} ms; CPU ms by process "
          f"(median): {cpu_ms}")
    result: dict[str, object] = {"load_wall_ms": round(1000 * statistics.median(
                                     w for w, _ in single)),
                                 "load_cpu_ms": round(1000 * statistics.median(
                                     sum(b.values()) for _, b in single)),
                                 "load_cpu_ms_by_process": cpu_ms}
    for n, runs in concurrent.items():
        mean_walls = [statistics.fmean(walls) for walls in runs]
        last_walls = [max(walls) for walls in runs]
        print(f"[{backend}] {n} concurrent: mean wall {1000 * statistics.median(mean_walls):.0f}"
              f" ms, slowest {1000 * statistics.median(last_walls):.0f} ms (medians over "
              f"{len(runs)})")
        result[f"concurrent_{n}_mean_wall_ms"] = round(1000 * statistics.median(mean_walls))
        result[f"concurrent_{n}_slowest_wall_ms"] = round(1000 * statistics.median(last_walls))
    return result


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="mobilenet_v3_small")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--concurrent", type=int, default=3)
    parser.add_argument("--backends", type=lambda text: text.split(","),
                        default=[NATIVE_BACKEND, PYTHON_BACKEND])
    args = parser.parse_args()
    result: dict[str, object] = {"variant": args.variant, "repeats": args.repeats,
                                 "cores": os.cpu_count()}
    figures = {backend: measure_backend(backend, args) for backend in args.backends}
    result.update(figures)
    if NATIVE_BACKEND in figures and PYTHON_BACKEND in figures:
        native, python = figures[NATIVE_BACKEND], figures[PYTHON_BACKEND]
        last = f"concurrent_{args.concurrent}_slowest_wall_ms"
        for key in ("load_wall_ms", "load_cpu_ms", last):
            value = native[key]
            assert isinstance(value, int)  # noqa: S101 - set above
            result[f"python_over_native_{key}"] = (
                round(float(python[key]) / value, 2) if value else None)  # type: ignore[arg-type]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
