"""REST routes of service graphs: decode, call ``controller.graphs.manager.GraphManager``, encode.

``POST /v1/graphs`` (a :class:`GraphRegistration`; ``?wait=false`` answers 202 while the
replicas start), ``GET /v1/graphs``, ``GET/DELETE /v1/graphs/{name}``, ``POST
/v1/graphs/{name}/requests`` (one client request; the reply's tensors as flat value lists) and
``GET /v1/graphs/{name}/consistency`` (the checker's verdict, for graphs registered with
``observe``). Errors map to statuses in ``controller/api.py``'s handlers.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controller.graphs.records import GraphRecord, GraphRegistration
from controller.service import Controller
from controller.views import DEFAULT_PAGE, MAX_PAGE, next_headers, page_of
from stateful.core.frontend import ClientRequest
from stateful.messages import Payload

MAX_VALUES = 1_000_000
"""Values per input tensor accepted over REST (a 4 MB float32 tensor)."""


class TensorIn(BaseModel):
    """An input tensor as a flat list of numbers, with an optional shape."""

    model_config = ConfigDict(extra="forbid", strict=True)

    values: list[float] = Field(max_length=MAX_VALUES)
    shape: list[int] | None = None

    @field_validator("values")
    @classmethod
    def _finite(cls, values: list[float]) -> list[float]:
        if not all(math.isfinite(v) for v in values):
            raise ValueError("values must be finite numbers")
        return values

    def payload(self) -> Payload:
        import numpy as np

        shape = tuple(self.shape) if self.shape is not None else (len(self.values),)
        if math.prod(shape) != len(self.values) or any(d < 0 for d in shape):
            raise ValueError(f"shape {list(shape)} does not hold {len(self.values)} values")
        data = np.asarray(self.values, dtype="<f4").tobytes()
        return Payload(dtype="float32", shape=shape, data=data)


class GraphRequestIn(BaseModel):
    """Body of ``POST /v1/graphs/{name}/requests``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: dict[str, TensorIn]
    """Entry operator -> its input tensor."""
    stream: str = Field("default", min_length=1, max_length=128)
    kind: Literal["infer", "train"] = "infer"
    label: int | None = None
    timeout_s: float = Field(30.0, gt=0, le=300)


class TensorOut(BaseModel):
    """An output tensor."""

    shape: list[int]
    values: list[float]


class GraphReply(BaseModel):
    """The graph's reply: one tensor per reply operator."""

    outputs: dict[str, TensorOut]


def _tensor_out(payload: Payload) -> TensorOut:
    import numpy as np

    dtype = "<f4" if payload.dtype == "float32" else "<i8"
    values = np.frombuffer(payload.data, dtype=dtype).astype(float).tolist()
    return TensorOut(shape=list(payload.shape), values=values)


def graph_routes(app: FastAPI, controller: Controller) -> None:
    """Add the ``/v1/graphs`` routes (mutating ones need the bearer token)."""

    @app.post("/v1/graphs", status_code=201, tags=["graphs"])
    async def register(registration: GraphRegistration, response: Response,
                       wait: bool = True) -> GraphRecord:
        record = await controller.graphs.register(registration, wait=wait)
        if not wait:
            response.status_code = 202
        return record

    @app.get("/v1/graphs", tags=["graphs"])
    async def list_graphs(response: Response, request: Request, cursor: str | None = None,
                          limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE
                          ) -> list[GraphRecord]:
        graphs = {g.name: g for g in await controller.graphs.registered()}
        found, next_cursor = page_of(graphs, cursor, limit)
        response.headers.update(next_headers(request.url.path, request.query_params,
                                             next_cursor))
        return found

    @app.get("/v1/graphs/{name}", tags=["graphs"])
    async def get_graph(name: str) -> GraphRecord:
        return await controller.graphs.get(name)

    @app.delete("/v1/graphs/{name}", status_code=204, tags=["graphs"])
    async def delete_graph(name: str) -> Response:
        await controller.graphs.delete(name)
        return Response(status_code=204)

    @app.post("/v1/graphs/{name}/requests", tags=["graphs"])
    async def submit(name: str, body: GraphRequestIn) -> GraphReply:
        from controller.errors import InvalidRequestError

        try:
            inputs = {op: tensor.payload() for op, tensor in body.inputs.items()}
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        request = ClientRequest(inputs=inputs, stream=body.stream, kind=body.kind,
                                label=body.label)
        outputs = await controller.graphs.submit(name, request, timeout_s=body.timeout_s)
        return GraphReply(outputs={op: _tensor_out(p) for op, p in outputs.items()})

    @app.get("/v1/graphs/{name}/consistency", tags=["graphs"])
    async def consistency(name: str) -> dict[str, Any]:
        return await controller.graphs.consistency(name)
