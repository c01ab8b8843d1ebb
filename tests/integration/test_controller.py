"""The controller on real processes: Redis, controller, agents with real Triton, SDK clients."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology
from model_repo.runtime import runtime_stats
from understudy.client import UnderstudyClient

pytestmark = pytest.mark.timeout(600)
FAMILIES = ("mobilenet_v3", "shufflenet_v2", "mnasnet", "efficientnet")


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(servers=4, sites=2, apps=8, critical_fraction=0.5, headroom=0.3,
                             families=FAMILIES)
    bed = Testbed.up(tmp_path_factory.mktemp("testbed"), topology, seed=3, scale=0.05,
                     clients=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def test_bad_and_unauthorised_requests_get_clear_4xx(testbed: Testbed) -> None:
    url = testbed.state.controller_url
    anonymous = httpx.Client(base_url=url, timeout=10)
    spec = {"app_id": "x1", "family": "efficientnet"}
    assert anonymous.post("/v1/apps", json=spec).status_code == 401
    assert anonymous.patch("/v1/config", json={"alpha": 0.2}).status_code == 401
    assert anonymous.post("/v1/servers/s1/drain").status_code == 401
    wrong = httpx.Client(base_url=url, timeout=10, headers={"Authorization": "Bearer nope"})
    assert wrong.post("/v1/apps", json=spec).status_code == 401
    http = testbed.http
    cases = [
        ({"family": "efficientnet"}, 422, "app_id"),
        ({"app_id": "x2", "family": "nosuchnet"}, 422, "unknown family"),
        ({"app_id": "x3", "family": "efficientnet", "variant": "resnet50"}, 422, "no variant"),
        ({"app_id": "bad__id", "family": "efficientnet"}, 422, "app_id"),
        ({"app_id": "x4", "family": "efficientnet", "max_rate_rps": -1}, 422, "max_rate_rps"),
        ({"app_id": "x5", "family": "efficientnet", "pinned_server": "s99"}, 422, "s99"),
        ({"app_id": "x6", "family": "efficientnet", "surprise": 1}, 422, "surprise"),
    ]
    for body, status, fragment in cases:
        response = http.post("/v1/apps", json=body)
        assert response.status_code == status, (body, response.text)
        assert fragment in response.text
    existing = next(iter(testbed.apps_by_id()))
    duplicate = http.post("/v1/apps", json={"app_id": existing, "family": "mobilenet_v3",
                                             "max_rate_rps": 1})
    assert duplicate.status_code == 409 and "already registered" in duplicate.text
    assert http.get("/v1/apps/none-such").status_code == 404
    assert http.post("/v1/servers/s99/drain").status_code == 404
    assert http.patch("/v1/config", json={}).status_code == 422
    assert http.patch("/v1/config", json={"alpha": 2}).status_code == 422
    assert http.get("/v1/events", params={"since": -1}).status_code == 422
    huge = http.post("/v1/apps", json={"app_id": "x7", "family": "efficientnet",
                                       "max_rate_rps": 10000})
    assert huge.status_code == 422 and "more than any server" in huge.text
    assert http.get("/openapi.json").status_code == 200


def test_agent_without_token_is_refused(testbed: Testbed) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = testbed.state.controller_url.replace("http", "ws") + "/v1/agents/connect"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, open_timeout=5)
    assert refused.value.response.status_code == 401


def test_warm_backups_are_where_the_plan_says(testbed: Testbed) -> None:
    def agreed() -> tuple[dict, dict, set, set] | None:
        plan = testbed.http.get("/v1/plan").json()
        apps = testbed.apps_by_id()
        planned = {(p["app_id"], p["server_id"], p["variant"]) for p in plan["assignments"]}
        loaded = {(a["app_id"], b["server_id"], b["variant"]) for a in apps.values()
                  for b in a["backups"] if b["state"] == "ready"}
        return (plan, apps, planned, loaded) if planned and planned == loaded else None

    # The testbed may converge on a plan solved before the last app served (an empty plan has
    # nothing to wait for); the re-plan that follows (debounced) and its loads come after.
    plan, apps, planned, loaded = wait_until("the warm backups the plan names", agreed, 30, 0.1)
    assert planned == loaded and planned
    for app_id, server_id, _ in planned:
        assert apps[app_id]["spec"]["critical"]
        assert apps[app_id]["serving"]["server_id"] != server_id  # primary independence
    covered = {a for a, _, _ in planned} | {u["app_id"] for u in plan["uncovered"]}
    assert covered == {a for a, v in apps.items() if v["spec"]["critical"]}


def test_every_server_caches_the_interim_variants_before_any_failure(testbed: Testbed) -> None:
    from agent.repository import CACHE_DIR
    from model_repo.profiles import load_families

    families = load_families()
    in_use = {a["spec"]["family"] for a in testbed.apps_by_id().values()}
    smallest = {families[f].variants[0].name for f in in_use}
    run_dir = Path(testbed.state.run_dir)

    def cached(server_id: str) -> set[str]:
        cache = run_dir / "agents" / server_id / CACHE_DIR
        return {p.parent.name for p in cache.glob("*/weights.pt.sha256")}

    servers = [s["server_id"] for s in testbed.servers()]
    wait_until("interim weights on every server", lambda: all(
        smallest <= cached(s) for s in servers), 60, 0.2)


def test_client_gets_the_serving_endpoint_and_the_variant_answering(testbed: Testbed) -> None:
    app_id, app = next(iter(testbed.apps_by_id().items()))
    with UnderstudyClient(testbed.state.controller_url, app_id,
                          token_file=testbed.token_file("client")) as client:
        result = client.infer(np.zeros((1, 3, 224, 224), dtype=np.float32))
    assert result.logits.shape == (1, 1000)
    assert result.record.variant == app["serving"]["variant"]
    assert result.record.server_id == app["serving"]["server_id"]


class _Load:
    """SDK clients sending requests continuously for some apps."""

    def __init__(self, bed: Testbed, app_ids: list[str]) -> None:
        self.stop = threading.Event()
        self.clients = [UnderstudyClient(bed.state.controller_url, a,
                                         token_file=bed.token_file("client")).start()
                        for a in app_ids]
        image = np.zeros((1, 3, 224, 224), dtype=np.float32)
        self.threads = [threading.Thread(target=self._run, args=(c, image), daemon=True)
                        for c in self.clients]
        for thread in self.threads:
            thread.start()

    def _run(self, client: UnderstudyClient, image: np.ndarray) -> None:
        while not self.stop.is_set():
            client.infer(image, timeout_s=90)
            self.stop.wait(0.1)

    def finish(self) -> list[Any]:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
        for client in self.clients:
            client.close()
        return [r for c in self.clients for r in c.records]


def _recovered(bed: Testbed, failed: set[str], app_ids: list[str]) -> bool:
    apps = bed.apps_by_id()
    return all(apps[a]["status"] in ("serving", "degraded") and apps[a]["serving"]
               and apps[a]["serving"]["server_id"] not in failed
               and all(r["state"] == "ready" for r in apps[a]["replicas"]) for a in app_ids)


def test_killing_a_server_recovers_all_its_apps_without_losing_requests(
        testbed: Testbed) -> None:
    apps = testbed.apps_by_id()
    by_server: dict[str, list[str]] = {}
    for app_id, app in apps.items():
        by_server.setdefault(app["serving"]["server_id"], []).append(app_id)
    backed = {a for a, v in apps.items() if v["backups"]}
    victim = max(by_server, key=lambda s: (len(set(by_server[s]) & backed), len(by_server[s])))
    affected = by_server[victim]
    load = _Load(testbed, affected)
    time.sleep(1.0)
    since = testbed.http.get("/v1/events", params={"limit": 10000}).json()[-1]["seq"]
    testbed.fail([victim])
    wait_until("affected apps to recover", lambda: _recovered(testbed, {victim}, affected),
               180, 0.2)
    records = load.finish()
    events = testbed.http.get("/v1/events", params={"since": since}).json()
    for app_id in affected:
        kinds = [e["kind"] for e in events if e["app_id"] == app_id]
        if app_id in backed:
            assert kinds[0] == "warm_switch", kinds
        else:
            assert "interim_serving" in kinds or "serving" in kinds, kinds
            final = [e for e in events if e["app_id"] == app_id and e["kind"] in
                     ("upgraded", "serving")]
            assert final, kinds
            # Each load that ended or shortened the outage says how long the agent took.
            loaded = [e for e in events if e["app_id"] == app_id and e["kind"] in
                      ("interim_serving", "upgraded", "serving")]
            assert all(e["load_s"] is not None and 0 < e["load_s"] < 60 for e in loaded), loaded
        if app_id in backed:
            warm = next(e for e in events if e["app_id"] == app_id)
            assert warm["load_s"] is None  # loaded long before this failure
    assert records and all(r.ok for r in records)  # no request lost across the failover
    answered_after = [r for r in records if r.sent_at > testbed.state.failures[-1]["at"] + 5]
    assert all(r.server_id != victim for r in answered_after)


def test_redis_restart_loses_nothing(testbed: Testbed) -> None:
    before_apps = testbed.apps_by_id()
    before_events = testbed.http.get("/v1/events", params={"limit": 10000}).json()
    testbed.kill_process("redis", signal.SIGTERM)
    info = testbed.state.processes["redis"]
    from deploy.testbed import _spawn

    _spawn(testbed.state, "redis", info.args)
    wait_until("the controller to be ready again",
               lambda: testbed.http.get("/readyz").status_code == 200, 30, 0.1)
    after_apps = testbed.apps_by_id()
    assert {a: (v["serving"], v["status"]) for a, v in after_apps.items()} == \
        {a: (v["serving"], v["status"]) for a, v in before_apps.items()}
    after_events = testbed.http.get("/v1/events", params={"limit": 10000}).json()
    assert after_events[:len(before_events)] == before_events
    response = testbed.http.post("/v1/apps", json={"app_id": "after-redis",
                                                   "family": "mobilenet_v3"},
                                 params={"wait": "true"}, timeout=120)
    assert response.status_code == 201, response.text
    testbed.http.delete("/v1/apps/after-redis")


def _all_back_and_busiest(bed: Testbed) -> tuple[str, list[str]]:
    """Restart the agents of failed servers, wait until converged; returns the server serving
    the most apps, and those apps."""
    for server in [s["server_id"] for s in bed.servers() if s["state"] == "failed"]:
        bed.start_agent(server)
    wait_until("every server back", lambda: all(
        s["state"] == "up" and s["connected"] for s in bed.servers()), 120, 0.25)
    # Converged means every app serves its home *variant*, which it may do on the server it
    # failed over to until its fail-back home completes: wait for the home servers too, or
    # the busiest server picked now loses apps to their fail-back under the test.
    wait_until("every app back on its home server", lambda: all(
        a["home"] is None or (a["serving"] is not None and
                              [a["serving"]["server_id"], a["serving"]["variant"]] == a["home"])
        for a in bed.apps()), 120, 0.25)
    bed.wait_converged(180)
    apps = bed.apps_by_id()
    busiest = max({a["serving"]["server_id"] for a in apps.values()},
                  key=lambda s: sum(a["serving"]["server_id"] == s for a in apps.values()))
    return busiest, [a for a, v in apps.items() if v["serving"]["server_id"] == busiest]


def test_controller_killed_mid_failover_converges(testbed: Testbed) -> None:
    victim, affected = _all_back_and_busiest(testbed)
    testbed.fail([victim])
    time.sleep(0.15)  # the failover is under way
    testbed.kill_process("controller", signal.SIGKILL)
    testbed.start_controller()
    wait_until("affected apps to recover after the restart",
               lambda: _recovered(testbed, {victim}, affected), 180, 0.25)
    testbed.wait_converged(180)
    servers = {s["server_id"]: s for s in testbed.servers()}
    assert servers[victim]["state"] == "failed"
    for app in testbed.apps_by_id().values():
        assert app["serving"] and app["serving"]["server_id"] != victim


def test_a_server_killed_while_the_controller_is_down_is_declared_after_the_restart(
        testbed: Testbed) -> None:
    """It never says hello to the new controller: declared when its start-up grace ends."""
    victim, affected = _all_back_and_busiest(testbed)
    testbed.kill_process("controller", signal.SIGKILL)
    testbed.fail([victim])
    testbed.start_controller()
    restarted = time.monotonic()
    wait_until("the silent server to be declared failed", lambda: testbed.http.get(
        f"/v1/servers/{victim}").json()["state"] == "failed", 30, 0.1)
    # The controller's start-up grace (3 s by default) and a little slack, not forever.
    assert time.monotonic() - restarted < 15
    wait_until("its apps to recover", lambda: _recovered(testbed, {victim}, affected), 180, 0.25)
    testbed.wait_converged(180)


def _workers(bed: Testbed, server_id: str) -> dict[str, int]:
    """Model name -> pid of its torch-runtime worker on one server (a reload changes the pid)."""
    sock = Path(bed.state.run_dir) / "agents" / server_id / "triton" / "torch-runtime.sock"
    return {w["model"]: w["pid"] for w in runtime_stats(sock)}


def test_a_false_alarm_is_taken_back_without_reloading(testbed: Testbed) -> None:
    victim, affected = _all_back_and_busiest(testbed)
    homes = {a: v["serving"]["variant"] for a, v in testbed.apps_by_id().items() if a in affected}
    workers = _workers(testbed, victim)
    since = testbed.http.get("/v1/events", params={"limit": 10000}).json()[-1]["seq"]
    agent = testbed.state.processes[f"agent-{victim}"].pid
    # A stopped agent: heartbeats stop but its connection stays open and its Triton keeps
    # every model loaded, exactly what a late server looks like to the controller.
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_until("the silent server to be declared failed", lambda: testbed.http.get(
            f"/v1/servers/{victim}").json()["state"] == "failed", 20, 0.01)
        wait_until("its apps to be moved away", lambda: all(
            (v["serving"] or {}).get("server_id") != victim
            for a, v in testbed.apps_by_id().items() if a in affected), 20, 0.02)
    finally:
        os.kill(agent, signal.SIGCONT)
    wait_until("the apps to be back on their home models", lambda: all(
        v["serving"] and (v["serving"]["server_id"], v["serving"]["variant"]) ==
        (victim, homes[a]) and v["status"] == "serving"
        for a, v in testbed.apps_by_id().items() if a in affected), 60, 0.1)
    events = testbed.http.get("/v1/events", params={"since": since}).json()
    for app_id in affected:
        # A warm-switched app fails back; one whose interim was still loading simply serves.
        kinds = [e["kind"] for e in events if e["app_id"] == app_id]
        assert "failback" in kinds or "serving" in kinds, kinds
    # The same runtime workers serve: the home models were never unloaded nor loaded again.
    after = _workers(testbed, victim)
    for app_id, variant in homes.items():
        assert after[f"{app_id}__{variant}"] == workers[f"{app_id}__{variant}"]
    metrics = testbed.http.get("/metrics").text
    assert 'understudy_events_total{kind="take_back"}' in metrics
    testbed.wait_converged(180)


def _triton(bed: Testbed, server_id: str) -> Any:
    import tritonclient.http as httpclient

    http = next(s["http"] for s in bed.servers() if s["server_id"] == server_id)
    return httpclient.InferenceServerClient(http.removeprefix("http://"))


def _replica_state(bed: Testbed, app_id: str, server_id: str, variant: str) -> str | None:
    return next((r["state"] for r in bed.apps_by_id()[app_id]["replicas"]
                 if (r["server_id"], r["variant"]) == (server_id, variant)), None)


def test_the_reconciler_repairs_what_no_event_told_the_controller(testbed: Testbed) -> None:
    """Behind the agents' backs: a model loaded that no record wants, a backup unloaded."""
    testbed.wait_converged(180)
    apps = testbed.apps_by_id()
    app_id, served = next((a, v["serving"]) for a, v in sorted(apps.items()) if v["serving"])
    server_id, variant = served["server_id"], served["variant"]
    backup_app, backup = next(
        (a, r) for a, v in sorted(apps.items()) for r in v["replicas"]
        if r["role"] == "warm" and r["state"] == "ready")
    # A stray: a copy of a served model under a name no record has, loaded into Triton.
    repository = Path(testbed.state.run_dir) / "agents" / server_id / "repository"
    ghost = f"ghost__{variant}"
    source = repository / f"{app_id}__{variant}"
    (repository / ghost / "1").mkdir(parents=True)
    for path in source.rglob("*"):
        if path.is_file():
            text = path.read_bytes().replace(f'"{app_id}__{variant}"'.encode(),
                                             f'"{ghost}"'.encode())
            (repository / ghost / path.relative_to(source)).write_bytes(text)
    triton = _triton(testbed, server_id)
    triton.load_model(ghost, headers=testbed.triton_control_headers(server_id))
    assert triton.is_model_ready(ghost)
    # A lost model: a warm backup unloaded from its Triton, the records still say ready.
    lost = f"{backup_app}__{backup['variant']}"
    backup_triton = _triton(testbed, backup["server_id"])
    backup_triton.unload_model(lost, headers=testbed.triton_control_headers(backup["server_id"]))
    wait_until("the lost backup to be gone", lambda: not backup_triton.is_model_ready(lost),
               30, 0.1)
    wait_until("the stray to be unloaded", lambda: not triton.is_model_ready(ghost), 60, 0.2)
    wait_until("the lost backup to be loaded again", lambda: backup_triton.is_model_ready(
        lost) and _replica_state(testbed, backup_app, backup["server_id"],
                                 backup["variant"]) == "ready", 60, 0.2)
    metrics = testbed.http.get("/metrics").text
    assert 'understudy_repairs_total{kind="stray"} 1.0' in metrics
    assert 'understudy_repairs_total{kind="missing"} 1.0' in metrics
    # The served app was never touched.
    assert testbed.apps_by_id()[app_id]["serving"] == served
    testbed.wait_converged(180)


def test_drain_moves_every_app_off_without_losing_requests(testbed: Testbed) -> None:
    target, moved = _all_back_and_busiest(testbed)
    load = _Load(testbed, moved)
    time.sleep(0.5)
    response = testbed.http.post(f"/v1/servers/{target}/drain")
    assert response.status_code == 202 and response.json()["state"] == "draining"
    wait_until("the drain to finish", lambda: testbed.http.get(
        f"/v1/servers/{target}").json()["state"] == "drained", 180, 0.25)
    records = load.finish()
    assert records and all(r.ok for r in records)
    for app in testbed.apps_by_id().values():
        assert app["serving"]["server_id"] != target
        assert all(r["server_id"] != target for r in app["replicas"])
    again = testbed.http.post(f"/v1/servers/{target}/drain")
    assert again.status_code == 409
