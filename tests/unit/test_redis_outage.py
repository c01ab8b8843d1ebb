"""Redis outages: API calls fail fast, background work waits and goes on, each outage logged once.

``RedisHealth`` with a stand-in probe (no socket), and the API's front gate on the ASGI app in
process. The same against a real redis-server killed and restarted is in
``tests/integration/test_redis_outage.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import controller.redis_health as redis_health
from controller.access import Gate
from controller.api import create_app
from controller.credentials import Role
from controller.metrics import Metrics
from controller.redis_health import (
    CUT_OFF_S,
    RedisHealth,
    RedisUnavailableError,
    request_scope,
)
from tests.unit.scenario import run

TOKEN = "outage"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Probe:
    """A probe that fails until Redis is ``back``."""

    def __init__(self) -> None:
        self.back = False
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        if not self.back:
            raise RedisConnectionError("connection refused")
        return True


@pytest.fixture(autouse=True)
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_health, "PROBE_INTERVAL_S", 0.01)


def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    probe = Probe()
    now = [100.0]
    health = RedisHealth(probe, clock=lambda: now[0])

    async def scenario() -> None:
        health.failed(RedisConnectionError("connection refused"))
        health.failed(RedisConnectionError("again"))  # the same outage
        now[0] += 7.5
        assert health.stats() == redis_health.RedisStats(False, 1, 7.5)
        probe.back = True
        while health.down:
            await asyncio.sleep(0.01)
        now[0] += 100
        assert health.stats() == redis_health.RedisStats(True, 1, 7.5)
        health.failed(RedisConnectionError("a second one"))
        assert health.stats().outages == 2
        health.close()

    with caplog.at_level(logging.INFO, logger="controller.redis_health"):
        run(scenario)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("redis unreachable" in line for line in lines) == 2
    assert [line for line in lines if line.startswith("redis answers")] == [
        "redis answers again after 7.5 s unreachable (outage 1)"]


def test_a_request_fails_fast_while_background_work_waits_and_goes_on() -> None:
    probe = Probe()
    health = RedisHealth(probe)
    sent: list[str] = []

    async def command(name: str) -> str:
        if not probe.back:
            raise RedisConnectionError("connection refused")
        sent.append(name)
        return name

    async def scenario() -> None:
        background = asyncio.ensure_future(health.call(lambda: command("background")))
        await asyncio.sleep(0.05)
        assert health.down and not background.done()  # waits for Redis, does not fail
        started = time.monotonic()
        with request_scope(), pytest.raises(RedisUnavailableError) as refused:
            await health.call(lambda: command("request"))
        assert time.monotonic() - started < 0.1 and refused.value.status == 503
        probe.back = True
        assert await background == "background"  # sent again once Redis answered

    run(scenario)
    assert sent == ["background"]


def test_work_a_request_spawned_fails_fast_only_while_the_request_lasts() -> None:
    health = RedisHealth(Probe())

    async def scenario() -> None:
        health.failed(RedisConnectionError("connection refused"))
        gate = asyncio.Event()

        async def spawned() -> None:
            await gate.wait()
            await health.admit()

        with request_scope():
            during = asyncio.ensure_future(health.admit())
            after = asyncio.ensure_future(spawned())
            with pytest.raises(RedisUnavailableError):
                await during
        gate.set()
        await asyncio.sleep(0.05)
        assert not after.done()  # the request ended: it waits like background work
        health.close()  # the controller stops: it fails instead of waiting forever
        with pytest.raises(RedisUnavailableError):
            await after

    run(scenario)


# --- the API's front gate ------------------------------------------------------------------------

class Blocked:
    """A core whose calls wait until released (a lock held by work waiting for Redis)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0
        self.cancelled = 0

    async def register(self, *_: Any, **__: Any) -> Any:
        self.calls += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise RedisUnavailableError("redis is unreachable")

    async def register_many(self, *_: Any) -> Any:
        raise RedisUnavailableError("redis is unreachable (from the core)")


