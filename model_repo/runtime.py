"""A per-server torch runtime: framework loaded once, one forked worker per loaded model.

Why it exists: Triton's Python backend starts a fresh stub process for every model instance, and
``import torch`` there costs 1.2-1.9 s on this machine, the same for a 5 MB and a 900 MB model.
That fixed cost would flatten the load-time-versus-size effect the failover policy depends on
(FailLite Fig. 2b). Triton's native framework backends (libtorch, TensorRT) load their framework
once per server process; this runtime gives the Python backend the same property. It is started
next to ``tritonserver`` by the agent, imports torch once, and forks a worker per model: the
worker (already holding torch) reads the weight file, builds the network, runs one warm-up
inference and then serves that model's batches over its own Unix-socket connection. The
worker lives exactly as long as that connection, i.e. as long as the Triton model instance.

Wire format (the only one, both directions): ``!II`` header length and payload length, a JSON
header, then raw payload bytes (a C-contiguous float32 array for tensors; an answer's extra
outputs, ``model_repo.early_exit``, follow the model's output, N 4-byte values each). No pickle.

Without a runtime (``UNDERSTUDY_RUNTIME_SOCKET`` unset) the model falls back to
:class:`InProcessRunner`, which imports torch inside the Triton stub: slower to load, same results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_repo.early_exit import NUMPY_TYPES, extra_output_type
from model_repo.huge_pages import collapse_heap
from model_repo.loaders import (
    LoadedModel,
    LoadReport,
    LoadSpec,
    load_model,
    load_spec,
    preload_frameworks,
)
from model_repo.network import NetworkSpec, initial_state
from model_repo.runtime_spares import DEFAULT_SPARES, SparePool
from model_repo.worker_priority import (
    STARTING_BOOST_S,
    ServingPace,
    apply_niceness,
    loading_niceness,
    serving_niceness,
    set_threads_niceness,
    starting_boost_s,
)
from understudy.wire.lifetime import die_with_parent, orphaned

logger = logging.getLogger(__name__)

RUNTIME_SOCKET_ENV = "UNDERSTUDY_RUNTIME_SOCKET"
"""Environment variable naming the runtime's Unix socket, read by the generated model.py."""
_FRAME = struct.Struct("!II")
MAX_HEADER_BYTES = 1 << 20
class RuntimeError_(RuntimeError):
    """The runtime refused a request or a worker failed (message from the worker)."""


# --- framing ---------------------------------------------------------------------------------


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    """Send one frame: JSON header plus optional raw payload."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(_FRAME.pack(len(encoded), len(payload)) + encoded + payload)


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:], size - received)
        if count == 0:
            raise EOFError("connection closed")
        received += count
    return buffer


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    """Receive one frame; raises EOFError when the peer closed the connection.

    The payload is a writable buffer, so arrays built on it can be handed to torch and Triton
    without a copy and without read-only warnings.
    """
    header_len, payload_len = _FRAME.unpack(_recv_exact(sock, _FRAME.size))
    if header_len > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {header_len} bytes is too large")
    header = json.loads(_recv_exact(sock, header_len))
    payload = _recv_exact(sock, payload_len) if payload_len else bytearray()
    return header, payload


def _array_header(array: np.ndarray) -> dict[str, Any]:
    return {"shape": list(array.shape), "dtype": "float32"}


def _array_from(header: dict[str, Any], payload: bytearray) -> np.ndarray:
    return np.frombuffer(payload, dtype=np.float32).reshape(header["shape"])


def _outputs_from(header: dict[str, Any], payload: bytearray,
                  extras: list[tuple[str, str]]) -> list[np.ndarray]:
    """An answer's arrays: the model's output (``shape``), then each extra (N x 1, 4 bytes)."""
    shape = header["shape"]
    primary_bytes = int(np.prod(shape)) * 4
    arrays: list[np.ndarray] = [
        np.frombuffer(payload, dtype=np.float32, count=primary_bytes // 4).reshape(shape)]
    rows = shape[0]
    for index, (_, data_type) in enumerate(extras[:int(header.get("extras", 0))]):
        arrays.append(np.frombuffer(payload, dtype=NUMPY_TYPES[data_type], count=rows,
                                    offset=primary_bytes + 4 * rows * index).reshape(rows, 1))
    return arrays


def extras_field(names: tuple[str, ...]) -> str:
    """The spawn reply's ``extras``: ``name:TYPE`` per extra output, comma-separated."""
    return ",".join(f"{name}:{extra_output_type(name)}" for name in names)


