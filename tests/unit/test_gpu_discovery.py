"""GPU discovery through NVML, driven by a fake NVML module (no GPU on the test machines)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agent.gpu import GpuInfo, capacity, choose_device, discover, process_memory_mb
from model_repo.artifacts import render_model_config
from understudy.wire.artifacts import Manifest, TensorSpec

MB = 1024 * 1024


class FakeNvml:
    """The handful of pynvml calls agent.gpu makes, over a list of fake devices."""

    NVML_CLOCK_SM = 1

    def __init__(self, devices: list[dict[str, Any]], fail_init: bool = False) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.started = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")
        self.started += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.started -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:  # noqa: N802
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:  # noqa: N802
        return handle["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> Any:  # noqa: N802
        return SimpleNamespace(total=handle["memory_mb"] * MB, free=0, used=0)

    def nvmlDeviceGetMaxClockInfo(self, handle: dict[str, Any], _clock: int) -> int:  # noqa: N802
        return handle["clock_mhz"]

    def nvmlDeviceGetNumGpuCores(self, handle: dict[str, Any]) -> int:  # noqa: N802
        if handle.get("cores") is None:
            raise RuntimeError("NVMLError_NotSupported")
        return handle["cores"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb * MB)
                for pid, mb in handle.get("processes", {}).items()]


A2 = {"name": "NVIDIA A2", "memory_mb": 15356, "clock_mhz": 1770, "cores": 1280,
      "processes": {101: 300.0, 102: 42.5}}


def test_no_nvml_or_no_driver_means_no_gpu() -> None:
    assert discover(FakeNvml([], fail_init=True)) == []
    assert discover(FakeNvml([])) == []
    assert choose_device("auto", FakeNvml([], fail_init=True)) == ("cpu", None)


def test_a_gpu_is_discovered_with_its_memory_and_compute() -> None:
    nvml = FakeNvml([A2])
    (gpu,) = discover(nvml)
    assert nvml.started == 0  # every init was shut down
    assert gpu.name == "NVIDIA A2" and gpu.memory_total_mb == pytest.approx(15356)
    # 1280 cores x 2 FLOP x 1.77 GHz = 4531 GFLOP/s: about one reference A2 (4500).
    assert gpu.peak_fp32_gflops == pytest.approx(4531.2)
    assert capacity(gpu) == {"memory_mb": 15356.0, "compute": pytest.approx(100.693, abs=1e-3)}


def test_a_gpu_whose_cores_nvml_cannot_tell_counts_as_one_reference_gpu() -> None:
    (gpu,) = discover(FakeNvml([{**A2, "cores": None}]))
    assert gpu.cuda_cores is None and gpu.compute == 100.0


def test_per_process_device_memory() -> None:
    assert process_memory_mb([101, 999], nvml=FakeNvml([A2])) == {101: pytest.approx(300.0)}
    assert process_memory_mb([101], nvml=FakeNvml([A2], fail_init=True)) == {}


def test_auto_stays_on_the_cpu_when_torch_has_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.gpu.frameworks_use_cuda", lambda: False)
    assert choose_device("auto", FakeNvml([A2])) == ("cpu", None)
    device, gpu = choose_device("gpu", FakeNvml([A2]))
    assert device == "cuda:0" and isinstance(gpu, GpuInfo)
    monkeypatch.setattr("agent.gpu.frameworks_use_cuda", lambda: True)
    assert choose_device("auto", FakeNvml([A2]))[0] == "cuda:0"
    assert choose_device("cpu", FakeNvml([A2])) == ("cpu", None)
    with pytest.raises(ValueError, match="no GPU"):
        choose_device("gpu", FakeNvml([]))


def test_a_model_on_a_gpu_gets_a_kind_gpu_instance_and_the_device_parameter() -> None:
    manifest = Manifest(family="f", variant="v", profiled_size_mb=1, scale=1, weights_mb=1,
                        weights_sha256="0", max_batch_size=4, format="onnx",
                        weights_file="model.onnx",
                        inputs=(TensorSpec(name="x", dims=(4,)),),
                        outputs=(TensorSpec(name="y", dims=(3,)),))
    on_gpu = render_model_config("app__v", manifest, "/m.onnx", "understudy", "cuda:0")
    assert "kind: KIND_GPU count: 1 gpus: [ 0 ]" in on_gpu
    assert 'key: "device" value: { string_value: "cuda:0" }' in on_gpu
    on_cpu = render_model_config("app__v", manifest, "/m.onnx", "understudy")
    assert "KIND_CPU" in on_cpu and '"device"' not in on_cpu
