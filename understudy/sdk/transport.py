"""One attempt at one replica, over HTTP or gRPC (tritonclient's asyncio clients).

The only module that calls tritonclient. A transport keeps one client per Triton endpoint and
turns what goes wrong into one of two outcomes: :class:`RetryableError` (no answer, or one
another replica or a later try could fix: the connection failed, Triton says the model is
unknown or not ready, 503) or :class:`InferenceError` (Triton refused the request itself, a
bad input: every replica would refuse it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from understudy.sdk.errors import InferenceError
from understudy.sdk.locations import Location
from understudy.sdk.records import ModelMetadata
from understudy.sdk.tensors import decode_grpc, decode_http, encode, metadata_of

logger = logging.getLogger(__name__)

UNAVAILABLE_MARKERS = ("unknown model", "not ready", "no available version", "not found",
                       "unavailable")
"""Fragments of Triton's errors that mean this replica cannot serve the model now."""
RETRYABLE_HTTP = frozenset({"404", "408", "429", "502", "503", "504"})
RETRYABLE_GRPC = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.CANCELLED",
                            "StatusCode.DEADLINE_EXCEEDED", "StatusCode.UNKNOWN",
                            "StatusCode.NOT_FOUND", "StatusCode.ABORTED",
                            "StatusCode.RESOURCE_EXHAUSTED"})
REQUEST_LIMIT_S = 3600.0
"""aiohttp's whole-request timeout; the request's own deadline (enforced by the exchange)
is what ends an attempt."""
GRPC_MESSAGE_LIMIT = 256 * 1024 * 1024
GRPC_CHANNEL_ARGS = [("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT),
                     ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT),
                     # A server that comes back (a fail-back) is reached within a second, not
                     # after gRPC's default reconnect back-off of up to two minutes.
                     ("grpc.initial_reconnect_backoff_ms", 100),
                     ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000),
                     ("grpc.keepalive_time_ms", 10_000),
                     ("grpc.keepalive_timeout_ms", 5_000)]


class RetryableError(Exception):
    """No answer from this replica, or one that another replica or a later try could fix."""


@dataclass(frozen=True)
class Prepared:
    """A request encoded for one transport (reused by every attempt)."""

    inputs: list[Any]
    outputs: list[Any] | None


class Transport(Protocol):
    """How attempts reach a replica's Triton."""

    protocol: str

    def prepare(self, inputs: Mapping[str, np.ndarray],
                outputs: Sequence[str] | None) -> Prepared: ...

    async def infer(self, location: Location, request: Prepared,
                    timeout_s: float) -> tuple[str, dict[str, np.ndarray]]: ...

    async def metadata(self, location: Location, timeout_s: float) -> ModelMetadata: ...

    async def ready(self, location: Location, timeout_s: float) -> bool: ...

    async def close(self) -> None: ...


