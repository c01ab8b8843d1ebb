"""Learns routes from the controller: reads an app on first use, then follows the event stream.

An app is read (``GET /v1/apps/{id}``) the first time the client uses it. The event stream
(``/v1/events/ws``, every app's events) is followed from the last sequence number seen
(``?since=``), so a reconnect replays what was missed; reconnects back off from 50 ms to 2 s.
The apps in use are read again when the stream opens with nothing to replay from, and when a
sequence number is skipped (events the stream no longer holds): at most once a second. While
the controller is down the routes stay as they were and requests keep using them; only an app
never read before waits for the controller (until its request's deadline).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from urllib.parse import quote

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from understudy.sdk.board import RouteBoard
from understudy.sdk.errors import ClosedError, UnavailableError, UnknownAppError
from understudy.sdk.routes import AppRoute

logger = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
RELOAD_MIN_INTERVAL_S = 1.0
"""Gaps close together cost one reload, not one each."""
REQUEST_TIMEOUT_S = 5.0
PARALLEL_READS = 8
FRAME_LIMIT = 1 << 24


class ControllerUnavailable(Exception):
    """The controller could not answer (unreachable, or it answered 5xx)."""


def tls_context(ca_file: str | None) -> ssl.SSLContext | None:
    """The TLS context trusting ``ca_file`` (None: the system's defaults)."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


class ControllerRoutes:
    """Keeps a :class:`RouteBoard` current from the controller (see the module doc)."""

    def __init__(self, controller_url: str, board: RouteBoard, token: str | None = None,
                 ca_file: str | None = None,
                 http_transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base = controller_url.rstrip("/")
        self.board = board
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.tls = tls_context(ca_file)
        self.connected = False
        self.reloads = 0
        """Times the apps in use were read again (after a gap or a fresh stream)."""
        self._http: httpx.AsyncClient | None = None
        self._http_transport = http_transport
        """Another way to the controller's REST API (tests)."""
        self._reads: dict[str, asyncio.Task[None]] = {}
        self._reload_due = False
        self._reload_at = -RELOAD_MIN_INTERVAL_S
        self._closed = False

    # --- reading apps ------------------------------------------------------------------------

    async def resolve(self, app_id: str, deadline: float) -> AppRoute:
        """The app's route, read from the controller when not known yet.

        Retried until ``deadline`` (loop time) while the controller cannot answer.
        """
        loop = asyncio.get_running_loop()
        delay = BACKOFF_MIN_S
        last = ""
        while True:
            route = self.board.route(app_id)
            if route is not None:
                return route
            try:
                await self._read_once(app_id)
            except ControllerUnavailable as exc:
                last = str(exc)
            route = self.board.route(app_id)
            if route is not None:
                return route
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise UnavailableError(f"{app_id}: the controller could not say where the app "
                                       f"is served before the deadline ({last})")
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _read_once(self, app_id: str) -> None:
        """Read the app (one read shared by every request that waits for it)."""
        task = self._reads.get(app_id)
        if task is None:
            task = self._reads[app_id] = asyncio.ensure_future(self._read(app_id, first=True))
            task.add_done_callback(lambda _: self._reads.pop(app_id, None))
        await asyncio.shield(task)

    async def _read(self, app_id: str, first: bool = False) -> None:
        self.board.begin_read(app_id)
        try:
            response = await self._client().get(f"/v1/apps/{quote(app_id, safe='')}")
        except (httpx.HTTPError, OSError) as exc:
            self.board.abort_read(app_id)
            raise ControllerUnavailable(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.board.abort_read(app_id)
            raise
        if response.status_code >= 500:
            # The controller cannot answer now (its Redis is down: 503): as if unreachable,
            # the last known route stands.
            self.board.abort_read(app_id)
            raise ControllerUnavailable(f"the controller answered {response.status_code}")
        if response.status_code == 404:
            self.board.end_read(app_id, None)
            if first:
                raise UnknownAppError(f"app {app_id!r} is not registered")
            return
        if response.status_code >= 400:
            self.board.abort_read(app_id)
            raise UnavailableError(f"{app_id}: the controller answered {response.status_code}: "
                                   f"{response.text[:200]}")
        self.board.end_read(app_id, response.json())

    async def reload(self) -> None:
        """Read every app in use again (after a gap, or on a stream with no replay)."""
        self._reload_due = False
        self._reload_at = time.monotonic()
        self.reloads += 1
        slots = asyncio.Semaphore(PARALLEL_READS)

        async def read(app_id: str) -> None:
            async with slots:
                await self._read(app_id)

        apps = list(self.board.table.apps)
        results = await asyncio.gather(*(read(a) for a in apps), return_exceptions=True)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            self._reload_due = True  # tried again at the next chance
            logger.info("reading %d of %d apps again failed: %s", len(failed), len(apps),
                        failed[0])
        else:
            logger.info("routes of %d apps read again at seq %d", len(apps),
                        self.board.table.last_seq)

    def _client(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClosedError("the client is closed")
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.base, headers=self.headers,
                                           timeout=REQUEST_TIMEOUT_S,
                                           verify=self.tls if self.tls is not None else True,
                                           transport=self._http_transport)
        return self._http

    async def close(self) -> None:
        """Close the HTTP client (the stream ends when :meth:`run` is cancelled)."""
        self._closed = True
        for task in list(self._reads.values()):
            task.cancel()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # --- the event stream --------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the stream, reconnecting with back-off, until cancelled."""
        delay = BACKOFF_MIN_S
        while True:
            try:
                await self._follow()
                delay = BACKOFF_MIN_S
            except (OSError, TimeoutError, WebSocketException, httpx.HTTPError, ValueError,
                    ControllerUnavailable) as exc:
                logger.info("controller event stream interrupted (%s); retrying in %.2f s",
                            exc or type(exc).__name__, delay)
            finally:
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _ws_url(self, since: int | None) -> str:
        base = self.base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        return f"{base}/v1/events/ws" + (f"?since={since}" if since is not None else "")

    async def _follow(self) -> None:
        last = self.board.table.last_seq
        since = last if last > 0 else None
        url = self._ws_url(since)
        async with connect(url, additional_headers=self.headers,
                           ssl=self.tls if url.startswith("wss://") else None,
                           open_timeout=REQUEST_TIMEOUT_S, close_timeout=1, ping_interval=5,
                           ping_timeout=5, compression=None, proxy=None,
                           max_size=FRAME_LIMIT) as ws:
            self.connected = True
            logger.info("following the controller's events from seq %s", since)
            if since is None and self.board.table.apps:
                await self.reload()  # nothing to replay from: what was missed is unknown
            await self._read_stream(ws)

    async def _read_stream(self, ws: ClientConnection) -> None:
        while True:
            try:
                async with asyncio.timeout(RELOAD_MIN_INTERVAL_S):
                    raw = await ws.recv()
            except TimeoutError:
                raw = None
            if raw is not None:
                event = json.loads(raw)
                if self.board.table.gap(event):
                    logger.warning("events %d..%d missing from the stream; reading the apps "
                                   "again", self.board.table.last_seq + 1, int(event["seq"]) - 1)
                    self._reload_due = True
                self.board.apply(event)
            if self._reload_due and (time.monotonic() - self._reload_at
                                     >= RELOAD_MIN_INTERVAL_S):
                await self.reload()
