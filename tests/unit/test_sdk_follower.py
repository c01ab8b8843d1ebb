"""The SDK learning routes from the controller: reads, a controller that cannot answer, gaps
in the event stream (the REST API faked with httpx.MockTransport, the stream by a list)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.unit.scenario import run
from tests.unit.test_sdk_routes import event, view
from understudy.sdk.board import RouteBoard
from understudy.sdk.errors import UnavailableError, UnknownAppError
from understudy.sdk.follower import ControllerRoutes


def controller(answer: Callable[[str], httpx.Response]) -> tuple[ControllerRoutes, list[str]]:
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        assert request.headers.get("Authorization") == "Bearer secret"
        return answer(request.url.path)

    routes = ControllerRoutes("http://controller:8000", RouteBoard(), token="secret",
                              http_transport=httpx.MockTransport(handle))
    return routes, asked


def serving_on(server: str) -> Callable[[str], httpx.Response]:
    def answer(path: str) -> httpx.Response:
        app = path.rsplit("/", 1)[1]
        if app == "nope":
            return httpx.Response(404, json={"detail": "no app"})
        return httpx.Response(200, json=view(server, app))
    return answer


def test_an_app_is_read_once_and_an_unknown_one_is_an_error() -> None:
    async def scenario() -> None:
        routes, asked = controller(serving_on("s1"))
        deadline = asyncio.get_running_loop().time() + 5
        routes_read = await asyncio.gather(*(routes.resolve("a", deadline) for _ in range(5)))
        assert all(r.serving is not None and r.serving.server_id == "s1" for r in routes_read)
        assert asked == ["/v1/apps/a"]  # one read shared by every waiting request
        with pytest.raises(UnknownAppError, match="not registered"):
            await routes.resolve("nope", deadline)
        await routes.close()

    run(scenario)


def test_a_controller_that_cannot_answer_is_retried_until_the_deadline() -> None:
    async def scenario() -> None:
        routes, asked = controller(lambda _: httpx.Response(503, json={"detail": "redis"}))
        deadline = asyncio.get_running_loop().time() + 0.3
        with pytest.raises(UnavailableError, match="answered 503"):
            await routes.resolve("a", deadline)
        assert len(asked) >= 2
        await routes.close()

    run(scenario)


def test_a_known_route_stands_while_the_controller_cannot_answer() -> None:
    async def scenario() -> None:
        state = {"answer": serving_on("s1")}
        routes, _ = controller(lambda path: state["answer"](path))
        deadline = asyncio.get_running_loop().time() + 5
        await routes.resolve("a", deadline)
        state["answer"] = lambda _: httpx.Response(503, json={"detail": "redis"})
        await routes.reload()
        route = routes.board.route("a")
        assert route is not None and route.serving is not None
        assert route.serving.server_id == "s1"
        await routes.close()

    run(scenario)


class FakeStream:
    """The event stream: frames, then a broken connection."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.frames = [json.dumps(f) for f in frames]

    async def recv(self) -> str:
        if not self.frames:
            raise OSError("connection reset")
        return self.frames.pop(0)


def test_a_gap_in_the_stream_reads_the_apps_again() -> None:
    async def scenario() -> None:
        state = {"server": "s1"}
        routes, asked = controller(lambda path: serving_on(state["server"])(path))
        deadline = asyncio.get_running_loop().time() + 5
        await routes.resolve("a", deadline)
        state["server"] = "s3"  # where the events we miss took the app
        stream = FakeStream([event(1, "a", "warm_switch", "s2"), event(2, "b", "serving", "s1"),
                             event(7, "c", "serving", "s1")])
        with pytest.raises(OSError):
            await routes._read_stream(stream)  # type: ignore[arg-type]
        route = routes.board.route("a")
        assert route is not None and route.serving is not None
        assert route.serving.server_id == "s3"
        assert routes.reloads == 1 and asked == ["/v1/apps/a", "/v1/apps/a"]
        assert routes.board.table.last_seq == 7
        await routes.close()

    run(scenario)


def test_the_stream_resumes_from_the_last_event_seen() -> None:
    routes = ControllerRoutes("https://controller:8443/", RouteBoard())
    assert routes._ws_url(None) == "wss://controller:8443/v1/events/ws"
    routes.board.table.apply(event(41, "x", "serving", "s1"))
    assert routes._ws_url(routes.board.table.last_seq) == \
        "wss://controller:8443/v1/events/ws?since=41"
