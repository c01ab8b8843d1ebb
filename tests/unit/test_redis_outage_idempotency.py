"""Idempotency keys: a retried mutating call is applied once and gets the first answer.

The middleware and the key log on a small FastAPI app in process, over an in-memory stand-in for
the Redis commands and scripts the log uses (no socket). Against a real controller and a real
redis-server killed and restarted: ``tests/integration/test_redis_outage.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from controller.access import Gate
from controller.http_guard import RequestGuard
from controller.idempotency import IdempotencyGuard, IdempotencyLog
from controller.redis_scripts import CLAIM_LUA, REPLACE_LUA


class ScriptedRedis:
    """GET, and the log's two scripts, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    async def get(self, key: str) -> str | None:
        return self.data.get(key)

    def register_script(self, text: str) -> Callable[..., Awaitable[Any]]:
        scripts = {CLAIM_LUA: self._claim, REPLACE_LUA: self._replace}
        return scripts[text]

    async def _claim(self, keys: list[str], args: list[Any]) -> str | None:
        current = self.data.get(keys[0])
        if current is None:
            self.data[keys[0]] = args[0]
        return current

    async def _replace(self, keys: list[str], args: list[Any]) -> int:
        if self.data.get(keys[0]) != args[0]:
            return 0
        if args[1] == "":
            del self.data[keys[0]]
        else:
            self.data[keys[0]] = args[1]
        return 1


class Things:
    """A tiny API: creating a thing counts, ``boom`` fails, ``slow`` waits to be released."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.booms = 0
        self.release = asyncio.Event()
        self.app = FastAPI()
        self.app.post("/v1/things", status_code=201)(self.create)
        self.app.post("/v1/boom")(self.boom)
        self.app.post("/v1/slow")(self.slow)
        self.app.get("/v1/things")(self.list_things)

    async def create(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        self.created.append(body)
        return {"number": len(self.created), **body}

    async def boom(self) -> JSONResponse:
        self.booms += 1
        return JSONResponse({"detail": "broken"}, status_code=500)

    async def slow(self) -> dict[str, str]:
        await self.release.wait()
        return {"done": "yes"}

    async def list_things(self) -> list[dict[str, Any]]:
        return self.created


def _served(things: Things, log: IdempotencyLog) -> Any:
    things.app.add_middleware(IdempotencyGuard, log=lambda: log)
    things.app.add_middleware(RequestGuard, gate=Gate(None))
    return things.app


def run(body: Callable[[httpx.AsyncClient], Awaitable[Any]], app: Any) -> Any:
    async def scenario() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await body(client)

    return asyncio.run(asyncio.wait_for(scenario(), 10.0))


@pytest.fixture()
def setup() -> tuple[Things, IdempotencyLog, ScriptedRedis, Any]:
    redis = ScriptedRedis()
    log = IdempotencyLog(redis)
    things = Things()
    return things, log, redis, _served(things, log)


def test_a_retry_with_the_key_is_applied_once_and_gets_the_first_answer(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, _, redis, app = setup

    async def twice(client: httpx.AsyncClient) -> list[httpx.Response]:
        headers = {"Idempotency-Key": "k-1"}
        return [await client.post("/v1/things", json={"name": "a"}, headers=headers)
                for _ in range(2)]

    first, retry = run(twice, app)
    assert len(things.created) == 1
    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry.json() == first.json() == {"number": 1, "name": "a"}
    assert retry.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    stored = json.loads(redis.data["us:idempotency:k-1"])
    assert stored["state"] == "done" and stored["status"] == 201


def test_the_same_key_on_a_different_request_is_422(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, _, _, app = setup

    async def reused(client: httpx.AsyncClient) -> httpx.Response:
        headers = {"Idempotency-Key": "k-2"}
        await client.post("/v1/things", json={"name": "a"}, headers=headers)
        return await client.post("/v1/things", json={"name": "b"}, headers=headers)

    response = run(reused, app)
    assert response.status_code == 422 and "different request" in response.json()["detail"]
    assert [t["name"] for t in things.created] == ["a"]


def test_a_retry_while_the_first_still_runs_is_409(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, _, _, app = setup

    async def concurrent(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        headers = {"Idempotency-Key": "k-3"}
        first = asyncio.ensure_future(client.post("/v1/slow", headers=headers))
        await asyncio.sleep(0.05)
        second = await client.post("/v1/slow", headers=headers)
        things.release.set()
        return await first, second

    first, second = run(concurrent, app)
    assert first.status_code == 200
    assert second.status_code == 409 and second.headers["retry-after"] == "1"


def test_a_server_error_is_not_kept_so_a_retry_runs_again(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, _, redis, app = setup

    async def twice(client: httpx.AsyncClient) -> list[int]:
        headers = {"Idempotency-Key": "k-4"}
        return [(await client.post("/v1/boom", headers=headers)).status_code for _ in range(2)]

    assert run(twice, app) == [500, 500]
    assert things.booms == 2 and "us:idempotency:k-4" not in redis.data


def test_a_record_left_running_by_a_stopped_controller_is_taken_over(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, log, redis, app = setup
    redis.data["us:idempotency:k-5"] = json.dumps({"state": "running", "boot": "gone",
                                                   "fingerprint": "x"})
    # A fingerprint that differs is another request; the same one runs again.
    response = run(lambda c: c.post("/v1/things", json={"name": "a"},
                                    headers={"Idempotency-Key": "k-5"}), app)
    assert response.status_code == 422
    redis.data["us:idempotency:k-5"] = json.dumps({"state": "running", "boot": "gone"})
    response = run(lambda c: c.post("/v1/things", json={"name": "a"},
                                    headers={"Idempotency-Key": "k-5"}), app)
    assert response.status_code == 201 and len(things.created) == 1
    assert json.loads(redis.data["us:idempotency:k-5"])["boot"] == log.boot


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "caf\u00e9"])
def test_a_bad_key_is_422_naming_the_header(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any], key: str) -> None:
    things, _, _, app = setup
    response = run(lambda c: c.post("/v1/things", json={"name": "a"},
                                    headers={"Idempotency-Key": key.encode()}), app)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "header.idempotency-key"
    assert things.created == []


def test_without_a_key_or_on_a_read_nothing_is_kept(
        setup: tuple[Things, IdempotencyLog, ScriptedRedis, Any]) -> None:
    things, _, redis, app = setup

    async def calls(client: httpx.AsyncClient) -> None:
        for _ in range(2):
            await client.post("/v1/things", json={"name": "a"})
            await client.get("/v1/things", headers={"Idempotency-Key": "k-6"})

    run(calls, app)
    assert len(things.created) == 2 and redis.data == {}
