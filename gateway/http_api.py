"""The KServe v2 / Triton HTTP front end: decode, call the data plane, encode.

Routes: ``POST /v2/models/{app_id}[/versions/{v}]/infer``, ``GET /v2/models/{app_id}[/versions/
{v}]`` (metadata), ``.../ready``, ``.../config``, ``GET /v2/health/live|ready``, ``GET /v2``,
``GET /metrics``. An infer body goes to Triton as it came (JSON, or the binary tensor extension
with its ``Inference-Header-Content-Length``, compressed or not); the reply comes back as Triton
wrote it, with ``model_name`` saying the app and the ``Understudy-Server`` /
``Understudy-Variant`` headers naming the replica that answered. Errors are Triton-shaped:
``{"error": "..."}``.
"""

from __future__ import annotations

import json
import logging

from gateway.dataplane import DataPlane, rename_infer_reply, rename_metadata
from gateway.errors import GatewayError
from gateway.exchange import Answer, InferRequest, Send
from gateway.http_server import HttpRequest, HttpResponse, json_error
from gateway.upstream import HttpUpstream, UpstreamReply
from understudy.client import Location

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "understudy-timeout-ms"
"""A request's deadline, in milliseconds from its arrival (default: the gateway's)."""
SERVER_HEADER = "Understudy-Server"
VARIANT_HEADER = "Understudy-Variant"
ATTEMPTS_HEADER = "Understudy-Attempts"
ANSWER_HEADER = "Understudy-Answer"
"""On an answer that is not the model's own prediction: ``reconstructed`` (decoded from a
parity model's output), ``default`` (the default response) or ``approximate`` (the
approximate backup's). Absent: the model answered."""
RECONSTRUCTED_HEADER = "Understudy-Reconstructed"
GROUP_HEADER = "Understudy-Coding-Group"
HEADER_LENGTH = "Inference-Header-Content-Length"
FORWARDED = (("content-type", "Content-Type"), ("inference-header-content-length", HEADER_LENGTH),
             ("content-encoding", "Content-Encoding"))
"""Request headers Triton needs to read the body; the others stay at the gateway."""
JSON = (("Content-Type", "application/json"),)
SERVER_METADATA = json.dumps({"name": "understudy-gateway", "version": "1", "extensions": [
    "classification", "binary_tensor_data", "parameters"]}).encode()
MODEL_CALLS = {"": "metadata", "ready": "ready", "config": "config"}


def http_sender(upstream: HttpUpstream) -> Send:
    """The exchange's way to send a request to one replica's Triton over HTTP."""

    async def send(route: Location, request: InferRequest) -> UpstreamReply:
        version = f"/versions/{request.version}" if request.version else ""
        path = f"/v2/models/{route.model_name}{version}{request.suffix}"
        return await upstream.request(route.http.removeprefix("http://"), request.method,
                                      path, request.headers, request.body, request.arriving)

    return send


def error_response(exc: GatewayError) -> HttpResponse:
    """Triton's error shape, with the error's status."""
    return json_error(exc.status, exc.message)


class HttpFrontEnd:
    """Routes HTTP requests to the data plane (the handler of the gateway's HTTP server)."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        parts = request.path.split("/")
        method = request.method
        if len(parts) >= 4 and parts[1] == "v2" and parts[2] == "models":
            return await self._model_route(request, parts[3], parts[4:])
        if method not in ("GET", "HEAD"):
            return self._not_found(request)
        if request.path == "/v2/health/live":
            return HttpResponse(200)
        if request.path == "/v2/health/ready":
            return HttpResponse(200) if self.plane.ready() else json_error(
                503, "no routing table yet, or stopping")
        if request.path == "/v2":
            return HttpResponse(200, SERVER_METADATA, JSON)
        if request.path == "/metrics":
            return HttpResponse(200, self.plane.metrics.render(),
                                (("Content-Type", "text/plain; version=0.0.4"),))
        return self._not_found(request)

    async def _model_route(self, request: HttpRequest, app_id: str,
                           rest: list[str]) -> HttpResponse:
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        if len(rest) > 1:
            return self._not_found(request)
        action = rest[0] if rest else ""
        if action == "infer":
            if request.method != "POST":
                return json_error(405, "infer takes POST")
            return await self.infer(request, app_id, version)
        if action not in MODEL_CALLS:
            return self._not_found(request)
        if request.method not in ("GET", "HEAD"):
            return json_error(405, f"model {MODEL_CALLS[action]} takes GET")
        return await self.model_call(app_id, version, action)

    # --- inference -----------------------------------------------------------------------

    async def infer(self, request: HttpRequest, app_id: str, version: str) -> HttpResponse:
        plane = self.plane
        headers = request.headers
        try:
            plane.check_app(app_id)
            plane.check_version(version)
            deadline = plane.deadline(headers.get(TIMEOUT_HEADER))
            forwarded = tuple((name, value) for key, name in FORWARDED
                              if (value := headers.get(key)) is not None)
            answer = await plane.infer(InferRequest(app_id, deadline, request.body, forwarded,
                                                    version=version,
                                                    arriving=request.arriving))
        except GatewayError as exc:
            return error_response(exc)
        return self._infer_reply(answer, app_id)

    @staticmethod
    def _infer_reply(answer: Answer, app_id: str) -> HttpResponse:
        reply, route = answer.reply, answer.route
        length = reply.headers.get("inference-header-content-length")
        header_length = int(length) if length and length.isdigit() else None
        body = reply.body
        if reply.status == 200:
            renamed = rename_infer_reply(body, route.model_name, app_id, header_length)
            body, header_length = renamed.body, renamed.header_length
        headers = [("Content-Type", reply.headers.get("content-type", "application/json")),
                   (SERVER_HEADER, route.server_id), (VARIANT_HEADER, route.variant),
                   (ATTEMPTS_HEADER, str(answer.attempts))]
        if header_length is not None:
            headers.append((HEADER_LENGTH, str(header_length)))
        if answer.source != "model":
            headers.append((ANSWER_HEADER, answer.source))
            if answer.source == "reconstructed":
                headers += [(RECONSTRUCTED_HEADER, "true"), (GROUP_HEADER, answer.group_id)]
        encoding = reply.headers.get("content-encoding")
        if encoding:
            headers.append(("Content-Encoding", encoding))
        return HttpResponse(reply.status, body, headers)

    # --- models --------------------------------------------------------------------------

    async def model_call(self, app_id: str, version: str, action: str) -> HttpResponse:
        """Metadata, configuration or readiness of the app's serving model."""
        try:
            self.plane.check_app(app_id)
            self.plane.check_version(version)
            answer = await self.plane.model_call(app_id, f"/{action}" if action else "",
                                                 version)
        except GatewayError as exc:
            return error_response(exc)
        reply = answer.reply
        body = reply.body
        if reply.status == 200 and action != "ready":
            body = rename_metadata(body, app_id)
        headers = [(SERVER_HEADER, answer.route.server_id),
                   (VARIANT_HEADER, answer.route.variant)]
        if "content-type" in reply.headers:
            headers.append(("Content-Type", reply.headers["content-type"]))
        return HttpResponse(reply.status, body, headers)

    @staticmethod
    def _not_found(request: HttpRequest) -> HttpResponse:
        return json_error(404, f"no endpoint {request.method} {request.path[:200]}")
