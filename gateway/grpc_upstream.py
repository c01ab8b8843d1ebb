"""gRPC to the servers' Tritons: one channel per server, messages passed on as bytes.

A call that gets no answer (the server is unreachable, the connection broke) raises
:class:`UpstreamError`, as the HTTP upstream does, so the exchange resends it the same way. An
error Triton answered becomes an :class:`UpstreamReply` with the HTTP status the same error has
on Triton's HTTP endpoint (so "unknown model" is recognised as retryable), the gRPC code kept in
the ``grpc-code`` header and the message in Triton's JSON error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging

import grpc

from gateway.exchange import InferRequest, Send
from gateway.protowire import renamed
from gateway.upstream import UpstreamError, UpstreamReply
from understudy.client import Location

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
MESSAGE_LIMIT = 256 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MESSAGE_LIMIT),
                   ("grpc.max_receive_message_length", MESSAGE_LIMIT),
                   # A server that comes back (a fail-back) is reached within a second, not
                   # after gRPC's default reconnect back-off of up to two minutes.
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
NO_REPLY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                      grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN})
HTTP_STATUS = {grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.INVALID_ARGUMENT: 400,
               grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNIMPLEMENTED: 501,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 429}


class GrpcUpstream:
    """Channels to every Triton the gateway routes gRPC requests to."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    def _call(self, hostport: str, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        call = self._calls.get((hostport, method))
        if call is None:
            channel = self._channels.get(hostport)
            if channel is None:
                channel = self._channels[hostport] = grpc.aio.insecure_channel(
                    hostport, options=CHANNEL_OPTIONS)
            call = self._calls[(hostport, method)] = channel.unary_unary(
                f"/{SERVICE}/{method}")
        return call

    async def call(self, hostport: str, method: str, message: bytes,
                   timeout_s: float) -> UpstreamReply:
        """One unary call; its reply (UpstreamError when none came)."""
        try:
            data = await self._call(hostport, method)(message, timeout=max(timeout_s, 0.001))
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in NO_REPLY:
                raise UpstreamError(f"{hostport}: {code.name}: {exc.details()}") from None
            return UpstreamReply(HTTP_STATUS.get(code, 400), {"grpc-code": code.name},
                                 json.dumps({"error": exc.details() or code.name}).encode())
        return UpstreamReply(200, {}, data)

    def drop(self, hostport: str) -> None:
        """Forget a server's channel (closed in the background)."""
        channel = self._channels.pop(hostport, None)
        for key in [k for k in self._calls if k[0] == hostport]:
            del self._calls[key]
        if channel is not None:
            asyncio.ensure_future(channel.close())

    async def close(self) -> None:
        """Close every channel."""
        for channel in list(self._channels.values()):
            await channel.close()
        self._channels.clear()
        self._calls.clear()


def grpc_sender(upstream: GrpcUpstream) -> Send:
    """The exchange's way to send a gRPC request to one replica's Triton.

    The request's body is the serialized message and its ``suffix`` the method's name; the
    model's name in it becomes the replica's Triton model.
    """

    async def send(route: Location, request: InferRequest) -> UpstreamReply:
        if not route.grpc:
            raise UpstreamError(f"{route.server_id} has no gRPC endpoint")
        remaining = request.deadline - asyncio.get_running_loop().time()
        return await upstream.call(route.grpc, request.suffix,
                                   renamed(request.body, route.model_name), remaining)

    return send
