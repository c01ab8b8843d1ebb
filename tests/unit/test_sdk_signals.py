"""run_until_signal: the work's result when it ends alone; on SIGTERM the work is told to stop,
the clients are closed, and the previous handlers come back (signals sent to this process)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

from understudy.sdk import run_until_signal, run_until_signal_async


class Closing:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_the_work_ends_alone_and_its_result_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    client = Closing()
    assert run_until_signal(lambda stop: 42, [client]) == 42
    assert client.closed.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_stops_the_work_and_closes_the_clients() -> None:
    before = signal.getsignal(signal.SIGTERM)
    client = Closing()
    seen: list[bool] = []

    def work(stop: threading.Event) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        client.closed.wait(10)  # a call blocked until the client closes
        seen.append(stop.is_set())
        return "stopped"

    assert run_until_signal(work, [client]) == "stopped"
    assert seen == [True] and client.closed.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_asyncio_form_cancels_the_main_coroutine_at_the_signal() -> None:
    closed: list[bool] = []

    class AsyncClosing:
        async def close(self) -> None:
            closed.append(True)

    async def main() -> str:
        asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.Event().wait()
        return "never"

    async def scenario() -> str | None:
        return await run_until_signal_async(main(), [AsyncClosing()])

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) is None
    assert closed == [True]
