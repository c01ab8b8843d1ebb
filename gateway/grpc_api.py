"""The KServe v2 / Triton gRPC front end (``inference.GRPCInferenceService``).

``ModelInfer`` goes through the app's queue and the exchange like an HTTP infer; the message is
passed on as bytes with the model's name changed to the replica's Triton model, and the answer's
name changed back to the app (``gateway.protowire``). ``ModelReady``, ``ModelMetadata`` and
``ModelConfig`` are asked of the app's serving replica; ``ServerLive``, ``ServerReady`` and
``ServerMetadata`` are the gateway's own. The replica that answered is named in the trailing
metadata (``understudy-server``, ``understudy-variant``). A request's deadline is its gRPC
deadline (the gateway's default without one). The other methods (repository, statistics,
shared memory, streaming) answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2 as pb

from gateway.dataplane import DataPlane
from gateway.errors import BadRequestError, GatewayError
from gateway.exchange import Answer, InferRequest
from gateway.grpc_upstream import MESSAGE_LIMIT, SERVICE
from gateway.protowire import WireError, name_and_version, renamed

logger = logging.getLogger(__name__)

Method = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]
MODEL_CALLS = ("ModelReady", "ModelMetadata", "ModelConfig")


class GrpcFrontEnd:
    """The gRPC methods of the gateway, over the data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler serving the service (messages as bytes)."""
        methods: dict[str, Method] = {
            "ModelInfer": self.infer, "ServerLive": self.server_live,
            "ServerReady": self.server_ready, "ServerMetadata": self.server_metadata}
        for name in MODEL_CALLS:
            methods[name] = self._model_call(name)
        return grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(method)
            for name, method in methods.items()})

    # --- requests ------------------------------------------------------------------------

    def _deadline(self, context: grpc.aio.ServicerContext) -> float:
        remaining: float | None = context.time_remaining()
        loop_now = asyncio.get_running_loop().time()
        if remaining is None:
            return loop_now + self.plane.config.default_deadline_s
        return loop_now + min(remaining, self.plane.config.max_deadline_s)

    def _target(self, message: bytes) -> tuple[str, str]:
        try:
            app_id, version = name_and_version(message)
        except WireError as exc:
            raise BadRequestError(f"malformed request: {exc}") from None
        self.plane.check_app(app_id)
        self.plane.check_version(version)
        return app_id, version

    async def infer(self, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            app_id, _ = self._target(message)
            answer = await self.plane.infer(InferRequest(
                app_id, self._deadline(context), message, suffix="ModelInfer",
                protocol="grpc"))
        except GatewayError as exc:
            await _abort(context, exc)
        return await self._answer(answer, context, app_id, rename=True)

    def _model_call(self, method: str) -> Method:
        async def call(message: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                app_id, _ = self._target(message)
                answer = await self.plane.model_call(app_id, method, protocol="grpc",
                                                     message=message)
            except GatewayError as exc:
                await _abort(context, exc)
            if method == "ModelConfig" and answer.reply.status == 200:
                config = pb.ModelConfigResponse.FromString(answer.reply.body)
                config.config.name = app_id
                answer.reply.body = config.SerializeToString()
            return await self._answer(answer, context, app_id, rename=method == "ModelMetadata")

        return call

    @staticmethod
    async def _answer(answer: Answer, context: grpc.aio.ServicerContext, app_id: str,
                      rename: bool) -> bytes:
        reply = answer.reply
        metadata = [("understudy-server", answer.route.server_id),
                    ("understudy-variant", answer.route.variant)]
        if answer.source != "model":
            # Not the model's own prediction (a reconstruction, the default response, the
            # approximate backup's); a rebuilt answer also says so in its parameters.
            metadata.append(("understudy-answer", answer.source))
            if answer.group_id:
                metadata.append(("understudy-coding-group", answer.group_id))
        context.set_trailing_metadata(tuple(metadata))
        if reply.status != 200:  # Triton's own error, passed on with its code
            code = getattr(grpc.StatusCode, reply.headers.get("grpc-code", ""),
                           grpc.StatusCode.INVALID_ARGUMENT)
            try:
                details = str(json.loads(reply.body).get("error", ""))
            except (ValueError, AttributeError):
                details = reply.body.decode("utf-8", "replace")
            await context.abort(code, details)
        return renamed(reply.body, app_id) if rename else bytes(reply.body)

    # --- the gateway itself --------------------------------------------------------------

    async def server_live(self, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ServerLiveResponse(live=True).SerializeToString())

    async def server_ready(self, message: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ServerReadyResponse(ready=self.plane.ready()).SerializeToString())

    async def server_metadata(self, message: bytes,
                              context: grpc.aio.ServicerContext) -> bytes:
        return bytes(pb.ServerMetadataResponse(
            name="understudy-gateway", version="1",
            extensions=["classification", "parameters"]).SerializeToString())


async def _abort(context: grpc.aio.ServicerContext, exc: GatewayError) -> None:
    await context.abort(getattr(grpc.StatusCode, exc.grpc_code), exc.message)


def grpc_server(front_end: GrpcFrontEnd) -> grpc.aio.Server:
    """A gRPC server carrying the gateway's service (not started)."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", MESSAGE_LIMIT),
                                      ("grpc.max_receive_message_length", MESSAGE_LIMIT),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((front_end.handler(),))
    return server
