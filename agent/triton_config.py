"""How one Triton runs (``TritonConfig``), where its pieces are (``TritonInstall``), its errors.

The values :mod:`agent.triton`'s wrapper starts and talks to Triton with, apart from it, so
that callers that only configure a Triton or catch its errors do not import the wrapper.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agent.triton_access import bind_address
from model_repo.native_backend import BackendChoice


class TritonError(RuntimeError):
    """Base class of everything that went wrong talking to Triton."""

    retryable = False


class TritonNotInstalledError(TritonError):
    """The ``nvidia-pytriton`` wheel (and with it ``tritonserver``) is missing."""


class TritonStartError(TritonError):
    """``tritonserver`` exited or did not become ready in time; the message has its log tail."""


class TritonCrashedAtStartError(TritonStartError):
    """``tritonserver`` died of a crash signal of its own before it was ready."""


class TritonUnavailableError(TritonError):
    """Triton did not answer (not started, died, or overloaded): worth retrying."""

    retryable = True


class ModelLoadError(TritonError):
    """Triton refused to load a model (bad config, failing ``initialize``): final."""


class ModelNotReadyError(TritonError):
    """Inference on a model that is not loaded."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel put Triton's pieces."""

    binary: Path
    backends: Path
    python_stub: Path
    libs: Path

    @classmethod
    def locate(cls) -> TritonInstall:
        """Find ``tritonserver`` and its backends.

        ``UNDERSTUDY_TRITON_BIN`` / ``UNDERSTUDY_TRITON_BACKENDS`` win (e.g. the official
        Triton image's ``/opt/tritonserver``), else the ``pytriton`` wheel. The Python-backend
        stub always comes from the wheel, built for our Python version.
        """
        try:
            import pytriton
        except ImportError as exc:
            raise TritonNotInstalledError(
                "nvidia-pytriton is not installed (pip install nvidia-pytriton)") from exc
        root = Path(pytriton.__file__).resolve().parent / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        binary = Path(os.environ.get("UNDERSTUDY_TRITON_BIN", root / "bin" / "tritonserver"))
        backends = Path(os.environ.get("UNDERSTUDY_TRITON_BACKENDS", root / "backends"))
        install = cls(binary=binary, backends=backends,
                      python_stub=root / "python_backend_stubs" / version /
                      "triton_python_backend_stub",
                      libs=root.parent.parent / "nvidia_pytriton.libs")
        for path in (install.binary, install.backends / "python", install.python_stub):
            if not path.exists():
                raise TritonNotInstalledError(f"missing Triton component {path}")
        return install


class TritonConfig(BaseModel):
    """How to run one Triton (ports are chosen by the caller; tests allocate free ones)."""

    model_config = ConfigDict(extra="forbid")

    model_repository: Path
    work_dir: Path
    http_port: int = Field(gt=0, lt=65536)
    grpc_port: int = Field(gt=0, lt=65536)
    metrics_port: int = Field(gt=0, lt=65536)
    host: str = "127.0.0.1"
    """Address Triton binds to: loopback by default, or one private interface's address or
    host name (a name is resolved to its IPv4 address at start)."""
    advertise_host: str | None = None
    """Host name clients use to reach Triton (default: ``host``)."""
    model_load_threads: int = Field(2, ge=1)
    use_runtime: bool = True
    model_backend: BackendChoice = "auto"
    """Triton backend of the models: ``understudy`` (native, needs the runtime and a C++
    compiler), ``python``, or ``auto`` (native where it can be had; see
    ``model_repo.native_backend``)."""
    start_timeout_s: float = Field(60.0, gt=0)
    stop_timeout_s: float = Field(10.0, gt=0)
    log_verbose: int = Field(0, ge=0)
    nice: int = Field(0, ge=0, le=19)
    """Scheduling niceness of Triton and the runtime: >0 keeps the control plane (agent
    heartbeats) responsive on a CPU that inference saturates."""
    device: str = Field("cpu", pattern=r"^(cpu|cuda:\d+)$")
    """Where the models run: ``cpu`` (default) or ``cuda:N`` (``KIND_GPU`` on GPU N)."""
    device_name: str | None = None
    """The GPU's name (NVML), recorded with profiles measured on it."""

    @property
    def local_host(self) -> str:
        """Where this machine reaches Triton (loopback when bound to every interface)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host  # noqa: S104

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint as seen from this machine (tritonclient form)."""
        return f"{self.local_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint as seen from this machine."""
        return f"{self.local_host}:{self.grpc_port}"

    def advertised(self, port: int) -> str:
        """``host:port`` clients elsewhere use."""
        return f"{self.advertise_host or self.local_host}:{port}"

    def bind_address(self) -> str:
        """The IP address Triton listens on (a host name resolved)."""
        return bind_address(self.host)
