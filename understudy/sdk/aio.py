"""The asyncio client: inference, model metadata and readiness of any app, across failovers.

``AsyncClient(controller_url, protocol="grpc")`` learns where each app it is asked about is
served from the controller (``follower``), sends each call to the app's serving replica over
HTTP or gRPC (``transport``), and resends it across failovers (``exchange``). Every inference
is stamped in a :class:`RequestRecord` (sent, answered, by which server and variant), handed
to ``on_record`` and attached to the result or to the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from understudy.sdk.board import RouteBoard
from understudy.sdk.errors import (
    ClosedError,
    InferenceError,
    SdkError,
    UnavailableError,
    UnknownAppError,
)
from understudy.sdk.exchange import Exchange, RouteSource
from understudy.sdk.follower import ControllerRoutes
from understudy.sdk.locations import Location
from understudy.sdk.records import InferResult, ModelMetadata, RequestRecord
from understudy.sdk.transport import Prepared, Transport, make_transport
from understudy.wire.credentials import ca_file_of, load_token

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
CLOSE_STEP_S = 0.5
"""Each step of :meth:`AsyncClient.close` gets at most this long (the whole stays under 2 s)."""

T = TypeVar("T")
RecordHook = Callable[[RequestRecord], None]
EventHook = Callable[[dict[str, Any]], None]


class AsyncClient:
    """Client of the apps of one controller (one event stream, one connection per Triton).

    Args:
        controller_url: the controller, ``http://host:port`` (``https://`` with ``ca_file``).
        protocol: ``http`` or ``grpc``: how requests reach the Tritons.
        token: the client credential the controller asks for; when None, ``token_file``, else
            the file ``$UNDERSTUDY_TOKEN_FILE`` names, else ``$UNDERSTUDY_TOKEN``
            (docs/security.md). A file readable by others is refused (CredentialFileError).
        token_file: a file holding the credential (first line).
        ca_file: a CA bundle to trust for the controller's TLS certificate (when None,
            ``$UNDERSTUDY_CA_FILE``, else the system's CAs).
        timeout_s: how long a call may wait across failovers when it names no timeout.
        on_record: called with the record of every inference (on the event loop).
        on_event: called with every controller event about an app in use (on the event loop).
        routes: where routes come from instead of the controller (tests, fixed setups).
    """

    def __init__(self, controller_url: str = "", *, protocol: str = "http",
                 token: str | None = None, token_file: str | Path | None = None,
                 ca_file: str | Path | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, on_record: RecordHook | None = None,
                 on_event: EventHook | None = None, routes: RouteSource | None = None,
                 transport: Transport | None = None) -> None:
        if routes is None and not controller_url:
            raise ValueError("a controller_url (or a route source) is needed")
        if token is None:
            token = load_token(Path(token_file) if token_file is not None else None)
        trusted = ca_file_of(Path(ca_file) if ca_file is not None else None)
        self.transport = transport or make_transport(protocol)
        self.protocol = self.transport.protocol
        self.timeout_s = timeout_s
        self.on_record = on_record
        self.routes: RouteSource = routes or ControllerRoutes(
            controller_url, RouteBoard(on_event), token=token,
            ca_file=str(trusted) if trusted is not None else None)
        self._follower: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._closed = False

    # --- life ----------------------------------------------------------------------------

    async def start(self) -> AsyncClient:
        """Start following the controller (the first call starts it too)."""
        self._started()
        return self

    def _started(self) -> asyncio.Future[None]:
        if self._closed:
            raise ClosedError("the client is closed")
        if self._closing is None:
            loop = asyncio.get_running_loop()
            self._closing = loop.create_future()
            run = getattr(self.routes, "run", None)
            if run is not None:
                self._follower = loop.create_task(run(), name="understudy-sdk-events")
        return self._closing

    async def __aenter__(self) -> AsyncClient:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End every call still waiting (ClosedError), stop following, close connections.

        Bounded: returns within about 1.5 s even while the controller or a Triton hangs.
        """
        if self._closed:
            return
        self._closed = True
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)
        await asyncio.sleep(0)  # let the waiting calls end before their connections close
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(self._follower, CLOSE_STEP_S)
        for closing in (self.transport.close, getattr(self.routes, "close", None)):
            if closing is not None:
                with contextlib.suppress(TimeoutError, Exception):
                    await asyncio.wait_for(closing(), CLOSE_STEP_S)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # --- calls ---------------------------------------------------------------------------

    def location(self, app_id: str) -> Location | None:
        """Where the app is served as far as the client knows (no I/O; None: not known)."""
        route = self.routes.board.route(app_id)
        return route.serving if route is not None else None

    async def resolve(self, app_id: str, timeout_s: float | None = None) -> Location | None:
        """Where the app is served, asking the controller if the client does not know yet."""
        closing = self._started()
        deadline = asyncio.get_running_loop().time() + (timeout_s or self.timeout_s)
        route = await _unless_closed(self.routes.resolve(app_id, deadline), closing, app_id)
        return route.serving

    async def infer(self, app_id: str, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str] | None = None, *,
                    timeout_s: float | None = None) -> InferResult:
        """Run the app's model on ``inputs`` (arrays by input name); outputs by name.

        ``outputs`` names the outputs wanted (default: all the model has). Waits across
        failovers until ``timeout_s``; raises an :class:`SdkError` naming the reason when no
        replica answered.
        """
        sent = time.time()
        return await self.infer_prepared(app_id, self.prepare(app_id, inputs, outputs, sent),
                                         sent, timeout_s)

    def prepare(self, app_id: str, inputs: Mapping[str, np.ndarray],
                outputs: Sequence[str] | None, sent: float) -> Prepared:
        """Encode a request for the transport (from any thread).

        A bad input raises the :class:`InferenceError` of a request sent at ``sent``, recorded.
        """
        try:
            return self.transport.prepare(inputs, outputs)
        except SdkError as exc:
            raise self._failed(app_id, sent, exc, None) from None
        except (TypeError, ValueError) as exc:
            raise self._failed(app_id, sent, InferenceError(
                f"{app_id}: the inputs cannot be sent: {exc}"), None) from None

    async def infer_prepared(self, app_id: str, prepared: Prepared, sent: float,
                             timeout_s: float | None = None) -> InferResult:
        """:meth:`infer` of a request already encoded (``transport.prepare``) at ``sent``."""
        transport = self.transport

        async def attempt(location: Location, remaining: float) -> tuple[str, dict[str, Any]]:
            return await transport.infer(location, prepared, remaining)

        exchange: Exchange[tuple[str, dict[str, Any]]] | None = None
        try:
            closing = self._started()
            deadline = asyncio.get_running_loop().time() + (timeout_s or self.timeout_s)
            exchange = Exchange(self.routes, attempt, app_id, deadline, closing)
            (model, tensors), where = await exchange.run()
        except SdkError as exc:
            raise self._failed(app_id, sent, exc, exchange) from None
        record = RequestRecord(sent, time.time(), True, exchange.attempts, where.server_id,
                               where.variant, where.accuracy, app_id=app_id,
                               resends=exchange.resends, moved=exchange.moved,
                               protocol=self.protocol)
        self._record(record)
        return InferResult(tensors, record, model)

    def _failed(self, app_id: str, sent: float, exc: SdkError,
                exchange: Exchange[Any] | None) -> SdkError:
        record = RequestRecord(sent, time.time(), False, exchange.attempts if exchange else 0,
                               error=str(exc), app_id=app_id,
                               resends=exchange.resends if exchange else 0,
                               moved=exchange.moved if exchange else 0,
                               protocol=self.protocol, reason=exc.reason)
        exc.record = record
        self._record(record)
        return exc

    def _record(self, record: RequestRecord) -> None:
        if self.on_record is not None:
            try:
                self.on_record(record)
            except Exception:  # a caller's hook must not lose the answer
                logger.exception("on_record hook failed")

    async def metadata(self, app_id: str, timeout_s: float | None = None) -> ModelMetadata:
        """The metadata of the model serving the app: its inputs' and outputs' names and types.

        Asked of the app's serving replica, and waited for across failovers.
        """
        transport = self.transport

        async def attempt(location: Location, remaining: float) -> ModelMetadata:
            return await transport.metadata(location, remaining)

        closing = self._started()
        deadline = asyncio.get_running_loop().time() + (timeout_s or self.timeout_s)
        answer, _ = await Exchange(self.routes, attempt, app_id, deadline, closing).run()
        return answer

    async def ready(self, app_id: str, timeout_s: float = 5.0) -> bool:
        """Whether the app's serving replica says its model is ready now.

        One try, no wait for a failover; False for an app the controller does not know.
        """
        transport = self.transport

        async def attempt(location: Location, remaining: float) -> bool:
            try:
                return await transport.ready(location, remaining)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: not ready
                logger.debug("readiness of %s at %s: %s", app_id, location.server_id, exc)
                return False

        closing = self._started()
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            route = await _unless_closed(self.routes.resolve(app_id, deadline), closing, app_id)
        except (UnknownAppError, UnavailableError):
            return False
        if route.serving is None:
            return False
        task = asyncio.ensure_future(attempt(route.serving, timeout_s))
        try:
            waits: list[asyncio.Future[Any]] = [task, closing]
            done, _ = await asyncio.wait(waits, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task in done:
            return task.result()
        if closing.done():
            raise ClosedError(f"{app_id}: the client was closed")
        return False


async def _unless_closed(call: Awaitable[T], closing: asyncio.Future[None], app_id: str) -> T:
    """``call``'s result; ClosedError if the client closes first (the call is cancelled)."""
    task = asyncio.ensure_future(call)
    waits: list[asyncio.Future[Any]] = [task, closing]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ClosedError(f"{app_id}: the client was closed")