def parse_extras(text: str) -> list[tuple[str, str]]:
    """The extra outputs a spawn reply announces: (name, Triton data type) pairs."""
    return [(name, kind) for name, _, kind in
            (item.partition(":") for item in text.split(",") if item)]


# --- the model side (inside the Triton stub) -------------------------------------------------


class RuntimeClient:
    """Runs one model in a runtime worker; used by the generated model.py."""

    def __init__(self, socket_path: str, model_name: str, weights: Path | None = None,
                 spec: NetworkSpec | None = None, threads: int = 1,
                 config: dict[str, Any] | None = None, model_dir: Path | None = None) -> None:
        """Spawn the worker of a generated network or of any model.

        A generated network is given by ``weights`` and ``spec``; any other model by its
        Triton ``config`` (as JSON) and ``model_dir``, as the native backend asks.
        """
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(socket_path)
        request: dict[str, Any] = {"op": "spawn", "model": model_name}
        if config is not None:
            request.update(config=config, model_dir=str(model_dir or "."))
        elif weights is not None and spec is not None:
            request.update(weights=str(weights), spec=spec.to_dict(), threads=threads)
        else:
            raise ValueError("a spawn needs weights and spec, or the model's config")
        send_frame(self._sock, request)
        header, _ = recv_frame(self._sock)
        if not header.get("ok"):
            self._sock.close()
            raise RuntimeError_(header.get("error", "worker failed to load the model"))
        self.report = LoadReport(**header["report"])
        self.extras = parse_extras(str(header.get("extras", "")))
        """The extra outputs the worker answers after the model's output: (name, type)."""

    def infer(self, images: np.ndarray) -> np.ndarray:
        """Logits for a batch of images (float32, N x 3 x H x W)."""
        return self.infer_outputs(images)[0]

    def infer_outputs(self, images: np.ndarray) -> list[np.ndarray]:
        """The model's output, then each extra output (N x 1), for a batch."""
        images = np.ascontiguousarray(images, dtype=np.float32)
        send_frame(self._sock, {"op": "infer", **_array_header(images)}, images.tobytes())
        header, payload = recv_frame(self._sock)
        if not header.get("ok"):
            raise RuntimeError_(header.get("error", "inference failed"))
        return _outputs_from(header, payload, self.extras)

    def close(self) -> None:
        """Release the worker (it exits when the connection closes)."""
        with contextlib.suppress(OSError):
            self._sock.close()


class InProcessRunner:
    """Runs the model inside the calling process (imports its framework there)."""

    def __init__(self, weights: Path | None = None, spec: NetworkSpec | None = None,
                 threads: int = 1, load: LoadSpec | None = None) -> None:
        if load is None:
            if weights is None or spec is None:
                raise ValueError("an in-process runner needs weights and spec, or a LoadSpec")
            load = synthetic_load(weights, spec, threads)
        self._model: LoadedModel | None
        self._model, self.report = load_model(load)
        self.extras = [(name, extra_output_type(name)) for name in load.extra_outputs]

    def infer(self, images: np.ndarray) -> np.ndarray:
        """The output for a batch (float32, batch dimension first)."""
        return self.infer_outputs(images)[0]

    def infer_outputs(self, images: np.ndarray) -> list[np.ndarray]:
        """The model's output, then each extra output (N x 1), for a batch."""
        if self._model is None:
            raise RuntimeError_("the model was closed")
        return self._model.infer_outputs(images)

    def close(self) -> None:
        """Drop the model."""
        self._model = None


def synthetic_load(weights: Path, spec: NetworkSpec, threads: int = 1) -> LoadSpec:
    """The load of a generated network."""
    return LoadSpec(weights=Path(weights), spec=spec, threads=threads,
                    input_dims=(3, spec.image_side, spec.image_side))


def private_memory_mb(pid: int) -> float:
    """Private (not shared with the runtime parent) resident memory of a process, MB."""
    total_kb = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total_kb += int(line.split()[1])
    except OSError:
        return 0.0
    return total_kb / 1024.0


# --- the runtime process -----------------------------------------------------------------------


