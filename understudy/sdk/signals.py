"""A clean stop on SIGTERM or SIGINT for programs built on the SDK.

:func:`run_until_signal` runs the program's work in a thread and, at the signal, tells it to
stop and closes its clients, so a call blocked on a failover or on an unreachable controller
ends at once (:class:`ClosedError`) instead of at its deadline. The main thread only polls, and
the handler only sets an event: no lock is taken inside the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.05
GRACE_S = 1.2
"""How long the work may take to return once told to stop; the process goes on without it
after that (its threads are daemons), so that a stop always completes within 2 s."""


class Closable(Protocol):
    def close(self) -> None: ...


class AsyncClosable(Protocol):
    async def close(self) -> None: ...


def run_until_signal(work: Callable[[threading.Event], T], clients: Iterable[Closable] = (),
                     signals: Iterable[int] = STOP_SIGNALS, grace_s: float = GRACE_S
                     ) -> T | None:
    """Run ``work(stop)`` until it returns or a signal comes (call from the main thread).

    At the signal, ``stop`` is set and ``clients`` are closed (their waiting calls end with
    ClosedError); ``work`` then has ``grace_s`` to return. Returns what ``work`` returned,
    None when it had not returned in time; an exception of ``work`` is raised again.
    """
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["value"] = work(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = exc

    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in signals}
    thread = threading.Thread(target=body, name="work", daemon=True)
    try:
        thread.start()
        while thread.is_alive() and not stop.is_set():
            thread.join(POLL_S)
        stop.set()
        for client in clients:
            try:
                client.close()
            except Exception:  # one client's failure must not keep the others open
                logger.exception("closing a client failed")
        thread.join(grace_s)
        if thread.is_alive():
            logger.warning("stopping: the work did not return within %.1f s", grace_s)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


async def run_until_signal_async(main: Awaitable[T], clients: Iterable[AsyncClosable] = (),
                                 signals: Iterable[int] = STOP_SIGNALS) -> T | None:
    """Await ``main`` until it returns or a signal comes; then close ``clients``.

    At the signal ``main`` is cancelled and None returned (the event loop's signal handling;
    call from the main thread's loop).
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main)
    signalled = asyncio.Event()
    numbers = list(signals)

    def on_signal() -> None:
        signalled.set()
        task.cancel()

    for number in numbers:
        loop.add_signal_handler(number, on_signal)
    try:
        return await task
    except asyncio.CancelledError:
        if signalled.is_set():
            return None
        raise
    finally:
        for number in numbers:
            loop.remove_signal_handler(number)
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