def _api(health: RedisHealth) -> tuple[Any, Blocked, Metrics]:
    core = Blocked()
    metrics = Metrics()
    metrics.watch_redis(health.stats)

    async def no_gauges() -> None:
        raise RedisUnavailableError("no records in an outage")

    store = SimpleNamespace(health=health, idempotency=None)
    controller = SimpleNamespace(gate=Gate.with_tokens({TOKEN: Role.ADMIN}), ready=True,
                                 store=store, orchestrator=core, metrics=metrics,
                                 refresh_gauges=no_gauges)
    return create_app(controller), core, metrics  # type: ignore[arg-type]


async def _client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v1/apps", None),
    ("GET", "/v1/servers/s1", None),
    ("POST", "/v1/apps", {"app_id": "a", "family": "f"}),
    ("PATCH", "/v1/config", {"alpha": 0.2}),
    ("DELETE", "/v1/apps/a", None),
    ("POST", "/v1/plan/solve", None),
])
def test_every_api_call_gets_503_with_retry_after_at_once_in_an_outage(
        method: str, path: str, body: Any) -> None:
    health = RedisHealth(Probe())

    async def scenario() -> httpx.Response:
        health.failed(RedisConnectionError("connection refused"))
        app, core, _ = _api(health)
        async for client in _client(app):
            started = time.monotonic()
            response = await client.request(method, path, headers=AUTH, json=body)
            assert time.monotonic() - started < 0.5
            assert core.calls == 0  # refused before any work
            health.close()
            return response
        raise AssertionError("no client")

    response = run(scenario)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "redis is unreachable" in response.json()["detail"]


def test_health_and_metrics_answer_in_an_outage_and_show_it() -> None:
    health = RedisHealth(Probe())

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        health.failed(RedisConnectionError("connection refused"))
        app, _, _ = _api(health)
        async for client in _client(app):
            answers = (await client.get("/healthz"), await client.get("/metrics", headers=AUTH),
                       await client.post("/v1/apps", json={}))  # no token: 401 first
            health.close()
            return answers
        raise AssertionError("no client")

    healthz, metrics, unauthorised = run(scenario)
    assert healthz.status_code == 200 and unauthorised.status_code == 401
    assert metrics.status_code == 200
    assert "understudy_redis_up 0.0" in metrics.text
    assert "understudy_redis_outages_total 1.0" in metrics.text
    assert "understudy_redis_outage_seconds_total" in metrics.text


def test_a_request_in_flight_when_the_outage_begins_is_cut_off_with_a_503() -> None:
    health = RedisHealth(Probe())

    async def scenario() -> tuple[httpx.Response, float, Blocked]:
        app, core, _ = _api(health)
        async for client in _client(app):
            request = asyncio.ensure_future(client.post(
                "/v1/apps", headers=AUTH, json={"app_id": "a", "family": "f"}))
            while core.calls == 0:
                await asyncio.sleep(0.01)
            began = time.monotonic()
            health.failed(RedisConnectionError("connection refused"))
            response = await request
            health.close()
            return response, time.monotonic() - began, core
        raise AssertionError("no client")

    response, waited, core = run(scenario)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert CUT_OFF_S <= waited < CUT_OFF_S + 0.5
    assert core.cancelled == 1  # it does not go on once Redis is back


def test_redis_unavailable_from_the_core_is_a_503_with_retry_after() -> None:
    health = RedisHealth(Probe())

    async def scenario() -> httpx.Response:
        app, _, _ = _api(health)
        async for client in _client(app):
            return await client.post("/v1/apps/batch", headers=AUTH,
                                     json={"apps": [{"app_id": "a", "family": "f"}]})
        raise AssertionError("no client")

    response = run(scenario)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json() == {"detail": "redis is unreachable (from the core)"}


def test_the_schema_documents_the_503_and_the_idempotency_key() -> None:
    app, _, _ = _api(RedisHealth(Probe()))
    spec = app.openapi()
    post = spec["paths"]["/v1/apps"]["post"]
    assert "503" in post["responses"] and "503" in spec["paths"]["/v1/apps"]["get"]["responses"]
    assert "503" not in spec["paths"]["/healthz"]["get"]["responses"]
    assert "Idempotency-Key" in {p["name"] for p in post["parameters"]}
    assert "409" in spec["paths"]["/v1/apps/{app_id}"]["delete"]["responses"]
