"""The KServe v2 / Triton HTTP front end (aiohttp): decode, call the data plane, encode.

Routes: ``POST /v2/models/{app_id}[/versions/{v}]/infer``, ``GET /v2/models/{app_id}[/versions/
{v}]`` (metadata), ``.../ready``, ``.../config``, ``GET /v2/health/live|ready``, ``GET /v2``,
``GET /metrics``. An infer body goes to Triton as it came (JSON, or the binary tensor extension
with its ``Inference-Header-Content-Length``); the reply comes back as Triton wrote it, with
``model_name`` saying the app and the ``Understudy-Server`` / ``Understudy-Variant`` headers
naming the replica that answered. Errors are Triton-shaped: ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from gateway.dataplane import DataPlane, rename_infer_reply, rename_metadata
from gateway.errors import BadRequestError, BodyTooLargeError, GatewayError
from gateway.exchange import Answer, InferRequest, Send
from gateway.upstream import HttpUpstream, UpstreamReply
from understudy.client import Location

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "Understudy-Timeout-Ms"
"""A request's deadline, in milliseconds from its arrival (default: the gateway's)."""
SERVER_HEADER = "Understudy-Server"
VARIANT_HEADER = "Understudy-Variant"
ATTEMPTS_HEADER = "Understudy-Attempts"
HEADER_LENGTH = "Inference-Header-Content-Length"
FORWARDED = ("Content-Type", HEADER_LENGTH, "Content-Encoding")
"""Request headers Triton needs to read the body; the others stay at the gateway."""
SERVER_METADATA = {"name": "understudy-gateway", "version": "1",
                   "extensions": ["classification", "binary_tensor_data", "parameters"]}


def http_sender(upstream: HttpUpstream) -> Send:
    """The exchange's way to send a request to one replica's Triton over HTTP."""

    async def send(route: Location, request: InferRequest) -> UpstreamReply:
        version = f"/versions/{request.version}" if request.version else ""
        path = f"/v2/models/{route.model_name}{version}{request.suffix}"
        return await upstream.request(route.http.removeprefix("http://"), request.method,
                                      path, request.headers, request.body)

    return send


def error_response(exc: GatewayError) -> web.Response:
    """Triton's error shape, with the error's status."""
    return web.json_response({"error": exc.message}, status=exc.status)


class HttpFrontEnd:
    """The aiohttp application of the gateway."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.max_body = plane.config.max_body_bytes

    def app(self) -> web.Application:
        """The routes (one aiohttp application)."""
        app = web.Application(client_max_size=self.max_body)
        models = "/v2/models/{app_id}"
        versions = "/v2/models/{app_id}/versions/{version}"
        app.router.add_post(models + "/infer", self.infer)
        app.router.add_post(versions + "/infer", self.infer)
        for prefix in (models, versions):
            app.router.add_get(prefix, self.metadata)
            app.router.add_get(prefix + "/ready", self.model_ready)
            app.router.add_get(prefix + "/config", self.config)
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    # --- inference -----------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.StreamResponse:
        app_id = request.match_info["app_id"]
        plane = self.plane
        try:
            plane.check_app(app_id)
            version = plane.check_version(request.match_info.get("version", ""))
            deadline = plane.deadline(request.headers.get(TIMEOUT_HEADER))
            body = await self._body(request)
            headers = request.headers
            forwarded = tuple((name, value) for name in FORWARDED
                              if (value := headers.get(name)) is not None)
            answer = await plane.infer(InferRequest(app_id, deadline, body, forwarded,
                                                    version=version))
        except GatewayError as exc:
            return error_response(exc)
        return self._infer_reply(answer, app_id)

    async def _body(self, request: web.Request) -> bytes:
        length = request.content_length
        if length is not None and length > self.max_body:
            raise BodyTooLargeError(f"request body of {length} bytes is above the limit of "
                                    f"{self.max_body}")
        try:
            if length is not None:
                # One copy of the body, where read() makes three.
                return await request.content.readexactly(length) if length else b""
            return await request.read()
        except asyncio.IncompleteReadError:
            raise BadRequestError("the request body ended before its Content-Length") from None
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLargeError(f"request body above the limit of {self.max_body} "
                                    "bytes") from None

    @staticmethod
    def _infer_reply(answer: Answer, app_id: str) -> web.Response:
        reply, route = answer.reply, answer.route
        length = reply.headers.get("inference-header-content-length")
        header_length = int(length) if length and length.isdigit() else None
        body = reply.body
        if reply.status == 200:
            renamed = rename_infer_reply(body, route.model_name, app_id, header_length)
            body, header_length = renamed.body, renamed.header_length
        headers = {"Content-Type": reply.headers.get("content-type", "application/json"),
                   SERVER_HEADER: route.server_id, VARIANT_HEADER: route.variant,
                   ATTEMPTS_HEADER: str(answer.attempts)}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        encoding = reply.headers.get("content-encoding")
        if encoding:
            headers["Content-Encoding"] = encoding
        return web.Response(status=reply.status, body=body, headers=headers)

    # --- models --------------------------------------------------------------------------

    async def _model_call(self, request: web.Request, suffix: str) -> Answer | web.Response:
        app_id = request.match_info["app_id"]
        try:
            self.plane.check_app(app_id)
            version = self.plane.check_version(request.match_info.get("version", ""))
            return await self.plane.model_call(app_id, suffix, version)
        except GatewayError as exc:
            return error_response(exc)

    async def metadata(self, request: web.Request) -> web.Response:
        return await self._renamed(request, "")

    async def config(self, request: web.Request) -> web.Response:
        return await self._renamed(request, "/config")

    async def _renamed(self, request: web.Request, suffix: str) -> web.Response:
        answer = await self._model_call(request, suffix)
        if isinstance(answer, web.Response):
            return answer
        reply = answer.reply
        body = (rename_metadata(reply.body, request.match_info["app_id"])
                if reply.status == 200 else reply.body)
        return web.Response(status=reply.status, body=body, headers={
            "Content-Type": reply.headers.get("content-type", "application/json"),
            SERVER_HEADER: answer.route.server_id, VARIANT_HEADER: answer.route.variant})

    async def model_ready(self, request: web.Request) -> web.Response:
        answer = await self._model_call(request, "/ready")
        if isinstance(answer, web.Response):
            return answer
        return web.Response(status=answer.reply.status, body=answer.reply.body, headers={
            SERVER_HEADER: answer.route.server_id, VARIANT_HEADER: answer.route.variant})

    # --- the gateway itself --------------------------------------------------------------

    async def live(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, _: web.Request) -> web.Response:
        if self.plane.ready():
            return web.Response(status=200)
        return web.json_response({"error": "no routing table yet, or stopping"}, status=503)

    async def server_metadata(self, _: web.Request) -> web.Response:
        return web.json_response(SERVER_METADATA)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.plane.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def not_found(self, request: web.Request) -> web.Response:
        return web.json_response({"error": f"no endpoint {request.method} "
                                           f"{request.path[:200]}"}, status=404)