def classify(exc: BaseException, where: str) -> Exception:
    """What a failed call means: RetryableError or InferenceError, with the reason."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, InferenceServerException):
        status = exc.status()
        text = f"{where}: {exc.message()}" + (f" ({status})" if status else "")
        message = (exc.message() or "").lower()
        if (status in RETRYABLE_HTTP or status in RETRYABLE_GRPC
                or any(marker in message for marker in UNAVAILABLE_MARKERS)):
            return RetryableError(text)
        return InferenceError(text)
    if isinstance(exc, OSError | TimeoutError | ConnectionError):
        return RetryableError(f"{where}: {type(exc).__name__}: {exc}")
    import aiohttp

    if isinstance(exc, aiohttp.ClientError):
        return RetryableError(f"{where}: {type(exc).__name__}: {exc}")
    return InferenceError(f"{where}: {type(exc).__name__}: {exc}")


class _Pool:
    """One tritonclient per endpoint, made on first use (on the event loop)."""

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}

    async def close(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        for client in clients:
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken client
                logger.debug("closing a Triton client failed: %s", exc)


class HttpTransport(_Pool):
    """KServe v2 over HTTP (``tritonclient.http.aio``), tensors in the binary extension."""

    protocol = "http"

    def __init__(self, conn_limit: int = 100) -> None:
        super().__init__()
        self.conn_limit = conn_limit

    def _client(self, endpoint: str) -> Any:
        client = self.clients.get(endpoint)
        if client is None:
            import tritonclient.http.aio as aiohttpclient

            client = self.clients[endpoint] = aiohttpclient.InferenceServerClient(
                endpoint, conn_limit=self.conn_limit, conn_timeout=REQUEST_LIMIT_S)
        return client

    def prepare(self, inputs: Mapping[str, np.ndarray],
                outputs: Sequence[str] | None) -> Prepared:
        import tritonclient.http as httpclient

        return Prepared(*encode(httpclient, inputs, outputs, binary=True))

    async def infer(self, location: Location, request: Prepared,
                    timeout_s: float) -> tuple[str, dict[str, np.ndarray]]:
        where = f"{location.server_id} ({location.http})"
        try:
            result = await self._client(location.http).infer(
                location.model_name, request.inputs, outputs=request.outputs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            raise classify(exc, where) from None
        return decode_http(result)

    async def metadata(self, location: Location, timeout_s: float) -> ModelMetadata:
        try:
            doc = await self._client(location.http).get_model_metadata(location.model_name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            raise classify(exc, f"{location.server_id} ({location.http})") from None
        return metadata_of(doc, location.server_id, location.variant)

    async def ready(self, location: Location, timeout_s: float) -> bool:
        return bool(await self._client(location.http).is_model_ready(location.model_name))


class GrpcTransport(_Pool):
    """KServe v2 over gRPC (``tritonclient.grpc.aio``), one channel per Triton."""

    protocol = "grpc"

    def _client(self, endpoint: str) -> Any:
        client = self.clients.get(endpoint)
        if client is None:
            import tritonclient.grpc.aio as aiogrpcclient

            client = self.clients[endpoint] = aiogrpcclient.InferenceServerClient(
                endpoint, channel_args=GRPC_CHANNEL_ARGS)
        return client

    def prepare(self, inputs: Mapping[str, np.ndarray],
                outputs: Sequence[str] | None) -> Prepared:
        import tritonclient.grpc as grpcclient

        return Prepared(*encode(grpcclient, inputs, outputs, binary=False))

    def _endpoint(self, location: Location) -> str:
        if not location.grpc:
            raise RetryableError(f"{location.server_id} has no gRPC endpoint")
        return location.grpc

    async def infer(self, location: Location, request: Prepared,
                    timeout_s: float) -> tuple[str, dict[str, np.ndarray]]:
        endpoint = self._endpoint(location)
        try:
            result = await self._client(endpoint).infer(
                location.model_name, request.inputs, outputs=request.outputs,
                client_timeout=max(timeout_s, 0.001))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            raise classify(exc, f"{location.server_id} ({endpoint})") from None
        return decode_grpc(result)

    async def metadata(self, location: Location, timeout_s: float) -> ModelMetadata:
        endpoint = self._endpoint(location)
        try:
            doc = await self._client(endpoint).get_model_metadata(
                location.model_name, as_json=True, client_timeout=max(timeout_s, 0.001))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            raise classify(exc, f"{location.server_id} ({endpoint})") from None
        return metadata_of(doc, location.server_id, location.variant)

    async def ready(self, location: Location, timeout_s: float) -> bool:
        return bool(await self._client(self._endpoint(location)).is_model_ready(
            location.model_name, client_timeout=max(timeout_s, 0.001)))


def make_transport(protocol: str) -> Transport:
    """The transport named ``http`` or ``grpc`` (ValueError for another name)."""
    if protocol == "http":
        return HttpTransport()
    if protocol == "grpc":
        return GrpcTransport()
    raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
