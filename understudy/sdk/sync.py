"""The blocking client: :class:`AsyncClient` on an event loop of its own, for threaded code.

One background thread runs the loop (the event stream, every connection, every attempt), so
an attempt in flight can be cancelled and resent the moment its app moves, whatever the
calling thread is doing. Any number of threads may call :meth:`Client.infer` at once; inputs
are encoded in the calling thread. :meth:`Client.close` ends every call still waiting with
:class:`ClosedError` and returns within about two seconds, controller reachable or not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from understudy.sdk.aio import DEFAULT_TIMEOUT_S, AsyncClient, EventHook, RecordHook
from understudy.sdk.errors import ClosedError
from understudy.sdk.exchange import RouteSource
from understudy.sdk.locations import Location
from understudy.sdk.records import InferResult, ModelMetadata
from understudy.sdk.transport import Transport

logger = logging.getLogger(__name__)

T = TypeVar("T")
CLOSE_WAIT_S = 1.6
"""How long :meth:`Client.close` waits for the loop to close the connections."""


class Client:
    """Blocking client of the apps of one controller (arguments as :class:`AsyncClient`)."""

    def __init__(self, controller_url: str = "", *, protocol: str = "http",
                 token: str | None = None, token_file: str | Path | None = None,
                 ca_file: str | Path | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, on_record: RecordHook | None = None,
                 on_event: EventHook | None = None, routes: RouteSource | None = None,
                 transport: Transport | None = None) -> None:
        self.aio = AsyncClient(controller_url, protocol=protocol, token=token,
                               token_file=token_file, ca_file=ca_file,
                               timeout_s=timeout_s, on_record=on_record, on_event=on_event,
                               routes=routes, transport=transport)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="understudy-sdk",
                                        daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._thread.start()
        self._submit(self.aio.start()).result()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self._loop.run_until_complete(asyncio.wait(tasks, timeout=0.2))
            self._loop.close()

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        with self._lock:
            if self._closed:
                coroutine.close()
                raise ClosedError("the client is closed")
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _wait(self, future: Future[T]) -> T:
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (KeyboardInterrupt): the call ends with it
            raise

    # --- life ----------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """End every call still waiting (ClosedError), stop following, close connections.

        Safe from any thread, idempotent, and bounded (about 2 s at most).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            closing = asyncio.run_coroutine_threadsafe(self.aio.close(), self._loop)
        try:
            closing.result(CLOSE_WAIT_S)
        except (FutureTimeout, Exception) as exc:  # noqa: BLE001 - closing goes on regardless
            logger.info("closing the client's connections did not finish: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(0.3)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # --- calls ---------------------------------------------------------------------------

    @property
    def protocol(self) -> str:
        """``http`` or ``grpc``."""
        return self.aio.protocol

    def location(self, app_id: str) -> Location | None:
        """Where the app is served as far as the client knows (no I/O; None: not known)."""
        return self.aio.location(app_id)

    def resolve(self, app_id: str, timeout_s: float | None = None) -> Location | None:
        """Where the app is served, asking the controller if the client does not know yet."""
        return self._wait(self._submit(self.aio.resolve(app_id, timeout_s)))

    def infer(self, app_id: str, inputs: Mapping[str, np.ndarray],
              outputs: Sequence[str] | None = None, *,
              timeout_s: float | None = None) -> InferResult:
        """As :meth:`AsyncClient.infer`: output arrays by name, or an SdkError with the reason."""
        sent = time.time()
        prepared = self.aio.prepare(app_id, inputs, outputs, sent)
        return self._wait(self._submit(self.aio.infer_prepared(app_id, prepared, sent,
                                                               timeout_s)))

    def metadata(self, app_id: str, timeout_s: float | None = None) -> ModelMetadata:
        """As :meth:`AsyncClient.metadata`."""
        return self._wait(self._submit(self.aio.metadata(app_id, timeout_s)))

    def ready(self, app_id: str, timeout_s: float = 5.0) -> bool:
        """As :meth:`AsyncClient.ready`."""
        return self._wait(self._submit(self.aio.ready(app_id, timeout_s)))
