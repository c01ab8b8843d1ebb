"""The apps API at scale on a real controller and Redis: batch registration, pages, filters,
and the in-memory copy of the records staying what Redis holds.

No agents: the servers are written to Redis before the controller starts (and given an hour to
reconnect), so placement has somewhere to go, and loads stay deferred. Two apps are written
serving, on servers of different sites, for the filters on where an app is served.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from controller.credentials import CredentialStore
from controller.records import AppRecord, AppSpec, AppStatus, Replica, ServerRecord
from controller.redis_server import RedisServer
from controller.store import Store
from deploy.testbed import wait_until
from deploy.workload import list_all
from policies.model import Role
from understudy.wire.credentials import bearer, read_token_file
from understudy.wire.ports import free_port
from understudy.wire.protocol import ModelState

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
SITES = {"s1": "site-a", "s2": "site-a", "s3": "site-b", "s4": "site-b"}
SEEDED = {"seed-a": ("s1", "mobilenet_v3", "mobilenet_v3_large"),
          "seed-b": ("s3", "shufflenet_v2", "shufflenet_v2_x1_0")}


@dataclass
class Cluster:
    http: httpx.Client
    redis: redis.Redis
    log: Path

    def apps(self, **params: Any) -> list[dict[str, Any]]:
        return list_all(self.http, "/v1/apps", **params)


async def _seed(url: str) -> None:
    store = Store(url)
    try:
        for server_id, site in SITES.items():
            await store.put_server(ServerRecord(
                server_id=server_id, site_id=site,
                capacity={"memory_mb": 1_000_000.0, "compute": 1_000_000.0},
                http=f"http://{server_id}:8000", grpc=f"{server_id}:8001"))
        for app_id, (server_id, family, variant) in SEEDED.items():
            await store.put_app(AppRecord(
                spec=AppSpec(app_id=app_id, family=family, variant=variant),
                status=AppStatus.SERVING, serving=(server_id, variant),
                home=(server_id, variant),
                replicas=[Replica(server_id=server_id, variant=variant, role=Role.PRIMARY,
                                  state=ModelState.READY)]))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("apps-api")
    server = RedisServer(run_dir / "redis")
    server.start()
    asyncio.run(_seed(server.url))
    port = free_port()
    log = run_dir / "controller.log"
    credentials = CredentialStore(run_dir / "credentials")
    credentials.init()
    with log.open("w") as out:
        process = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "understudy.cli.main", "controller", "--port", str(port),
             "--redis-url", server.redacted_url, "--redis-password-file",
             str(server.password_file), "--credentials-dir", str(credentials.directory),
             "--startup-grace-s", "3600", "--run-dir", str(run_dir / "controller")],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                        headers=bearer(read_token_file(credentials.token_path("admin"))))

    def ready() -> bool:
        try:
            return http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("the controller", ready, 60)
        yield Cluster(http, redis.Redis.from_url(server.url, decode_responses=True), log)
    finally:
        process.terminate()
        process.wait(15)
        server.stop()


def _specs(prefix: str, count: int, **extra: Any) -> list[dict[str, Any]]:
    families = ("mobilenet_v3", "shufflenet_v2", "mnasnet")
    return [{"app_id": f"{prefix}-{i:04d}", "family": families[i % 3], "max_rate_rps": 1,
             "critical": i % 2 == 0, **extra} for i in range(count)]


def test_a_batch_registers_places_and_reports_each_app(cluster: Cluster) -> None:
    response = cluster.http.post("/v1/apps/batch", json={"apps": _specs("b", 5)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["created"], body["conflicts"]) == (5, 0)
    assert [r["outcome"] for r in body["results"]] == ["created"] * 5
    views = {a["app_id"]: a for a in cluster.apps(family="mnasnet")}
    assert {"b-0002"} <= set(views)
    for app_id in (f"b-{i:04d}" for i in range(5)):
        view = cluster.http.get(f"/v1/apps/{app_id}").json()
        # Placed: a primary loading on one of the servers (no agent answers the load).
        assert [(r["role"], r["state"]) for r in view["replicas"]] == [("primary", "loading")]
        assert view["replicas"][0]["server_id"] in SITES and view["home"] is not None

    again = cluster.http.post("/v1/apps/batch", json={"apps": _specs("b", 6)})
    assert again.status_code == 200, again.text
    outcomes = [(r["app_id"], r["outcome"]) for r in again.json()["results"]]
    assert outcomes == [(f"b-{i:04d}", "conflict") for i in range(5)] + [("b-0005", "created")]
    assert "already registered" in again.json()["results"][0]["detail"]


def test_bad_batches_are_refused_whole(cluster: Cluster) -> None:
    before = len(cluster.apps())
    http = cluster.http
    cases = [
        ({"apps": _specs("big", 1001)}, "apps"),
        ({"apps": []}, "apps"),
        ({"apps": _specs("x", 2) + [{"family": "mnasnet"}]}, "body.apps.2.app_id"),
        ({"apps": _specs("y", 2), "extra": 1}, "extra"),
        ({"apps": _specs("dup", 2) + _specs("dup", 1)}, "is also entry 0"),
        ({"apps": _specs("z", 2) + [{"app_id": "z-x", "family": "nosuchnet"}]},
         "unknown family"),
        ({"apps": [{"app_id": "p", "family": "mnasnet", "pinned_server": "s99"}]}, "s99"),
    ]
    for body, fragment in cases:
        response = http.post("/v1/apps/batch", json=body)
        assert response.status_code == 422, (body, response.text)
        assert fragment in response.text, response.text
    semantic = http.post("/v1/apps/batch", json={"apps": _specs("dup", 2) + _specs("dup", 1)})
    assert semantic.json()["errors"] == [
        {"field": "body.apps.2", "message": "app 'dup-0000' is also entry 0"}]
    anonymous = httpx.Client(base_url=str(http.base_url), timeout=10)
    assert anonymous.post("/v1/apps/batch", json={"apps": _specs("a", 1)}).status_code == 401
    assert len(cluster.apps()) == before  # nothing of any refused batch was recorded


def test_walking_the_pages_lists_every_app_once_in_id_order(cluster: Cluster) -> None:
    created = cluster.http.post("/v1/apps/batch", json={"apps": _specs("page", 250)})
    assert created.status_code == 200 and created.json()["created"] == 250
    everything = [a["app_id"] for a in cluster.http.get(
        "/v1/apps", params={"limit": 10_000}).json()]
    assert everything == sorted(everything) and len(everything) >= 252

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        response = cluster.http.get("/v1/apps", params=params)
        assert response.status_code == 200
        batch = [a["app_id"] for a in response.json()]
        seen += batch
        pages += 1
        cursor = response.headers.get("x-next-cursor")
        if cursor is None:
            assert "link" not in response.headers
            break
        assert cursor == batch[-1] and len(batch) == 7
        assert response.headers["link"] == (
            f'</v1/apps?limit=7&cursor={cursor}>; rel="next"')
    assert seen == everything and pages == -(-len(everything) // 7)
    # The default page is the first 1000; limits outside 1..10000 are refused.
    assert cluster.http.get("/v1/apps").json() == cluster.http.get(
        "/v1/apps", params={"limit": 1000}).json()
    for limit in (0, 10_001):
        assert cluster.http.get("/v1/apps", params={"limit": limit}).status_code == 422


def test_filters_select_by_status_spec_and_where_apps_are_served(cluster: Cluster) -> None:
    def ids(**params: Any) -> list[str]:
        return [a["app_id"] for a in cluster.apps(**params)]

    assert ids(server_id="s1") == ["seed-a"]
    assert ids(site="site-b") == ["seed-b"]
    assert ids(variant="shufflenet_v2_x1_0") == ["seed-b"]
    assert ids(status="serving") == ["seed-a", "seed-b"]
    pending = ids(status="pending")
    assert pending and all(a["status"] == "pending" for a in cluster.apps(status="pending"))
    critical = cluster.apps(critical="true", family="mnasnet")
    assert critical and all(a["spec"]["critical"] and a["spec"]["family"] == "mnasnet"
                            for a in critical)
    # Filtered pages are walked like the whole list: the cursor is the last id shown.
    shufflenets = ids(family="shufflenet_v2")
    first = cluster.http.get("/v1/apps", params={"family": "shufflenet_v2", "limit": 3})
    cursor = first.headers["x-next-cursor"]
    assert "family=shufflenet_v2" in first.headers["link"]
    rest = list_all(cluster.http, "/v1/apps", family="shufflenet_v2", cursor=cursor)
    assert [a["app_id"] for a in first.json()] + [a["app_id"] for a in rest] == shufflenets
    assert cluster.http.get("/v1/apps", params={"status": "nonsense"}).status_code == 422

    servers = cluster.http.get("/v1/servers", params={"site": "site-b", "limit": 1})
    assert [s["server_id"] for s in servers.json()] == ["s3"]
    assert servers.headers["x-next-cursor"] == "s3"
    assert [s["server_id"] for s in list_all(cluster.http, "/v1/servers", state="up")] == [
        "s1", "s2", "s3", "s4"]
    assert list_all(cluster.http, "/v1/servers", state="failed") == []
    assert cluster.http.get("/v1/graphs", params={"limit": 5}).json() == []


def _stored(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {k: json.loads(v) for k, v in cluster.redis.hgetall("us:apps").items()}


def test_what_the_api_shows_is_what_redis_holds_after_writes(cluster: Cluster) -> None:
    http = cluster.http
    assert http.post("/v1/apps", json={"app_id": "one", "family": "mnasnet",
                                       "max_rate_rps": 1}).status_code == 201
    assert http.delete("/v1/apps/b-0001").status_code == 204
    assert http.get("/v1/apps/b-0001").status_code == 404
    shown = {a["app_id"]: a for a in cluster.apps()}
    stored = _stored(cluster)
    assert set(shown) == set(stored) and "one" in shown and "b-0001" not in shown
    for app_id, record in stored.items():
        view = shown[app_id]
        assert (view["status"], view["replicas"], view["home"]) == (
            record["status"], record["replicas"], record["home"]), app_id
    assert int(cluster.redis.get("us:rev")) > 0


def test_a_redis_that_lost_writes_is_read_again(cluster: Cluster) -> None:
    # As if Redis restarted without its last write: the record and the revision go back.
    app_id = "b-0003"
    assert cluster.http.get(f"/v1/apps/{app_id}").status_code == 200
    cluster.redis.hdel("us:apps", app_id)
    cluster.redis.decr("us:rev")
    # The convergence loop checks the revision every second and reloads on a mismatch.
    wait_until("the controller to reload", lambda: cluster.http.get(
        f"/v1/apps/{app_id}").status_code == 404, 15, 0.2)
    assert set(a["app_id"] for a in cluster.apps()) == set(_stored(cluster))
    assert "reloading" in cluster.log.read_text()
    # And writes go on from the revision Redis holds.
    assert cluster.http.post("/v1/apps", json={"app_id": "after-reload", "family": "mnasnet",
                                               "max_rate_rps": 1}).status_code == 201
    assert "after-reload" in _stored(cluster)
    assert cluster.http.get("/v1/apps/after-reload").json()["replicas"]


def test_metrics_tell_when_the_process_started(cluster: Cluster) -> None:
    text = cluster.http.get("/metrics").text
    started = [line for line in text.splitlines()
               if line.startswith("process_start_time_seconds ")]
    assert len(started) == 1 and float(started[0].split()[1]) > 1.6e9
    pending = [line for line in text.splitlines()
               if line.startswith('understudy_apps{status="pending"}')]
    assert pending and float(pending[0].split()[1]) >= 250
