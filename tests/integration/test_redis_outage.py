"""A real controller through a Redis outage: its redis-server SIGKILLed, then restarted.

The controller (uvicorn, in this process so its loops can be watched) must answer every API
call within a second while Redis is gone (503 with ``Retry-After``), log the outage once when
it begins and once when it ends, count it in /metrics, keep its background loops alive and
resume them once Redis is back, and apply a POST retried with an ``Idempotency-Key`` once.
A POST whose client gave up during the outage must not be applied when Redis returns, and the
controller must stop while Redis is still down.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from controller.api import create_app
from controller.credentials import CredentialStore
from controller.redis_server import RedisServer
from controller.service import Controller, ControllerSettings
from understudy.cli.controller import server_options
from understudy.wire.credentials import bearer, read_token_file
from understudy.wire.ports import free_port

pytestmark = pytest.mark.timeout(180)
OUTAGE_CALLS = [("GET", "/v1/apps", None), ("GET", "/v1/servers", None),
                ("GET", "/v1/config", None), ("GET", "/v1/events", None),
                ("POST", "/v1/apps", {"app_id": "during", "family": "mobilenet_v3"}),
                ("PATCH", "/v1/config", {"alpha": 0.2}), ("DELETE", "/v1/apps/before", None),
                ("POST", "/v1/plan/solve", None)]


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def _watch_loops(controller: Controller) -> dict[str, list[float]]:
    """When each background loop last finished a pass (wrapping the pass it calls each time)."""
    passes: dict[str, list[float]] = {"convergence": [], "reconciler": [], "watchdog": []}
    owners = {"convergence": (controller.orchestrator, "converge_pass"),
              "reconciler": (controller.reconciler, "tick"),
              "watchdog": (controller.lifecycle, "watchdog_pass")}
    for name, (owner, method) in owners.items():
        original = getattr(owner, method)

        async def counted(*args: Any, _original: Any = original, _name: str = name) -> Any:
            result = await _original(*args)
            passes[_name].append(time.monotonic())
            return result

        setattr(owner, method, counted)
    return passes


async def _call(http: httpx.AsyncClient, method: str, path: str,
                body: Any) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = await http.request(method, path, json=body)
    return time.monotonic() - started, response


async def _during_outage(http: httpx.AsyncClient) -> list[tuple[float, httpx.Response]]:
    """Every kind of call, ten times over, once the controller saw Redis go."""
    answers = [await _call(http, "POST", "/v1/apps", {"app_id": "first",
                                                     "family": "mobilenet_v3"})]
    for _ in range(10):
        for method, path, body in OUTAGE_CALLS:
            answers.append(await _call(http, method, path, body))
    return answers


def test_a_redis_outage_fails_fast_is_logged_counted_and_survived(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="controller.redis_health")
    asyncio.run(asyncio.wait_for(_scenario(tmp_path), 150))
    lines = [r.getMessage() for r in caplog.records if r.name == "controller.redis_health"]
    assert sum(line.startswith("redis unreachable") for line in lines) == 2  # two outages
    back = [line for line in lines if line.startswith("redis answers again")]
    assert len(back) == 1 and re.match(r"redis answers again after \d+\.\d s", back[0])


async def _scenario(tmp_path: Path) -> None:
    # appendfsync always: what was acknowledged before the kill is there after the restart.
    redis = RedisServer(tmp_path / "redis", appendfsync="always")
    await asyncio.to_thread(redis.start)
    port = free_port()
    store = CredentialStore(tmp_path / "credentials")
    store.init()
    auth = bearer(read_token_file(store.token_path("admin")))
    controller = Controller(ControllerSettings(
        port=port, run_dir=tmp_path / "controller", redis_url=redis.url,
        credentials_dir=store.directory, startup_grace_s=3600))
    server = uvicorn.Server(uvicorn.Config(create_app(controller), host="127.0.0.1", port=port,
                                           log_config=None, **server_options()))
    serving = asyncio.ensure_future(server.serve())
    try:
        await _until("the controller", lambda: _started(server, serving), 60)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth,
                                     timeout=10) as http:
            await _outage_and_return(controller, redis, http)
            # A second outage, and the controller stops in it (nothing waits for Redis).
            redis.kill()
            await _until("the second outage", lambda: _refused(http), 10)
    finally:
        server.should_exit = True
        stopping = time.monotonic()
        await asyncio.wait_for(serving, 20)
        assert time.monotonic() - stopping < 10, "the controller hung stopping in an outage"
        redis.stop()


async def _started(server: uvicorn.Server, serving: asyncio.Future[Any]) -> bool:
    assert not serving.done(), "the controller did not start"
    return server.started


async def _refused(http: httpx.AsyncClient) -> bool:
    return (await http.get("/v1/apps")).status_code == 503


async def _outage_and_return(controller: Controller, redis: RedisServer,
                             http: httpx.AsyncClient) -> None:
    assert (await http.post("/v1/apps", json={"app_id": "before",
                                              "family": "mobilenet_v3"})).status_code == 201
    passes = _watch_loops(controller)
    redis.kill()
    answers = await _during_outage(http)
    latencies = sorted(seconds for seconds, _ in answers)
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    assert p99 < 1.0, f"p99 {p99:.3f} s with Redis down"
    refused = [r for _, r in answers if r.status_code == 503]
    assert answers[0][1].status_code == 503  # a POST: it needs Redis at once
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert len(refused) >= len(answers) - 8  # reads from memory may answer until it is seen
    # A POST whose client gives up quickly: answered 503 within its patience, never applied.
    gave_up = await http.post("/v1/apps", json={"app_id": "gave-up", "family": "mobilenet_v3"},
                              timeout=2.0)
    keyed = await http.post("/v1/apps", json={"app_id": "keyed", "family": "mobilenet_v3"},
                            headers={"Idempotency-Key": "register-keyed"})
    assert (gave_up.status_code, keyed.status_code) == (503, 503)
    metrics = (await http.get("/metrics")).text
    assert _metric(metrics, "understudy_redis_up") == 0.0
    assert _metric(metrics, "understudy_redis_outages_total") == 1.0
    await asyncio.sleep(1.5)  # the loops wait through the outage
    restart = RedisServer(redis.data_dir, port=redis.port, appendfsync="always")
    await asyncio.to_thread(restart.start)
    redis.process = restart.process
    back_at = time.monotonic()
    await _until("readiness after the outage",
                 lambda: _status_is(http, "GET", "/readyz", 200), 20)
    await _retried_with_a_key(http)
    assert (await http.get("/v1/apps/gave-up")).status_code == 404
    assert (await http.get("/v1/apps/during")).status_code == 404
    assert (await http.post("/v1/plan/solve")).status_code == 200  # the warm planner too
    await _until("every loop's pass after the outage", lambda: _resumed(passes, back_at), 20)
    metrics = (await http.get("/metrics")).text
    assert _metric(metrics, "understudy_redis_up") == 1.0
    assert _metric(metrics, "understudy_redis_outages_total") == 1.0
    assert _metric(metrics, "understudy_redis_outage_seconds_total") >= 1.5


async def _retried_with_a_key(http: httpx.AsyncClient) -> None:
    body = {"app_id": "keyed", "family": "mobilenet_v3"}
    key = {"Idempotency-Key": "register-keyed"}
    first = await http.post("/v1/apps", json=body, headers=key)
    retried = await http.post("/v1/apps", json=body, headers=key)
    assert (first.status_code, retried.status_code) == (201, 201), (first.text, retried.text)
    assert retried.headers["idempotent-replayed"] == "true" and retried.json() == first.json()
    other = await http.post("/v1/apps", json={**body, "critical": True}, headers=key)
    assert other.status_code == 422 and "different request" in other.json()["detail"]
    again = await http.post("/v1/apps", json=body)  # without the key: it is registered
    assert again.status_code == 409


async def _status_is(http: httpx.AsyncClient, method: str, path: str, status: int) -> bool:
    return (await http.request(method, path)).status_code == status


async def _resumed(passes: dict[str, list[float]], back_at: float) -> bool:
    return all(any(t > back_at for t in done) for done in passes.values())
