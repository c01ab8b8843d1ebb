"""Client SDK: find an app's serving endpoint, follow its events, infer without losing requests.

``UnderstudyClient(controller_url, app_id)`` resolves where the app is served (``GET
/v1/apps/{id}``), then follows the app's event stream on a websocket in a background thread
(reconnecting with ``?since=<last seq>`` so no event is missed). :meth:`infer` sends the request
with tritonclient to the current endpoint; if that fails (the server died, the model moved) it
waits for the next placement event (or re-resolves after a short wait) and retries, until the
request succeeds or its deadline passes: a failover delays requests, it does not drop them.
Every request is recorded with the variant and server that answered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

logger = logging.getLogger(__name__)

RESOLVE_RETRY_S = 0.2


class ClientError(RuntimeError):
    """The app is unknown, or a request could not be served before its deadline."""


@dataclass(frozen=True)
class Location:
    """Where the app is served: Triton endpoint, model name, and what that model is."""

    http: str
    grpc: str
    model_name: str
    server_id: str
    variant: str
    accuracy: float
    seq: int = 0


NOWHERE_KINDS = frozenset({"unrecoverable", "deleted", "unplaced"})
"""Event kinds after which the app is served nowhere."""


def location_of_serving(serving: Mapping[str, Any] | None, seq: int = 0) -> Location | None:
    """The location in an app view's ``serving`` (``GET /v1/apps/{id}``); None without one."""
    if not serving or not serving.get("endpoint"):
        return None
    endpoint = serving["endpoint"]
    return Location(http=endpoint["http"], grpc=endpoint.get("grpc", ""),
                    model_name=serving["model_name"], server_id=serving["server_id"],
                    variant=serving["variant"], accuracy=serving["accuracy"], seq=seq)


def location_of_event(event: Mapping[str, Any]) -> tuple[bool, Location | None]:
    """What a placement event says of where its app is served: ``(moves, location)``.

    ``moves`` is False when the event leaves the serving location as it was (a warm backup
    became ready, or an event without an endpoint); otherwise ``location`` is the new one, None
    when the app is served nowhere (unrecoverable, unplaced, deleted).
    """
    kind = event.get("kind")
    if kind in NOWHERE_KINDS:
        return True, None
    endpoint = event.get("endpoint")
    if not endpoint or kind == "backup_ready":
        return False, None
    return True, location_of_replica(event)


def location_of_replica(event: Mapping[str, Any]) -> Location:
    """The replica an event with an endpoint names (the serving one, or a ready backup)."""
    endpoint = event["endpoint"]
    return Location(http=endpoint["http"], grpc=endpoint.get("grpc", ""),
                    model_name=event["model_name"], server_id=event["server_id"],
                    variant=event["variant"], accuracy=event.get("accuracy") or 0.0,
                    seq=event["seq"])


@dataclass
class RequestRecord:
    """One inference request as the client experienced it."""

    sent_at: float
    done_at: float
    ok: bool
    attempts: int
    server_id: str | None = None
    variant: str | None = None
    accuracy: float | None = None
    error: str = ""

    @property
    def latency_s(self) -> float:
        """End to end, retries included."""
        return self.done_at - self.sent_at


@dataclass
class InferResult:
    """Logits and who produced them."""

    logits: np.ndarray
    record: RequestRecord


@dataclass
class _State:
    location: Location | None = None
    last_seq: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)
    events: list[dict[str, Any]] = field(default_factory=list)


