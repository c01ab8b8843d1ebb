"""A ``tritonserver`` that crashes as it starts is started again; one that exits is not.

Rarely, a real ``tritonserver`` aborts while it starts (its gRPC event engine: ``epoll_wait
error: Bad file descriptor``, SIGABRT). :meth:`TritonServer.start` launches it again, a few
times, when it dies of a crash signal of its own before it is ready, and raises at once when
it exits with a code (a bad configuration, a port in use). The binary here is a wrapper around
the real one that counts its launches and crashes or exits the first times as told.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.triton import START_ATTEMPTS, TritonServer
from agent.triton_config import (
    TritonConfig,
    TritonCrashedAtStartError,
    TritonInstall,
    TritonStartError,
)
from understudy.wire.ports import free_ports

pytestmark = pytest.mark.timeout(180)


def _server(root: Path, *, fail_first: int, how: str) -> tuple[TritonServer, Path]:
    """A Triton whose first ``fail_first`` launches crash (``how="abort"``) or exit 1."""
    real = TritonInstall.locate()
    launches = root / "launches"
    wrapper = root / "tritonserver"
    failure = "kill -ABRT $$" if how == "abort" else "echo 'bad configuration'; exit 1"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo launch >> "{launches}"\n'
        f'if [ "$(wc -l < "{launches}")" -le {fail_first} ]; then {failure}; fi\n'
        f'exec "{real.binary}" "$@"\n')
    wrapper.chmod(0o755)
    ports = free_ports(3)
    server = TritonServer(TritonConfig(
        model_repository=root / "repository", work_dir=root / "triton", http_port=ports[0],
        grpc_port=ports[1], metrics_port=ports[2], use_runtime=False, model_backend="python",
        start_timeout_s=60.0), install=dataclasses.replace(real, binary=wrapper))
    return server, launches


def _launches(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_triton_that_aborts_as_it_starts_is_started_again_and_serves(tmp_path: Path) -> None:
    server, launches = _server(tmp_path, fail_first=1, how="abort")
    try:
        server.start()
        assert _launches(launches) == 2
        assert server.alive() and server.is_ready()
        assert server.repository_index() == []  # the agent's key reached the second launch
    finally:
        server.stop()
    assert not server.alive()


def test_a_triton_that_keeps_crashing_fails_after_the_attempts(tmp_path: Path) -> None:
    server, launches = _server(tmp_path, fail_first=START_ATTEMPTS, how="abort")
    with pytest.raises(TritonCrashedAtStartError, match="code -6"):
        server.start()
    assert _launches(launches) == START_ATTEMPTS
    assert not server.alive()


def test_a_triton_that_exits_with_a_code_is_not_started_again(tmp_path: Path) -> None:
    server, launches = _server(tmp_path, fail_first=1, how="exit")
    with pytest.raises(TritonStartError, match="bad configuration") as raised:
        server.start()
    assert not isinstance(raised.value, TritonCrashedAtStartError)
    assert _launches(launches) == 1
    assert not server.alive()
