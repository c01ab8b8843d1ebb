"""Model control goes over gRPC with the gRPC key; gRPC's transport errors are retryable."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from agent.triton import TritonServer
from agent.triton_access import GRPC_MODEL_CONTROL_HEADER
from agent.triton_config import ModelLoadError, TritonConfig, TritonUnavailableError


class FakeGrpc:
    def __init__(self, error: InferenceServerException | None = None) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.error = error
        self.closed = False

    def _record(self, name: str, arg: Any, kwargs: dict[str, Any]) -> None:
        self.calls.append((name, arg, kwargs))
        if self.error is not None:
            raise self.error

    def load_model(self, name: str, **kwargs: Any) -> None:
        self._record("load", name, kwargs)

    def unload_model(self, name: str, **kwargs: Any) -> None:
        self._record("unload", name, kwargs)

    def get_model_repository_index(self, **kwargs: Any) -> dict[str, Any]:
        self._record("index", None, kwargs)
        return {"models": [{"name": "a__v", "state": "READY"}]} if kwargs.get("as_json") else {}

    def close(self) -> None:
        self.closed = True


def server(tmp_path: Path, client: FakeGrpc) -> TritonServer:
    config = TritonConfig(model_repository=tmp_path / "r", work_dir=tmp_path / "w",
                          http_port=1, grpc_port=2, metrics_port=3, use_runtime=False,
                          model_backend="python")
    triton = TritonServer.__new__(TritonServer)
    triton.config = config
    triton._control_key = "key"
    triton._clients = {(threading.get_ident(), "control"): client}
    triton._clients_lock = threading.Lock()
    return triton


def test_loads_unloads_and_the_index_go_over_grpc_with_the_key(tmp_path: Path) -> None:
    client = FakeGrpc()
    triton = server(tmp_path, client)
    triton.load("a__v")
    triton.unload("a__v", wait=False)
    assert triton.repository_index() == [{"name": "a__v", "state": "READY"}]
    assert [(name, arg) for name, arg, _ in client.calls] == [("load", "a__v"),
                                                               ("unload", "a__v"),
                                                               ("index", None)]
    assert all(kwargs["headers"] == {GRPC_MODEL_CONTROL_HEADER: "key"}
               for _, _, kwargs in client.calls)


def test_no_answer_is_retryable_and_a_refusal_is_final(tmp_path: Path) -> None:
    down = FakeGrpc(InferenceServerException("connection refused",
                                             status="StatusCode.UNAVAILABLE"))
    with pytest.raises(TritonUnavailableError):
        server(tmp_path, down).load("a__v")
    assert down.closed  # a fresh client next time
    refused = FakeGrpc(InferenceServerException("failed to load 'a__v'",
                                                status="StatusCode.INTERNAL"))
    with pytest.raises(ModelLoadError, match="failed to load"):
        server(tmp_path, refused).load("a__v")


def test_a_stop_closes_every_threads_client_and_each_thread_makes_a_new_one(
        tmp_path: Path) -> None:
    # Triton's graceful exit waits for open connections: a stop must close those of every
    # thread of the agent, not only the stopping one's.
    first = FakeGrpc()
    triton = server(tmp_path, first)
    other = FakeGrpc()

    def on_another_thread() -> None:
        assert triton._client("control", lambda: other) is other

    thread = threading.Thread(target=on_another_thread)
    thread.start()
    thread.join()
    assert triton._grpc() is first  # this thread's own, unchanged
    triton._close_every_client()
    assert first.closed and other.closed
    # This thread's closed client is not used again: the next call makes a new one.
    assert triton._grpc() is not first