class UnderstudyClient:
    """Inference client of one app (thread-safe: many threads may call :meth:`infer`)."""

    def __init__(self, controller_url: str, app_id: str, token: str | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.controller_url = controller_url.rstrip("/")
        self.app_id = app_id
        self.token = token
        self.on_event = on_event
        self.records: list[RequestRecord] = []
        self._state = _State()
        self._stop = threading.Event()
        self._clients: dict[str, Any] = {}
        self._local = threading.local()
        self._records_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- location ------------------------------------------------------------------------

    def start(self) -> UnderstudyClient:
        """Resolve the app and start following its events."""
        self.resolve()
        self._thread = threading.Thread(target=self._follow, name=f"events-{self.app_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> UnderstudyClient:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def location(self) -> Location | None:
        """The current serving location (None while the app has none)."""
        return self._state.location

    def resolve(self) -> Location | None:
        """Ask the controller where the app is served now."""
        try:
            response = httpx.get(f"{self.controller_url}/v1/apps/{self.app_id}", timeout=5.0)
        except httpx.HTTPError as exc:
            logger.info("controller unreachable while resolving %s: %s", self.app_id, exc)
            return self._state.location
        if response.status_code == 404:
            raise ClientError(f"app {self.app_id!r} is not registered")
        if response.status_code >= 500:
            # The controller cannot answer now (its Redis is down: 503): as if unreachable,
            # the last known location stands and requests go on retrying.
            logger.info("controller answered %d while resolving %s", response.status_code,
                        self.app_id)
            return self._state.location
        response.raise_for_status()
        location = location_of_serving(response.json().get("serving"), self._state.last_seq)
        self._set(location, None)
        return location

    def _set(self, location: Location | None, seq: int | None) -> None:
        with self._state.changed:
            if seq is not None:
                self._state.last_seq = max(self._state.last_seq, seq)
            self._state.location = location
            self._state.changed.notify_all()

    def _follow(self) -> None:
        from websockets.exceptions import WebSocketException
        from websockets.sync.client import connect

        base = self.controller_url.replace("http://", "ws://").replace("https://", "wss://")
        delay = 0.05
        while not self._stop.is_set():
            url = f"{base}/v1/events/ws?app_id={self.app_id}&since={self._state.last_seq}"
            try:
                with connect(url, open_timeout=5, close_timeout=1, compression=None,
                             proxy=None) as ws:
                    delay = 0.05
                    while not self._stop.is_set():
                        try:
                            raw = ws.recv(timeout=0.5)
                        except TimeoutError:
                            continue
                        self._on_event(json.loads(raw))
            except (OSError, WebSocketException) as exc:
                logger.debug("event stream of %s interrupted: %s", self.app_id, exc)
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)

    def _on_event(self, event: dict[str, Any]) -> None:
        self._state.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        moves, location = location_of_event(event)
        self._set(location if moves else self._state.location, event["seq"])

    def wait_for_change(self, since: Location | None, timeout_s: float) -> Location | None:
        """Block until the location differs from ``since`` (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._state.changed:
            while self._state.location == since:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._state.changed.wait(remaining)
            return self._state.location

    # --- inference -------------------------------------------------------------------------

    def _triton(self, endpoint: str) -> Any:
        import tritonclient.http as httpclient

        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(endpoint)
        if client is None:
            client = clients[endpoint] = httpclient.InferenceServerClient(
                endpoint, connection_timeout=1.0, network_timeout=10.0)
        return client

    def _drop_triton(self, endpoint: str) -> None:
        clients = getattr(self._local, "clients", {})
        client = clients.pop(endpoint, None)
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken client
                logger.debug("closing client of %s failed", endpoint)

    def infer(self, images: np.ndarray, timeout_s: float = 60.0) -> InferResult:
        """Logits for ``images``; retried across failovers until ``timeout_s``."""
        import tritonclient.http as httpclient

        images = np.ascontiguousarray(images, dtype=np.float32)
        sent = time.time()
        deadline = time.monotonic() + timeout_s
        attempts = 0
        last_error = "no serving location"
        while time.monotonic() < deadline:
            location = self._state.location
            if location is None:
                self.wait_for_change(None, min(RESOLVE_RETRY_S, deadline - time.monotonic()))
                if self._state.location is None:
                    self.resolve()
                continue
            attempts += 1
            try:
                tensor = httpclient.InferInput("image", list(images.shape), "FP32")
                tensor.set_data_from_numpy(images)
                result = self._triton(location.http).infer(location.model_name, [tensor])
                logits = result.as_numpy("logits")
            except Exception as exc:  # noqa: BLE001 - any failure: wait for a move, retry
                last_error = f"{type(exc).__name__}: {exc}"
                self._drop_triton(location.http)
                moved = self.wait_for_change(location, min(RESOLVE_RETRY_S,
                                                           max(0.0, deadline - time.monotonic())))
                if moved == location:
                    self.resolve()
                continue
            record = RequestRecord(sent, time.time(), True, attempts, location.server_id,
                                   location.variant, location.accuracy)
            self._record(record)
            return InferResult(np.asarray(logits), record)
        record = RequestRecord(sent, time.time(), False, attempts, error=last_error)
        self._record(record)
        raise ClientError(f"{self.app_id}: not served within {timeout_s} s ({last_error})")

    def _record(self, record: RequestRecord) -> None:
        with self._records_lock:
            self.records.append(record)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Events received so far."""
        return list(self._state.events)

    def close(self) -> None:
        """Stop following events."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
