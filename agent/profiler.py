"""Measure variants on a real Triton: load/unload time, batch-1 latency, resident memory.

This replaces Triton's Model Analyzer in our stack. For each variant of the artifact store it
loads the model ``repeats`` times (median reported), measures p50/p99 latency of batch-1
requests on one of the loads, reads the model instance's private resident memory from the torch
runtime, and unloads it (timed until the instance is gone). A least-squares line
``load_s = a + b * weights_mb`` is fitted over all measured variants.

It lives with the agent because it drives the agent's Triton wrapper (``agent.triton``); the
artifact store it reads and the profile tables it feeds are ``model_repo``'s.
"""

from __future__ import annotations

import logging
import platform
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from agent.gpu import choose_device
from agent.triton import TritonServer
from agent.triton_config import TritonConfig, TritonError
from model_repo.artifacts import MODEL_SOURCE, Manifest, StoreEntry, list_store, render_model_config
from model_repo.imported import unpack_triton_directory
from model_repo.profiles import LoadTimeFit, Measurement
from understudy.wire.ports import free_ports

logger = logging.getLogger(__name__)

DEFAULT_SERVER_TYPE = "testbed"
"""Server type the agents on this machine declare; measured latencies are keyed by it."""


@dataclass(frozen=True)
class ProfileSettings:
    """How much to measure."""

    repeats: int = 5
    latency_requests: int = 50
    warmup_requests: int = 3
    server_type: str = DEFAULT_SERVER_TYPE
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Batch sizes whose latency is measured too (up to each variant's max_batch_size)."""


def fit_load_time(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x`` over (x, y) points; returns (a, b, r2)."""
    if len(points) < 2:
        raise ValueError("a load-time fit needs at least two variants")
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = intercept + slope * xs
    total = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - float(((ys - predicted) ** 2).sum()) / total if total > 0 else 1.0
    return float(intercept), float(slope), r2


def link_model(repository: Path, entry: StoreEntry, backend: str,
               name: str | None = None, device: str = "cpu") -> str:
    """Write a Triton model directory serving a store entry's artifact in place.

    The model is named ``name`` (default: the variant); returns that name.
    """
    name = name or entry.variant
    directory = repository / name
    artifact = (entry.directory / entry.manifest.weights_file).resolve()
    if entry.manifest.format == "triton":
        shutil.rmtree(directory, ignore_errors=True)
        unpack_triton_directory(artifact, directory, name)
        return name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "1" / "model.py").write_bytes(MODEL_SOURCE.read_bytes())
    (directory / "config.pbtxt").write_text(render_model_config(
        name, entry.manifest, str(artifact), backend, device), encoding="utf-8")
    return name


def tensor_names(manifest: Manifest) -> tuple[str, str]:
    """The input and output a request to this variant sends and reads."""
    if manifest.inputs and manifest.outputs:
        return manifest.inputs[0].name, manifest.outputs[0].name
    return "image", "logits"


def sample_batch(manifest: Manifest, size: int, seed: int = 0) -> np.ndarray:
    """A batch of random inputs of the variant's input shape (float32)."""
    if manifest.inputs:
        item = tuple(1 if d < 0 else d for d in manifest.inputs[0].dims)
    else:
        side = manifest.network.image_side
        item = (3, side, side)
    return np.random.default_rng(seed).random((size, *item), dtype=np.float32)


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def request_latencies_ms(server: TritonServer, model: str, batch: np.ndarray,
                         names: tuple[str, str], requests: int) -> list[float]:
    """Wall time of ``requests`` requests of ``batch``, one after the other, ms."""
    out = []
    for _ in range(requests):
        started = time.perf_counter()
        server.infer(model, batch, *names)
        out.append((time.perf_counter() - started) * 1000.0)
    return out


def measure_variant(server: TritonServer, model: str, entry: StoreEntry,
                    settings: ProfileSettings) -> Measurement:
    """Measure one variant already present in ``server``'s repository."""
    image = sample_batch(entry.manifest, 1)
    names = tensor_names(entry.manifest)
    loads: list[float] = []
    unloads: list[float] = []
    latencies_ms: list[float] = []
    by_batch: dict[str, float] = {}
    resident: float | None = None
    device_mb: float | None = None
    for repeat in range(settings.repeats):
        loads.append(server.load(model))
        server.infer(model, image, *names)  # serving, not just "loaded", before the unload
        if repeat == 0:
            for _ in range(settings.warmup_requests):
                server.infer(model, image, *names)
            latencies_ms = request_latencies_ms(server, model, image, names,
                                                settings.latency_requests)
            for size in settings.batch_sizes:
                if 1 < size <= entry.manifest.max_batch_size:
                    batch = sample_batch(entry.manifest, size)
                    by_batch[str(size)] = _percentile(request_latencies_ms(
                        server, model, batch, names, max(5, settings.latency_requests // 5)), 50)
            resident = server.model_memory_mb([model]).get(model)
            device_mb = server.model_device_memory_mb([model]).get(model)
        unloads.append(server.unload(model))
    by_batch = {"1": _percentile(latencies_ms, 50), **by_batch}
    return Measurement(
        host=platform.node(), server_type=settings.server_type,
        artifact_scale=entry.manifest.scale, weights_mb=entry.manifest.weights_mb,
        repeats=settings.repeats, load_s=statistics.median(loads),
        load_s_runs=[round(x, 4) for x in loads], unload_s=statistics.median(unloads),
        latency_p50_ms=_percentile(latencies_ms, 50), latency_p99_ms=_percentile(latencies_ms, 99),
        latency_requests=settings.latency_requests,
        resident_mb=round(resident, 2) if resident is not None else None,
        measured_on=date.today().isoformat(),
        latency_ms_by_batch={k: round(v, 4) for k, v in by_batch.items()},
        device_mb=round(device_mb, 2) if device_mb is not None else None,
        device=server.device_name)


def measure_with_retry(server: TritonServer, model: str, entry: StoreEntry,
                        settings: ProfileSettings, attempts: int = 2) -> Measurement:
    """Measure; if Triton itself dies meanwhile, restart it and measure the variant again."""
    for attempt in range(1, attempts + 1):
        try:
            return measure_variant(server, model, entry, settings)
        except TritonError:
            if server.alive() or attempt == attempts:
                raise
            logger.warning("Triton died while profiling %s (exit %s); restarting it",
                           model, server.process.returncode if server.process else None)
            server.kill()
            server.start()
    raise AssertionError("unreachable")


def profile_store(store: Path, work_dir: Path, variants: Sequence[str] | None = None,
                  settings: ProfileSettings | None = None,
                  progress: Callable[[StoreEntry, Measurement], None] | None = None,
                  ) -> tuple[dict[str, tuple[StoreEntry, Measurement]], LoadTimeFit | None]:
    """Profile the store's variants (all, or ``variants``) on a fresh Triton.

    Returns the measurements by variant and the load-time fit (None with fewer than two).
    """
    settings = settings or ProfileSettings()
    entries = [e for e in list_store(store) if e.manifest.synthetic
               and (variants is None or e.variant in variants)]
    missing = sorted(set(variants or ()) - {e.variant for e in entries})
    if missing:
        raise ValueError(f"not in the artifact store {store}: {', '.join(missing)}")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(TritonConfig(model_repository=work_dir / "repository",
                                       work_dir=work_dir / "triton", http_port=http,
                                       grpc_port=grpc, metrics_port=metrics))
    results: dict[str, tuple[StoreEntry, Measurement]] = {}
    server.start()
    try:
        for entry in entries:
            model = link_model(server.config.model_repository, entry, server.model_backend)
            measurement = measure_with_retry(server, model, entry, settings)
            results[entry.variant] = (entry, measurement)
            if progress is not None:
                progress(entry, measurement)
    finally:
        server.stop()
    fit = None
    if len(results) >= 2:
        intercept, slope, r2 = fit_load_time(
            [(m.weights_mb, m.load_s) for _, m in results.values()])
        scales = {m.artifact_scale for _, m in results.values()}
        fit = LoadTimeFit(intercept_s=intercept, slope_s_per_mb=slope, r2=r2,
                          variants=len(results), artifact_scale=min(scales),
                          server_type=settings.server_type)
    return results, fit


def profiling_server(work_dir: Path, device: str) -> TritonServer:
    """A Triton to profile on, not started: its files under ``work_dir``, on free ports.

    ``device`` as ``agent.gpu.choose_device`` takes it.
    """
    chosen, gpu = choose_device(device)
    http, grpc, metrics = free_ports(3)
    return TritonServer(TritonConfig(
        model_repository=work_dir / "repository", work_dir=work_dir / "triton", http_port=http,
        grpc_port=grpc, metrics_port=metrics, device=chosen,
        device_name=gpu.name if gpu is not None else None))
