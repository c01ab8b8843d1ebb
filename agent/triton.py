"""The one wrapper around Triton Inference Server: process, health, repository API, inference.

Triton comes from the ``nvidia-pytriton`` wheel (``pytriton/tritonserver``). It runs in explicit
model-control mode with ``--disable-auto-complete-config`` (a small model then loads in ~0.1 s
instead of ~1.3 s), bound to 127.0.0.1 (or the one address given) on the ports given. Beside it
runs the per-server torch runtime (:mod:`model_repo.runtime`) that the generated models use, so
that a model's load time is its own and not the cost of importing torch again.
Model control is the agent's alone (:mod:`agent.triton_access`), and goes over gRPC: Triton's
HTTP server runs a load on the worker thread that the request's connection is bound to, and every
other connection bound to that thread, inference included, waits until the model is loaded;
its gRPC server runs loads and unloads on threads of their own.

Only this module calls ``tritonclient`` on behalf of the agent and the profiler.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent.processes import child_setup
from agent.triton_access import (
    GRPC_MODEL_CONTROL_HEADER,
    MODEL_CONTROL_KEY_FILE,
    is_every_interface,
    restriction_args,
)
from agent.triton_config import (
    ModelLoadError,
    TritonConfig,
    TritonCrashedAtStartError,
    TritonInstall,
    TritonStartError,
    TritonUnavailableError,
)
from agent.triton_launch import (
    kill_orphan_stubs,
    link_backends,
    log_tail,
    start_runtime,
    triton_environment,
)
from model_repo.native_backend import resolve_backend
from understudy.wire.secret_files import new_secret, write_secret_file

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 300.0
"""Longest wait for a model-control call (a large model's load)."""
GRPC_NO_ANSWER = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED",
                            "StatusCode.CANCELLED"})
"""gRPC statuses that mean no answer from Triton (retryable), not a refused call."""
START_ATTEMPTS = 3
"""Launches of ``tritonserver`` by one :meth:`TritonServer.start` when it crashes as it starts."""
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS})
"""Signals of a ``tritonserver`` that crashed by itself (rarely, its gRPC event engine aborts
while it starts): started again, unlike an exit with a code (bad configuration, a port in use)
or a kill from outside."""


class TritonServer:
    """One ``tritonserver`` process (and its torch runtime), owned by the caller."""

    def __init__(self, config: TritonConfig, install: TritonInstall | None = None,
                 on_exit: Callable[[subprocess.Popen[bytes], int], None] | None = None) -> None:
        self.config = config
        self.on_exit = on_exit
        """Called (from a watcher thread) the moment Triton exits on its own."""
        self._stopping = False
        self.install = install or TritonInstall.locate()
        self.process: subprocess.Popen[bytes] | None = None
        self.runtime: subprocess.Popen[bytes] | None = None
        self._clients: dict[tuple[int, str], Any] = {}
        """Each thread's clients by (thread id, kind), so that a stop can close them all."""
        self._clients_lock = threading.Lock()
        config.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = config.work_dir / "tritonserver.log"
        self.runtime_socket = config.work_dir / "torch-runtime.sock"
        self.control_key_file = config.work_dir / MODEL_CONTROL_KEY_FILE
        self._control_key = new_secret()
        """Model control's key: new at every start, known to this object and the key file."""
        self.model_backend, self._native_library = resolve_backend(config.model_backend,
                                                                   config.use_runtime)
        """The backend name the models' config.pbtxt must carry on this server."""

    # --- process -------------------------------------------------------------------------

    def _backend_dir(self) -> Path:
        """The backend directory: the Python backend, and the native one where it is used."""
        return link_backends(self.config.work_dir / "backends", self.install,
                             self._native_library)

    def environment(self) -> dict[str, str]:
        """Environment of ``tritonserver`` (inherited by the Python stubs)."""
        return triton_environment(
            self.install, self.runtime_socket if self.config.use_runtime else None)

    def command(self) -> list[str]:
        """The ``tritonserver`` command line.

        It holds the model-control key (see :func:`agent.triton_access.restriction_args`).
        """
        c = self.config
        address = c.bind_address()
        return [
            str(self.install.binary),
            f"--model-repository={c.model_repository}",
            "--model-control-mode=explicit",
            "--disable-auto-complete-config",
            f"--backend-directory={self._backend_dir()}",
            f"--http-address={address}", f"--http-port={c.http_port}",
            f"--grpc-address={address}", f"--grpc-port={c.grpc_port}",
            f"--metrics-address={address}", f"--metrics-port={c.metrics_port}",
            *restriction_args(self._control_key),
            f"--model-load-thread-count={c.model_load_threads}",
            "--exit-timeout-secs=5",
            f"--log-verbose={c.log_verbose}",
        ]

    def start(self) -> None:
        """Start the runtime and Triton, and wait until Triton reports ready."""
        if self.process is not None and self.process.poll() is None:
            return
        self.config.model_repository.mkdir(parents=True, exist_ok=True)
        if self.config.use_runtime:
            self._start_runtime()
        self._control_key = new_secret()
        write_secret_file(self.control_key_file, self._control_key + "\n")
        if is_every_interface(self.config.bind_address()):
            logger.warning("Triton listens on every interface (%s): every network this server "
                           "is on reaches its inference endpoints", self.config.host)
        for attempt in range(1, START_ATTEMPTS + 1):
            self._launch()
            try:
                self._wait_ready()
                break
            except TritonCrashedAtStartError as exc:
                if attempt == START_ATTEMPTS:
                    raise
                logger.warning("tritonserver crashed while starting (attempt %d of %d); "
                               "starting it again: %s", attempt, START_ATTEMPTS, exc)
        assert self.process is not None  # noqa: S101 - set by _launch()
        logger.info("tritonserver pid %d ready on http %s grpc %s", self.process.pid,
                    self.config.http_url, self.config.grpc_url)

    def _launch(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                preexec_fn=child_setup(self.config.nice))
        finally:
            log.close()
        # Every thread's clients, not only this one's: a restart may have moved Triton to
        # fresh ports (``TritonKeeper.fresh_ports``), and a load thread's cached client would
        # still dial the old ones (connection refused right after ``triton_up``).
        self._close_every_client()
        self._stopping = False
        self._watch(self.process)

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """Block a thread in waitpid, so a death is handled the instant it happens."""

        def wait() -> None:
            code = process.wait()
            if self._stopping or process is not self.process:
                return
            orphans = self.kill_orphans()
            logger.error("tritonserver pid %d exited with code %s (killed %d orphaned stubs)",
                         process.pid, code, orphans)
            if self.on_exit is not None:
                self.on_exit(process, code)

        threading.Thread(target=wait, name=f"triton-watch-{process.pid}", daemon=True).start()

    def _start_runtime(self) -> None:
        if self.runtime is None or self.runtime.poll() is not None:
            self.runtime = start_runtime(self.config, self.runtime_socket)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            assert self.process is not None  # noqa: S101 - set by start()
            if self.process.poll() is not None:
                code = self.process.returncode
                error = (TritonCrashedAtStartError if -code in CRASH_SIGNALS
                         else TritonStartError)
                raise error(f"tritonserver exited with code {code}: {self._tail()}")
            if self.is_ready():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise TritonStartError(f"tritonserver not ready after "
                                       f"{self.config.start_timeout_s} s: {self._tail()}")
            time.sleep(0.02)

    def _tail(self) -> str:
        return log_tail(self.log_path)

    @property
    def pid(self) -> int | None:
        """Triton's pid while it runs."""
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """Whether the Triton process is running."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGINT (graceful: unloads models), then SIGKILL after the stop timeout.

        Our own connections are closed first: Triton's graceful exit waits for its open HTTP
        connections (up to its exit timeout), and a keep-alive connection of another of the
        agent's threads held every stop for the whole of it.
        """
        self._stopping = True
        self._close_every_client()
        for proc in (self.process, self.runtime):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("pid %d ignored SIGINT for %.0f s; killing it", proc.pid,
                               self.config.stop_timeout_s)
                proc.kill()
                proc.wait()
        self._close_client()

    def kill(self) -> None:
        """SIGKILL Triton and the runtime at once (failure injection, emergency stop)."""
        self._stopping = True
        for proc in (self.process, self.runtime):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self.kill_orphans()
        self._close_client()

    def kill_orphans(self) -> int:
        """SIGKILL Python-backend stubs left behind by a dead Triton; returns how many.

        They would keep clients' connections open (``triton_launch.kill_orphan_stubs``).
        """
        return kill_orphan_stubs(self.config.work_dir / "backends")

    # --- client ----------------------------------------------------------------------------

    def _http(self) -> Any:
        # One client per thread: tritonclient's HTTP client is not safe to share across threads,
        # and the agent runs loads in worker threads.
        def make() -> Any:
            import tritonclient.http as httpclient

            return httpclient.InferenceServerClient(
                self.config.http_url, connection_timeout=5.0, network_timeout=300.0)

        return self._client("client", make)

    def _grpc(self) -> Any:
        """This thread's gRPC client: model control (see the module doc)."""
        def make() -> Any:
            import tritonclient.grpc as grpcclient

            return grpcclient.InferenceServerClient(self.config.grpc_url)

        return self._client("control", make)

    def _client(self, kind: str, make: Callable[[], Any]) -> Any:
        """This thread's client of ``kind``, made on first use.

        A finished thread's client stays under its id and serves a later thread that gets the
        same id: never two threads at once.
        """
        key = (threading.get_ident(), kind)
        with self._clients_lock:
            client = self._clients.get(key)
        if client is None:
            client = make()
            with self._clients_lock:
                self._clients[key] = client
        return client

    def _close_every_client(self) -> None:
        """Close every thread's clients; each thread makes new ones if it calls again."""
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()

    def _close_client(self) -> None:
        """Close this thread's clients."""
        ident = threading.get_ident()
        with self._clients_lock:
            clients = [self._clients.pop(key) for key in [(ident, "client"), (ident, "control")]
                       if key in self._clients]
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()

    def is_ready(self) -> bool:
        """Triton's readiness endpoint (False when it does not answer)."""
        try:
            return bool(self._http().is_server_ready())
        except Exception:  # noqa: BLE001 - any transport error means "not ready"
            self._close_client()
            return False

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        try:
            return function(*args, **kwargs)
        except InferenceServerException as exc:
            if exc.status() in GRPC_NO_ANSWER:  # gRPC's transport errors: Triton is not there
                self._close_client()
                raise TritonUnavailableError(f"{what}: Triton did not answer "
                                             f"({exc.message()})") from exc
            raise ModelLoadError(f"{what}: {exc.message()}") from exc
        except Exception as exc:  # noqa: BLE001 - transport errors are retryable
            self._close_client()
            raise TritonUnavailableError(f"{what}: Triton did not answer ({exc})") from exc

    def _control(self) -> dict[str, str]:
        """Metadata of a model-control call over gRPC (this start's key)."""
        return {GRPC_MODEL_CONTROL_HEADER: self._control_key}

    def load(self, model_name: str) -> float:
        """Load (or reload) a model; returns the wall time of the load call in seconds."""
        started = time.perf_counter()
        self._call(f"load {model_name}", self._grpc().load_model, model_name,
                   headers=self._control(), client_timeout=CONTROL_TIMEOUT_S)
        return time.perf_counter() - started

    def unload(self, model_name: str, wait: bool = True, timeout_s: float = 60.0) -> float:
        """Unload a model; returns seconds until its instance is gone (with ``wait``).

        Triton answers the unload request before the instance is finalised, so with ``wait`` we
        poll until the index no longer shows it READY or UNLOADING and, with the runtime, until
        its worker (and the worker's memory) is gone.
        """
        started = time.perf_counter()
        self._call(f"unload {model_name}", self._grpc().unload_model, model_name,
                   headers=self._control(), client_timeout=CONTROL_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        while wait and self._still_loaded(model_name):
            if time.monotonic() > deadline:
                raise TritonUnavailableError(f"unload {model_name}: still loaded after "
                                             f"{timeout_s} s")
            time.sleep(0.005)
        return time.perf_counter() - started

    def _still_loaded(self, model_name: str) -> bool:
        states = {e["name"]: e.get("state") for e in self.repository_index()}
        if states.get(model_name) in ("READY", "UNLOADING"):
            return True
        return model_name in self.runtime_models()

    def repository_index(self) -> list[dict[str, Any]]:
        """Triton's repository index: name, version, state, reason per model.

        Triton lists the repository directory and then stats each entry, so an entry removed
        in between fails the call: that is retried, twice. Our own removals and reloads move
        a model directory out in one rename, but a listing can still fall just before it.
        """
        for attempt in range(3):
            try:
                index = self._call("repository index", self._grpc().get_model_repository_index,
                                   headers=self._control(), as_json=True,
                                   client_timeout=CONTROL_TIMEOUT_S)
                return list(index.get("models", []))
            except ModelLoadError as exc:
                if "failed to stat" not in str(exc) or attempt == 2:
                    raise
                time.sleep(0.01)
        raise AssertionError("unreachable")  # pragma: no cover

    def ready_models(self) -> set[str]:
        """Names of the models Triton reports READY."""
        return {entry["name"] for entry in self.repository_index()
                if entry.get("state") == "READY"}

    def is_model_ready(self, model_name: str) -> bool:
        """Whether one model is loaded and ready."""
        try:
            return bool(self._http().is_model_ready(model_name))
        except Exception:  # noqa: BLE001
            return False

    def infer(self, model_name: str, images: np.ndarray, input_name: str = "image",
              output_name: str = "logits") -> np.ndarray:
        """Output of ``model_name`` for a batch (float32, batch dimension first).

        A generated model takes N x 3 x H x W images as ``image`` and answers ``logits``.
        """
        import tritonclient.http as httpclient

        images = np.ascontiguousarray(images, dtype=np.float32)
        tensor = httpclient.InferInput(input_name, list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        output = httpclient.InferRequestedOutput(output_name)
        result = self._call(f"infer {model_name}", self._http().infer, model_name, [tensor],
                            outputs=[output])
        return np.asarray(result.as_numpy(output_name))

    def infer_outputs(self, model_name: str, batch: np.ndarray, outputs: list[str],
                      input_name: str = "image") -> dict[str, np.ndarray]:
        """The named outputs of ``model_name`` for a float32 batch.

        For example an early-exit model's ``logits``, ``exit_index`` and ``exec_us``
        (``model_repo.early_exit``).
        """
        import tritonclient.http as httpclient

        batch = np.ascontiguousarray(batch, dtype=np.float32)
        tensor = httpclient.InferInput(input_name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = self._call(f"infer {model_name}", self._http().infer, model_name, [tensor],
                            outputs=[httpclient.InferRequestedOutput(n) for n in outputs])
        return {name: np.asarray(result.as_numpy(name)) for name in outputs}

    def inference_statistics(self, model_name: str) -> dict[str, Any]:
        """Triton's statistics of one model: request counts and durations, batches executed."""
        stats = self._call(f"statistics of {model_name}",
                           self._http().get_inference_statistics, model_name)
        entries = [e for e in stats.get("model_stats", []) if e.get("name") == model_name]
        return dict(entries[0]) if entries else {}

    def model_memory_mb(self, models: list[str] | None = None) -> dict[str, float]:
        """Private resident memory of each (or only the named) loaded model's worker, MB."""
        return {w["model"]: float(w["private_mb"]) for w in self._runtime_workers(models=models)
                if w.get("private_mb") is not None}

    @property
    def device_name(self) -> str:
        """``cpu``, or the name of the GPU the models run on."""
        if self.config.device == "cpu":
            return "cpu"
        return self.config.device_name or self.config.device

    def model_device_memory_mb(self, models: list[str] | None = None) -> dict[str, float]:
        """GPU memory each (or each named) loaded model's worker holds, MB; empty on the CPU."""
        if self.config.device == "cpu":
            return {}
        from agent.gpu import process_memory_mb

        workers = {w["pid"]: w["model"] for w in self._runtime_workers(memory=False)
                   if models is None or w["model"] in models}
        index = int(self.config.device.partition(":")[2] or 0)
        return {workers[pid]: mb for pid, mb in process_memory_mb(workers, index).items()}

    def runtime_models(self) -> set[str]:
        """Models that have a live runtime worker (a listing: nothing is measured)."""
        return {w["model"] for w in self._runtime_workers(memory=False)}

    def _runtime_workers(self, **query: Any) -> list[dict[str, Any]]:
        """The runtime's workers (``runtime_stats``); none without a reachable runtime."""
        if not self.config.use_runtime:
            return []
        from model_repo.runtime import runtime_stats

        try:
            return runtime_stats(self.runtime_socket, **query)
        except OSError:
            return []
