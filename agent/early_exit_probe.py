"""Measure a served early-exit variant: per-exit latency and its execution-time distribution.

``understudy models profile-early-exit`` (and the integration test) load a store variant whose
manifest lists the runtime's extra outputs (``model_repo.early_exit``) on a fresh Triton, send
held-out digits one request at a time (batch 1), and read each answer's logits, exit index and
server-measured execution time (``exec_us``). The summary gives, per exit, how many requests
left there and their execution time (p50) and round trip (p50) as the client saw it; over all
requests the execution time's p50, p99 and p99/p50; and the top-1 against the labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.profiler import link_model, profiling_server
from agent.triton import TritonServer
from model_repo.artifacts import find_variant
from model_repo.early_exit import EXEC_TIME_OUTPUT, EXIT_OUTPUT
from model_repo.imported import EVALUATION_FILE


@dataclass
class Probe:
    """Each request's answer: its exit, its server-side time, its round trip, its prediction."""

    exits: list[int] = field(default_factory=list)
    exec_us: list[float] = field(default_factory=list)
    round_trip_us: list[float] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)


def probe(server: TritonServer, model: str, inputs: np.ndarray, input_name: str = "image",
          output_name: str = "logits") -> Probe:
    """Send each input alone (batch 1) and record what the server answered."""
    import time

    result = Probe()
    for item in inputs:
        started = time.perf_counter()
        outputs = server.infer_outputs(model, item[None].astype(np.float32),
                                       [output_name, EXIT_OUTPUT, EXEC_TIME_OUTPUT], input_name)
        result.round_trip_us.append((time.perf_counter() - started) * 1e6)
        result.predicted.append(int(outputs[output_name].reshape(-1).argmax()))
        result.exits.append(int(outputs[EXIT_OUTPUT].reshape(-1)[0]))
        result.exec_us.append(float(outputs[EXEC_TIME_OUTPUT].reshape(-1)[0]))
    return result


def summary(result: Probe, labels: np.ndarray | None = None) -> dict[str, Any]:
    """Per-exit counts and p50 times, the execution time's p50 / p99 / p99 over p50, top-1."""
    exits = np.asarray(result.exits)
    exec_us = np.asarray(result.exec_us, dtype=float)
    trip = np.asarray(result.round_trip_us, dtype=float)
    per_exit = []
    for index in sorted(set(result.exits)):
        taken = exits == index
        per_exit.append({"exit": index, "requests": int(taken.sum()),
                         "share": round(float(taken.mean()), 4),
                         "exec_us_p50": round(float(np.median(exec_us[taken])), 1),
                         "round_trip_us_p50": round(float(np.median(trip[taken])), 1)})
    p50, p99 = (float(np.percentile(exec_us, q)) for q in (50, 99))
    out: dict[str, Any] = {
        "requests": len(exits), "per_exit": per_exit,
        "exec_us_p50": round(p50, 1), "exec_us_p99": round(p99, 1),
        "exec_p99_over_p50": round(p99 / p50, 3) if p50 > 0 else None,
        "exec_us_mean": round(float(exec_us.mean()), 1),
        "exec_us_cv": round(float(exec_us.std() / exec_us.mean()), 3),
        "round_trip_us_p50": round(float(np.median(trip)), 1),
        "round_trip_us_p99": round(float(np.percentile(trip, 99)), 1),
    }
    if labels is not None:
        out["top1"] = round(float((np.asarray(result.predicted) == labels).mean()), 4)
    return out


def profile_variants(store: Path, variants: list[str], work_dir: Path, requests: int,
                     device: str = "cpu") -> dict[str, dict[str, Any]]:
    """Load each variant on a fresh Triton and probe it with ``requests`` held-out inputs."""
    server = profiling_server(work_dir, device)
    results = {}
    server.start()
    try:
        for variant in variants:
            entry = find_variant(store, variant)
            names = [o.name for o in entry.manifest.outputs]
            if EXIT_OUTPUT not in names or EXEC_TIME_OUTPUT not in names:
                raise ValueError(f"{variant} does not answer {EXIT_OUTPUT} and "
                                 f"{EXEC_TIME_OUTPUT}: not an early-exit variant")
            with np.load(store / entry.manifest.family / EVALUATION_FILE,
                         allow_pickle=False) as data:
                inputs, labels = data["inputs"][:requests], data["labels"][:requests]
            model = link_model(server.config.model_repository, entry, server.model_backend,
                               device=server.config.device)
            server.load(model)
            try:
                probe(server, model, inputs[:8], entry.manifest.inputs[0].name, names[0])
                results[variant] = summary(
                    probe(server, model, inputs, entry.manifest.inputs[0].name, names[0]),
                    labels)
            finally:
                server.unload(model)
    finally:
        server.stop()
    return results