@dataclass
class _Worker:
    model: str
    pid: int
    started: float = field(default_factory=time.time)


def spawn_arguments(request: dict[str, Any]) -> LoadSpec:
    """What a spawn request asks to load (``model_repo.loaders``).

    Two forms: a generated network's ``weights``, ``spec`` and ``threads``; or, as the native
    backend (``model_repo/native``) and the Python model send it, the model's whole Triton
    ``config`` (JSON, its ``parameters`` as the config.pbtxt gives them) and ``model_dir``,
    which a relative ``weights`` parameter is relative to.
    """
    if "config" not in request:
        return synthetic_load(Path(request["weights"]), NetworkSpec.from_dict(request["spec"]),
                              int(request.get("threads", 1)))
    parameters = {key: value["string_value"]
                  for key, value in request["config"].get("parameters", {}).items()}
    return load_spec(parameters, Path(request.get("model_dir", ".")))


def _prepare_for_forks() -> None:
    """Run one tiny load in this process, then freeze the heap, so forked workers start warm.

    A worker's first ``torch.load``, module build and forward pay one-time costs (lazy
    imports, dispatcher and kernel caches); paid once here, every fork inherits them. Then
    ``gc.freeze`` moves every object to the permanent generation: a worker's garbage
    collections no longer write to the inherited objects' headers, which would copy each
    touched page (copy on write) into the worker's private memory. Last, the heap goes into
    huge pages (``model_repo.huge_pages``): cheaper forks, and cheaper worker exits.
    """
    import gc
    import tempfile

    import torch

    # One thread, as every worker starts: no OpenMP pool exists when the runtime forks (a
    # pool's threads do not survive a fork).
    torch.set_num_threads(1)
    spec = NetworkSpec(width=8, hidden_layers=1, num_classes=4, image_side=16, seed=1)
    with tempfile.TemporaryDirectory(prefix="understudy-runtime-") as scratch:
        weights = Path(scratch) / "warmup.pt"
        torch.save(initial_state(spec), weights)
        load_model(synthetic_load(weights, spec, threads=1))
        logger.info("runtime preloaded %s", ", ".join(preload_frameworks(Path(scratch))))
    gc.collect()
    gc.freeze()
    report = collapse_heap()
    if report is not None:
        logger.info("runtime heap: %d of %d regions in huge pages (%.0f MB) in %.0f ms",
                    report.collapsed, report.regions, report.huge_mb, report.seconds * 1000)


