"""The native Triton backend ``understudy`` (``model_repo/native``): built on demand, cached.

A Python-backend load starts a stub process that boots an interpreter and imports NumPy before
any of our code runs: 65 of the 85 ms of CPU of a small interim's load on the test machine
(``bench/load_cpu.py``), and the part that makes concurrent interim loads on one server queue
behind each other. The native backend is a small C++ library that forwards a model
instance to the per-server torch runtime over its socket, as the Python model does, with no
process of its own: a load costs the runtime worker's read, build and warm-up only.

It is compiled from source with the system C++ compiler the first time a Triton needs it and
cached by the hash of its sources and flags (``$XDG_CACHE_HOME/understudy/native``, or
``UNDERSTUDY_NATIVE_CACHE``): no Triton headers or libraries are needed at build time, because
the Triton API it calls is declared in ``native/triton_abi.h`` and bound when Triton opens it.
Where no compiler is found (or ``UNDERSTUDY_MODEL_BACKEND=python``), models use the Python
backend, with the same results and slower loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

NATIVE_BACKEND = "understudy"
"""The backend name in a config.pbtxt; Triton opens ``<dir>/understudy/libtriton_understudy.so``."""
PYTHON_BACKEND = "python"
BackendChoice = Literal["auto", "python", "understudy"]
BACKEND_ENV = "UNDERSTUDY_MODEL_BACKEND"
"""Forces a backend (``python`` or ``understudy``) where a Triton is configured with ``auto``."""
CACHE_ENV = "UNDERSTUDY_NATIVE_CACHE"

SOURCE_DIR = Path(__file__).resolve().parent / "native"
SOURCES = ("understudy_backend.cc", "triton_abi.h")
LIBRARY_NAME = f"libtriton_{NATIVE_BACKEND}.so"
COMPILE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
                 "-Wextra", "-Werror")


class NativeBackendError(RuntimeError):
    """The native backend could not be built (no compiler, or the compile failed)."""


def cache_dir() -> Path:
    """Where built libraries are kept (one sub-directory per source hash)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "understudy" / "native"


def compiler() -> str | None:
    """The C++ compiler to use: ``$CXX``, else ``g++`` or ``c++`` on PATH."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def source_hash(cxx: str) -> str:
    """Identifies a build: the sources, the flags and the compiler's name."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    digest.update(" ".join((cxx, *COMPILE_FLAGS)).encode())
    return digest.hexdigest()[:16]


def build_library(directory: Path | None = None) -> Path:
    """The built library, compiled now unless a build of the same sources is cached.

    Concurrent callers (several agents starting at once) wait on one lock and compile once.
    Raises ``NativeBackendError`` when there is no compiler or the compile fails.
    """
    cxx = compiler()
    if cxx is None:
        raise NativeBackendError("no C++ compiler found (install g++ or set CXX)")
    target_dir = (directory or cache_dir()) / source_hash(cxx)
    library = target_dir / LIBRARY_NAME
    if library.is_file():
        return library
    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.is_file():  # built by whoever held the lock before us
            return library
        handle, partial = tempfile.mkstemp(prefix=".build.", suffix=".so", dir=target_dir)
        os.close(handle)
        command = [cxx, *COMPILE_FLAGS, "-o", partial, str(SOURCE_DIR / SOURCES[0])]
        try:
            result = subprocess.run(command, capture_output=True, text=True,  # noqa: S603
                                    timeout=300, check=False)
            if result.returncode != 0:
                raise NativeBackendError(f"compiling the native backend failed:\n"
                                         f"{result.stderr.strip()}")
            os.replace(partial, library)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
    logger.info("built the native Triton backend %s", library)
    return library


def resolve_backend(choice: BackendChoice, use_runtime: bool) -> tuple[str, Path | None]:
    """The backend models should use, and the library to install for it.

    ``auto`` takes ``$UNDERSTUDY_MODEL_BACKEND`` if set, else the native backend when the torch
    runtime runs (it serves through it) and a build succeeds, else the Python backend. An
    explicit ``understudy`` that cannot be had raises ``NativeBackendError``.
    """
    if choice == "auto":
        forced = os.environ.get(BACKEND_ENV, "").strip()
        if forced not in ("", PYTHON_BACKEND, NATIVE_BACKEND):
            raise NativeBackendError(f"{BACKEND_ENV} must be {PYTHON_BACKEND!r} or "
                                     f"{NATIVE_BACKEND!r}, not {forced!r}")
        if forced:
            choice = forced  # type: ignore[assignment]
    if choice == PYTHON_BACKEND:
        return PYTHON_BACKEND, None
    if not use_runtime:
        if choice == NATIVE_BACKEND:
            raise NativeBackendError("the native backend serves through the torch runtime, "
                                     "which is off (use_runtime=False)")
        return PYTHON_BACKEND, None
    try:
        return NATIVE_BACKEND, build_library()
    except NativeBackendError as exc:
        if choice == NATIVE_BACKEND:
            raise
        logger.warning("using Triton's Python backend: %s", exc)
        return PYTHON_BACKEND, None
