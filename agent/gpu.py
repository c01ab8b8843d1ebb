"""The one wrapper around NVML: which GPUs a server has, and what each process holds on them.

NVML comes from ``nvidia-ml-py`` (imported as ``pynvml``), an optional dependency: without it,
without a driver, or without a GPU, :func:`discover` finds nothing and the server stays on the
CPU, the default everywhere. With a GPU, the agent's capacity is discovered (its memory, and its
compute in the profiles' unit: percent of one reference GPU, from its CUDA cores and SM clock),
models are placed on it (``KIND_GPU`` in their config, ``device`` ``cuda:0`` for the runtime)
and their memory is read from the device per process.

Every function takes the NVML module as an argument (default: ``pynvml`` if importable), so the
tests drive them with a fake module.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from model_repo.profiles import COMPUTE_PERCENT_OF_GPU, REFERENCE_PEAK_GFLOPS

logger = logging.getLogger(__name__)

MB = 1024 * 1024


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML describes it."""

    index: int
    name: str
    memory_total_mb: float
    cuda_cores: int | None
    max_sm_clock_mhz: int | None

    @property
    def peak_fp32_gflops(self) -> float | None:
        """Two FLOPs (one fused multiply-add) per CUDA core per clock, where NVML tells both."""
        if not self.cuda_cores or not self.max_sm_clock_mhz:
            return None
        return 2.0 * self.cuda_cores * self.max_sm_clock_mhz / 1000.0

    @property
    def compute(self) -> float:
        """Compute capacity in percent of one reference GPU (100: unknown speed)."""
        peak = self.peak_fp32_gflops
        return COMPUTE_PERCENT_OF_GPU * (peak / REFERENCE_PEAK_GFLOPS if peak else 1.0)


def nvml_module() -> ModuleType | None:
    """``pynvml`` when installed, else None."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: Any, name: str, *args: Any) -> Any:
    """An NVML query that older drivers or libraries may lack: None when it fails."""
    function = getattr(nvml, name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin
        return None


def discover(nvml: Any = None) -> list[GpuInfo]:
    """The GPUs NVML sees; empty without NVML, a driver or a GPU (never raises)."""
    nvml = nvml if nvml is not None else nvml_module()
    if nvml is None:
        return []
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver: NVMLError_LibraryNotFound etc.
        logger.info("no GPU: NVML did not start (%s)", exc)
        return []
    try:
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            clock = _optional(nvml, "nvmlDeviceGetMaxClockInfo", handle,
                              getattr(nvml, "NVML_CLOCK_SM", 1))
            cores = _optional(nvml, "nvmlDeviceGetNumGpuCores", handle)
            gpus.append(GpuInfo(index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
                                memory_total_mb=float(memory.total) / MB,
                                cuda_cores=int(cores) if cores else None,
                                max_sm_clock_mhz=int(clock) if clock else None))
        return gpus
    except Exception as exc:  # noqa: BLE001 - a broken driver is "no GPU", not a crash
        logger.warning("NVML failed while listing GPUs (%s); using the CPU", exc)
        return []
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def capacity(gpu: GpuInfo) -> dict[str, float]:
    """An agent's capacity on ``gpu``: its memory (MB) and compute (percent of the reference)."""
    return {"memory_mb": round(gpu.memory_total_mb, 1), "compute": round(gpu.compute, 3)}


def process_memory_mb(pids: Iterable[int], index: int = 0, nvml: Any = None) -> dict[int, float]:
    """Memory each of ``pids`` holds on GPU ``index`` (MB); empty without NVML."""
    nvml = nvml if nvml is not None else nvml_module()
    wanted = set(pids)
    if nvml is None or not wanted:
        return {}
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return {}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        used: dict[int, float] = {}
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            memory = getattr(process, "usedGpuMemory", None)
            if process.pid in wanted and memory is not None:
                used[process.pid] = used.get(process.pid, 0.0) + float(memory) / MB
        return used
    except Exception as exc:  # noqa: BLE001
        logger.warning("NVML could not list the processes on GPU %d (%s)", index, exc)
        return {}
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def frameworks_use_cuda() -> bool:
    """Whether this installation's torch can run on a GPU (CPU wheels cannot)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def choose_device(requested: str, nvml: Any = None) -> tuple[str, GpuInfo | None]:
    """Where models go: ``cpu``, or ``cuda:0`` with its GPU.

    ``auto`` takes GPU 0 when NVML finds one and the frameworks can use it; ``gpu`` insists
    (ValueError when there is none); ``cpu`` never looks.
    """
    if requested == "cpu":
        return "cpu", None
    gpus = discover(nvml)
    if gpus and (requested == "gpu" or frameworks_use_cuda()):
        return "cuda:0", gpus[0]
    if requested == "gpu":
        raise ValueError("device 'gpu' asked for, but NVML finds no GPU "
                         "(pip install nvidia-ml-py, and a driver)")
    if gpus:
        logger.warning("GPU %s found, but torch here has no CUDA: models stay on the CPU",
                       gpus[0].name)
    return "cpu", None