def _serve_worker(conn: socket.socket, request: dict[str, Any]) -> None:
    """Body of a forked worker: load, report, then answer inference frames until EOF."""
    base_nice = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, loading_niceness(request, base_nice))
    try:
        load = spawn_arguments(request)
        model, report = load_model(load)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported to the model
        send_frame(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    # The output's name: the native backend answers each request with a tensor of that name,
    # then with each extra output (``model_repo.early_exit``) the reply announces.
    send_frame(conn, {"ok": True, "report": report.__dict__, "output": load.output_name,
                      "extras": extras_field(load.extra_outputs)})
    set_threads_niceness(serving_niceness(base_nice))
    try:
        boost_s = starting_boost_s(os.environ)
    except ValueError as exc:
        logger.warning("%s; the default %.1f s applies", exc, STARTING_BOOST_S)
        boost_s = STARTING_BOOST_S
    pace = ServingPace(base_nice, boost_s)
    while True:
        if pace.boosted_until is not None:
            # Boosted: wait for the next request no longer than the boost lasts.
            ready, _, _ = select.select([conn], [], [], max(0.0, pace.boosted_until -
                                                               time.monotonic()))
            if not ready:
                apply_niceness(pace.idle(time.monotonic()))
                continue
        try:
            header, payload = recv_frame(conn)
        except (EOFError, OSError):
            return
        apply_niceness(pace.request(time.monotonic()))
        try:
            outputs = model.infer_outputs(_array_from(header, payload))
        except Exception as exc:  # noqa: BLE001 - a bad batch must not kill the worker
            send_frame(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        finally:
            pace.answered(time.monotonic())
        # The model's output, then each extra output's N values (4 bytes each), in order.
        send_frame(conn, {"ok": True, **_array_header(outputs[0]), "extras": len(outputs) - 1},
                   b"".join(array.tobytes() for array in outputs))


class RuntimeServer:
    """Accepts spawn requests on a Unix socket and forks one worker per model."""

    def __init__(self, socket_path: Path, spares: int = DEFAULT_SPARES) -> None:
        self.socket_path = socket_path
        self.workers: dict[int, _Worker] = {}
        self._binding = socket_path.with_name(socket_path.name + ".starting")
        for stale in (socket_path, self._binding):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self._binding))
        self._listener.listen(64)
        self._stopping = False
        self.spares = SparePool(spares, serve=_serve_worker, send_frame=send_frame,
                                recv_frame=recv_frame, close_in_child=self._listener.close)

    def serve_forever(self) -> None:
        """Accept and fork until SIGTERM/SIGINT."""
        import torch  # noqa: F401 - the whole point: import once, before any fork

        _prepare_for_forks()
        self.spares.refill()

        # The socket appears under its real name only now, so "socket exists" means "ready".
        os.replace(self._binding, self.socket_path)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        logger.info("torch runtime ready on %s (pid %d)", self.socket_path, os.getpid())
        while not self._stopping:
            refill_in = self.spares.refill_in()
            for _key, _ in selector.select(timeout=0.5 if refill_in is None else refill_in):
                conn, _ = self._listener.accept()
                self._handle(conn)
            self._reap()
            if self.spares.refill_in() == 0.0:
                self.spares.refill()
        self._shutdown()

    def _handle(self, conn: socket.socket) -> None:
        try:
            request, _ = recv_frame(conn)
        except (EOFError, OSError, ValueError):
            conn.close()
            return
        if request.get("op") == "stats":
            self._reap()
            # Reading a worker's smaps_rollup costs ~3 ms (torch maps hundreds of regions) in
            # this single-threaded loop, where it delays spawns: only the workers asked for
            # are measured, and a listing without memory measures none.
            measure = request.get("memory", True)
            only = request.get("models")
            send_frame(conn, {"ok": True, "workers": [
                {"model": w.model, "pid": pid,
                 "private_mb": (private_memory_mb(pid) if measure and
                                (only is None or w.model in only) else None)}
                for pid, w in self.workers.items()]})
            conn.close()
            return
        if request.get("op") != "spawn":
            send_frame(conn, {"ok": False, "error": f"unknown op {request.get('op')!r}"})
            conn.close()
            return
        pid = self.spares.hand_over(conn, request)
        if pid is None:  # no spare left (a burst larger than the pool): fork one now
            pid = self.spares.fork_worker(conn, request)
        conn.close()
        self.workers[pid] = _Worker(model=str(request.get("model")), pid=pid)

    def _reap(self) -> None:
        for pid in list(self.workers) + self.spares.pids:
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done == 0:
                    continue
            if not self.spares.forget(pid):
                self.workers.pop(pid, None)

    def _stop(self, *_: object) -> None:
        self._stopping = True

    def _shutdown(self) -> None:
        spares = self.spares.pids
        self.spares.close()
        for pid in spares:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


def runtime_stats(socket_path: str | Path, timeout_s: float = 5.0, memory: bool = True,
                  models: list[str] | None = None) -> list[dict[str, Any]]:
    """The runtime's live workers: model name, pid and private memory (MB).

    ``memory=False`` lists them without measuring (``private_mb`` None); ``models`` measures
    only those models' workers (the others are listed with ``private_mb`` None).
    """
    request: dict[str, Any] = {"op": "stats", "memory": memory}
    if models is not None:
        request["models"] = list(models)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        send_frame(sock, request)
        header, _ = recv_frame(sock)
    return list(header.get("workers", []))


def main(argv: list[str] | None = None) -> int:
    """``python -m model_repo.runtime --socket PATH``."""
    parser = argparse.ArgumentParser(prog="python -m model_repo.runtime")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--spares", type=int, default=DEFAULT_SPARES,
                        help="idle forked workers kept ready for model loads "
                             f"(default {DEFAULT_SPARES}; 0 forks on each load)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit if this process is not our parent at start-up")
    options = parser.parse_args(argv)
    die_with_parent()  # no runtime outlives its agent
    if options.parent_pid is not None and orphaned(options.parent_pid):
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s", stream=sys.stderr)
    RuntimeServer(options.socket, spares=max(0, options.spares)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
