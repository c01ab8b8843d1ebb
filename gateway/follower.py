"""Keeps the routing table current from the controller: a snapshot, then its event stream.

The stream (``/v1/events/ws``, every app) is followed from the table's last sequence number
(``since``), so a reconnect replays what was missed; reconnects back off from 50 ms to 2 s.
The table is (re)loaded from ``GET /v1/apps`` on the first connection (the stream is opened
first, then the snapshot read, so no event falls between them; replayed events older than the
snapshot only pass through states it already left), and when a sequence number is skipped
(events the stream no longer holds, or that reached it out of order): the snapshot is read
after the gap, so it holds what the missing events did. While the controller is down the table
stays as it was and requests keep being routed from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from gateway.board import RouteBoard
from understudy.wire.credentials import bearer, client_ssl_context

logger = logging.getLogger(__name__)

PAGE = 10_000
SNAPSHOT_MIN_INTERVAL_S = 1.0
"""Gaps close together cost one snapshot, not one each."""
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0


class EventFollower:
    """Follows the controller's events into a :class:`RouteBoard` until stopped."""

    def __init__(self, controller_url: str, board: RouteBoard, token: str | None = None,
                 on_connected: Callable[[bool], None] | None = None,
                 on_snapshot: Callable[[], None] | None = None,
                 ca_file: Path | None = None) -> None:
        self.base = controller_url.rstrip("/")
        self.board = board
        self.headers = bearer(token)
        self.tls = client_ssl_context(ca_file)
        """Verifies an https:// controller (used only then)."""
        self.on_connected = on_connected or (lambda _: None)
        self.on_snapshot = on_snapshot or (lambda: None)
        self.connected = False
        self._stop = asyncio.Event()
        self._snapshot_at = -SNAPSHOT_MIN_INTERVAL_S
        self._snapshot_due = False
        self._first = True

    def stop(self) -> None:
        """End :meth:`run` (at its next step; it closes the stream)."""
        self._stop.set()

    async def run(self) -> None:
        """Follow the stream, reconnecting with back-off, until :meth:`stop`."""
        delay = BACKOFF_MIN_S
        async with httpx.AsyncClient(base_url=self.base, headers=self.headers,
                                     timeout=10.0, verify=self.tls) as http:
            while not self._stop.is_set():
                try:
                    await self._follow(http)
                    delay = BACKOFF_MIN_S
                except (OSError, TimeoutError, WebSocketException, httpx.HTTPError,
                        ValueError) as exc:
                    logger.info("controller event stream interrupted (%s); retrying in "
                                "%.2f s", exc or type(exc).__name__, delay)
                finally:
                    self._set_connected(False)
                try:
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                except TimeoutError:
                    pass
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _ws_url(self, since: int | None) -> str:
        base = self.base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        return f"{base}/v1/events/ws" + (f"?since={since}" if since is not None else "")

    async def _follow(self, http: httpx.AsyncClient) -> None:
        last = self.board.table.last_seq
        since = last if last > 0 else None
        url = self._ws_url(since)
        tls: dict[str, Any] = {"ssl": self.tls} if url.startswith("wss://") else {}
        async with connect(url, additional_headers=self.headers, **tls,
                           open_timeout=5, close_timeout=1, ping_interval=5, ping_timeout=5,
                           compression=None, proxy=None, max_size=None) as ws:
            self._set_connected(True)
            logger.info("following the controller's events from seq %s", since)
            if since is None or self._first:
                # Nothing to replay from, or a table from an earlier run (the controller's
                # records may have been reset since): read the records themselves.
                self._first = False
                await self._snapshot(http)
            await self._read(ws, http)

    async def _read(self, ws: ClientConnection, http: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(SNAPSHOT_MIN_INTERVAL_S):
                    raw = await ws.recv()
            except TimeoutError:
                raw = None
            if raw is not None:
                self._apply(json.loads(raw))
            if self._snapshot_due and (time.monotonic() - self._snapshot_at
                                       >= SNAPSHOT_MIN_INTERVAL_S):
                await self._snapshot(http)

    def _apply(self, event: dict[str, Any]) -> None:
        table = self.board.table
        expected = table.last_seq + 1
        seq = int(event["seq"])
        if table.last_seq > 0 and seq > expected:
            logger.warning("events %d..%d missing from the stream; reloading the table",
                           expected, seq - 1)
            self._snapshot_due = True
        if table.get(str(event.get("app_id"))) is None and event.get("kind") != "deleted":
            self._snapshot_due = True  # a new app: its spec (latency objective) is in its view
        self.board.apply(event)

    async def _snapshot(self, http: httpx.AsyncClient) -> None:
        self._snapshot_due = False
        self._snapshot_at = time.monotonic()
        apps = await _list_all(http, "/v1/apps")
        servers = {s["server_id"]: s for s in await _list_all(http, "/v1/servers")}
        changes = self.board.apply_snapshot(apps, servers)
        self.on_snapshot()
        logger.info("routing table loaded from the controller: %d apps, %d changed, seq %d",
                    len(apps), len(changes), self.board.table.last_seq)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self.on_connected(connected)


async def _list_all(http: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    """Every item of a paginated list endpoint (``X-Next-Cursor``)."""
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": PAGE}
    while True:
        response = await http.get(path, params=params)
        response.raise_for_status()
        items.extend(response.json())
        cursor = response.headers.get("X-Next-Cursor")
        if not cursor:
            return items
        params = {"limit": PAGE, "cursor": cursor}
