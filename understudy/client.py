"""The first SDK's interface, kept for the code that uses it: one app, images in, logits out.

``UnderstudyClient(controller_url, app_id)`` is a thin layer over :class:`understudy.sdk.Client`
(which see, and docs/sdk.md): it sends ``images`` as the ``image`` input and returns the
``logits`` output, keeping every request's record in :attr:`UnderstudyClient.records`. New code
should use ``understudy.sdk`` directly: any tensors, HTTP or gRPC, sync or asyncio.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from understudy.sdk import Client, ClientError, Location, RequestRecord, UnavailableError
from understudy.sdk.locations import (
    NOWHERE_KINDS,
    location_of_event,
    location_of_replica,
    location_of_serving,
)
from understudy.wire.credentials import ca_file_of, load_token

__all__ = ["NOWHERE_KINDS", "ClientError", "InferResult", "Location", "RequestRecord",
           "UnderstudyClient", "location_of_event", "location_of_replica",
           "location_of_serving"]

logger = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 5.0


@dataclass
class InferResult:
    """Logits and who produced them."""

    logits: np.ndarray
    record: RequestRecord


class UnderstudyClient:
    """Inference client of one app (thread-safe: many threads may call :meth:`infer`)."""

    def __init__(self, controller_url: str, app_id: str, token: str | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None, *,
                 token_file: Path | None = None, ca_file: Path | None = None) -> None:
        """A client of ``app_id`` at ``controller_url``.

        The client credential: ``token``, else ``token_file``, else ``$UNDERSTUDY_TOKEN_FILE``
        or ``$UNDERSTUDY_TOKEN`` (docs/security.md). ``ca_file`` (else ``$UNDERSTUDY_CA_FILE``)
        verifies an ``https://`` controller.
        """
        self.controller_url = controller_url.rstrip("/")
        self.app_id = app_id
        self.token = token if token is not None else load_token(token_file)
        ca = ca_file_of(ca_file)
        self.ca_file = str(ca) if ca is not None else None
        self.on_event = on_event
        self.records: list[RequestRecord] = []
        self._events: list[dict[str, Any]] = []
        self._client: Client | None = None

    def start(self) -> UnderstudyClient:
        """Resolve the app (ClientError when unknown) and start following its events."""
        if self._client is None:
            self._client = Client(self.controller_url, token=self.token, ca_file=self.ca_file,
                                  on_record=self.records.append, on_event=self._on_event)
        try:
            self.resolve()
        except ClientError:
            self.close()
            raise
        return self

    def __enter__(self) -> UnderstudyClient:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def _on_event(self, event: dict[str, Any]) -> None:
        self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _started(self) -> Client:
        if self._client is None:
            self.start()
        assert self._client is not None  # noqa: S101 - set by start()
        return self._client

    @property
    def location(self) -> Location | None:
        """The current serving location (None while the app has none)."""
        return self._client.location(self.app_id) if self._client is not None else None

    def resolve(self) -> Location | None:
        """Where the app is served (the last known location while the controller is away)."""
        try:
            return self._started().resolve(self.app_id, RESOLVE_TIMEOUT_S)
        except UnavailableError as exc:
            logger.info("controller unreachable while resolving %s: %s", self.app_id, exc)
            return self.location

    def infer(self, images: np.ndarray, timeout_s: float = 60.0) -> InferResult:
        """Logits for ``images``; resent across failovers until ``timeout_s``."""
        images = np.ascontiguousarray(images, dtype=np.float32)
        result = self._started().infer(self.app_id, {"image": images}, ["logits"],
                                       timeout_s=timeout_s)
        return InferResult(result.outputs["logits"], result.record)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Events about the app received so far."""
        return list(self._events)

    def close(self) -> None:
        """Stop following events; calls still waiting end with ClientError."""
        if self._client is not None:
            self._client.close()
