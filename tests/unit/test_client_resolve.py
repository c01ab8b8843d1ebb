"""The first SDK's interface (``understudy.client``) over the new one: a controller whose Redis
is down leaves the last known location; an unknown app is a ClientError."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.test_sdk_routes import view
from understudy.client import ClientError, UnderstudyClient
from understudy.sdk import Client
from understudy.sdk.board import RouteBoard
from understudy.sdk.follower import ControllerRoutes


def test_a_controller_whose_redis_is_down_leaves_the_last_location(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"status": 200}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/nope"):
            return httpx.Response(404, json={"detail": "no app"})
        if state["status"] != 200:
            return httpx.Response(state["status"], json={"detail": "redis unavailable"})
        return httpx.Response(200, json=view("s1"))

    routes = ControllerRoutes("http://controller", RouteBoard(),
                              http_transport=httpx.MockTransport(handle))
    monkeypatch.setattr("understudy.client.Client",
                        lambda url, **kw: Client(url, routes=routes, **kw))
    monkeypatch.setattr("understudy.client.RESOLVE_TIMEOUT_S", 0.2)
    client = UnderstudyClient("http://controller", "a").start()
    try:
        known = client.location
        assert known is not None and known.server_id == "s1"
        state["status"] = 503
        assert client.resolve() == known  # no exception: requests go on retrying
        with pytest.raises(ClientError, match="not registered"):
            UnderstudyClient("http://controller", "nope").start()
    finally:
        client.close()
