"""The SDK's resolve while the controller cannot answer keeps the last known location."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from understudy.client import ClientError, Location, UnderstudyClient


def answering(status: int, body: Any = None) -> Any:
    def get(url: str, **_: Any) -> httpx.Response:
        return httpx.Response(status, json=body, request=httpx.Request("GET", url))
    return get


def test_a_controller_whose_redis_is_down_leaves_the_last_location(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = UnderstudyClient("http://controller", "a")
    known = Location(http="h:1", grpc="h:2", model_name="a__v", server_id="s1", variant="v",
                     accuracy=1.0)
    client._set(known, None)
    monkeypatch.setattr(httpx, "get", answering(503, {"detail": "redis unavailable"}))
    assert client.resolve() == known  # no exception: requests go on retrying
    monkeypatch.setattr(httpx, "get", answering(404, {"detail": "no app"}))
    with pytest.raises(ClientError, match="not registered"):
        client.resolve()
