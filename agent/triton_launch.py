"""How a ``tritonserver`` and its torch runtime are launched, and what a dead one leaves behind.

The process side of :mod:`agent.triton`'s wrapper that needs no Triton client: the backend
directory Triton is pointed at, the environment its Python stubs inherit, the per-server torch
runtime's process, the tail of a log for an error message, and the Python-backend stubs a dead
Triton leaves orphaned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

from agent.processes import child_setup
from agent.triton_config import TritonConfig, TritonInstall, TritonStartError
from model_repo.native_backend import NATIVE_BACKEND

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_LOG = "torch-runtime.log"


def relink(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target``, replacing whatever was there."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def python_paths() -> list[str]:
    """Directories the Triton stub must add to reach our packages and their dependencies."""
    paths = [str(REPO_ROOT)]
    paths += [p for p in site.getsitepackages() if Path(p).is_dir()]
    return list(dict.fromkeys(paths))


def link_backends(root: Path, install: TritonInstall, native_library: Path | None) -> Path:
    """Make ``root`` a backend directory: the Python backend (and its stub), and the native one.

    The native backend is linked in only when ``native_library`` is given (this server's
    models use it).
    """
    sources = list((install.backends / "python").iterdir()) + [install.python_stub]
    for source in sources:
        if source.name != "__pycache__":
            # A link, not a copy: the stub finds its bundled libraries relative to itself.
            relink(root / "python" / source.name, source)
    if native_library is not None:
        relink(root / NATIVE_BACKEND / native_library.name, native_library)
    return root


def triton_environment(install: TritonInstall, runtime_socket: Path | None) -> dict[str, str]:
    """Environment of ``tritonserver`` (inherited by the Python stubs)."""
    env = dict(os.environ)
    lib_dirs = [str(install.libs), str(Path(sys.base_prefix) / "lib")]
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    env["UNDERSTUDY_PYTHONPATH"] = os.pathsep.join(python_paths())
    # Each stub imports NumPy; OpenBLAS would start a thread per core in every one of them
    # (and the stub does no linear algebra: inference runs in the torch runtime).
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.pop("UNDERSTUDY_RUNTIME_SOCKET", None)
    if runtime_socket is not None:
        env["UNDERSTUDY_RUNTIME_SOCKET"] = str(runtime_socket)
    return env


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` of a log on one line, for an error message."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(line for line in text[-lines:] if "Timeout" not in line)


def start_runtime(config: TritonConfig, socket: Path) -> subprocess.Popen[bytes]:
    """Launch the torch runtime and wait until it listens on ``socket``.

    Raises TritonStartError (with its log's tail) when it exits first, or does not listen
    within the start timeout (then it is killed: the next start begins afresh).
    """
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
    log_path = config.work_dir / RUNTIME_LOG
    log = log_path.open("ab")
    try:
        runtime = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "model_repo.runtime", "--socket", str(socket),
             # One idle forked worker per load thread: loads started together never wait
             # for a fork (model_repo/runtime_spares.py).
             "--spares", str(config.model_load_threads)],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(python_paths())},
            preexec_fn=child_setup(config.nice))
    finally:
        log.close()
    deadline = time.monotonic() + config.start_timeout_s
    while not socket.exists():
        if runtime.poll() is not None:
            raise TritonStartError(f"torch runtime exited with code {runtime.returncode}: "
                                   f"{log_tail(log_path)}")
        if time.monotonic() > deadline:
            runtime.kill()
            runtime.wait()
            raise TritonStartError(f"torch runtime not listening after "
                                   f"{config.start_timeout_s:g} s: "
                                   f"{log_tail(log_path) or '(nothing logged)'}")
        time.sleep(0.01)
    return runtime


def kill_orphan_stubs(backend_root: Path) -> int:
    """SIGKILL the Python-backend stubs run from ``backend_root``; returns how many.

    A stub inherits Triton's listening sockets, so an orphaned stub keeps client connections
    open without ever answering them: clients would hang instead of failing over. A server's
    stubs are recognised by its backend directory in their command line.
    """
    marker = str(backend_root / "python").encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"triton_python_backend_stub" in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed
