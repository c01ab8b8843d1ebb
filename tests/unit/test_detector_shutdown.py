"""A controller that is stopping declares no server failed.

Its HTTP server closes every agent's connection on a stop signal, before the application's
shutdown; each closed connection was declared a failure, and the next controller resumed those
failovers. The signal now reaches the controller first (``understudy.cli.controller.serve``),
and the detector declares nothing from then on. The monitor process is not started here.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest
import uvicorn

from controller.detector import FailureDetector
from understudy.cli.controller import serve


def detector() -> tuple[FailureDetector, list[tuple[str, str]]]:
    declared: list[tuple[str, str]] = []
    found = FailureDetector(0.02, 2, lambda server, reason, *_: declared.append((server,
                                                                                  reason)))
    found.port = 9  # as if the monitor had bound it (the channel needs one)
    return found, declared


def test_a_closed_connection_is_declared_while_running_and_not_while_stopping() -> None:
    async def body() -> None:
        found, declared = detector()
        for server in ("s1", "s2", "s3"):
            found.admit(server, None)
            found.watch(server)
        found.connection_closed("s1")
        assert declared == [("s1", "connection closed")]
        found.shutting_down()
        found.connection_closed("s2")
        found.declare("s3", "triton down")
        assert declared == [("s1", "connection closed")]
    asyncio.run(body())


def test_no_hello_after_the_stop_began_is_not_declared() -> None:
    async def body() -> None:
        found, declared = detector()
        found.watch("s1", grace_s=0.01)
        found.shutting_down()
        await asyncio.sleep(0.05)
        assert declared == []
    asyncio.run(body())


def test_the_stop_signal_reaches_the_controller_before_uvicorn_acts_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def run(self: uvicorn.Server, sockets: Any = None) -> None:
        seen.append(("before", self.should_exit))
        self.handle_exit(signal.SIGTERM, None)
        seen.append(("after", self.should_exit))

    monkeypatch.setattr(uvicorn.Server, "run", run)
    serve(object(), lambda: seen.append("controller told"), host="127.0.0.1", port=0)
    assert seen == [("before", False), "controller told", ("after", True)]
