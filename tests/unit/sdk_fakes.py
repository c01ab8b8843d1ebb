"""Fakes for the SDK's unit tests: routes set by hand, and replicas that answer or misbehave."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from understudy.sdk.board import RouteBoard
from understudy.sdk.errors import InferenceError, UnknownAppError
from understudy.sdk.locations import Location
from understudy.sdk.records import ModelMetadata, TensorSpec
from understudy.sdk.routes import AppRoute
from understudy.sdk.transport import Prepared, RetryableError


def loc(server: str, variant: str = "v", app: str = "a") -> Location:
    return Location(http=f"{server}:8000", grpc=f"{server}:8001", model_name=f"{app}__{variant}",
                    server_id=server, variant=variant, accuracy=0.5)


class FakeRoutes:
    """Routes the test sets: ``known`` at the first resolve, then :meth:`move`."""

    def __init__(self, known: Mapping[str, Location | None]) -> None:
        self.board = RouteBoard()
        self.known = dict(known)
        self.resolves = 0

    async def resolve(self, app_id: str, deadline: float) -> AppRoute:
        self.resolves += 1
        route = self.board.route(app_id)
        if route is not None:
            return route
        if app_id not in self.known:
            raise UnknownAppError(f"app {app_id!r} is not registered")
        self.board.place(app_id, self.known[app_id])
        route = self.board.route(app_id)
        assert route is not None
        return route

    def move(self, app_id: str, location: Location | None) -> None:
        self.board.place(app_id, location)

    def delete(self, app_id: str) -> None:
        self.board.end_read(app_id, None)


class FakeReplicas:
    """A transport whose replicas (by server id) answer, refuse, hang, or refuse the input."""

    protocol = "fake"

    def __init__(self) -> None:
        self.mode: dict[str, str] = {}
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.started: dict[str, asyncio.Event] = {}
        self.closed = False

    def started_on(self, server: str) -> asyncio.Event:
        return self.started.setdefault(server, asyncio.Event())

    def prepare(self, inputs: Mapping[str, np.ndarray],
                outputs: Sequence[str] | None) -> Prepared:
        return Prepared(inputs=[dict(inputs)], outputs=list(outputs) if outputs else None)

    async def _call(self, location: Location) -> None:
        server = location.server_id
        self.calls.append(server)
        self.started_on(server).set()
        mode = self.mode.get(server, "ok")
        if mode == "refuse":
            raise RetryableError(f"{server}: connection refused")
        if mode == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(server)
                raise
        if mode == "bad":
            raise InferenceError(f"{server}: unexpected shape for input 'x'")

    async def infer(self, location: Location, request: Prepared,
                    timeout_s: float) -> tuple[str, dict[str, np.ndarray]]:
        await self._call(location)
        inputs: dict[str, Any] = request.inputs[0]
        return location.model_name, {f"{k}_out": np.asarray(v) + 1 for k, v in inputs.items()}

    async def metadata(self, location: Location, timeout_s: float) -> ModelMetadata:
        await self._call(location)
        return ModelMetadata(location.model_name, (TensorSpec("x", "INT64", (-1, 2)),),
                             (TensorSpec("x_out", "INT64", (-1, 2)),),
                             server_id=location.server_id, variant=location.variant)

    async def ready(self, location: Location, timeout_s: float) -> bool:
        await self._call(location)
        return True

    async def close(self) -> None:
        self.closed = True
