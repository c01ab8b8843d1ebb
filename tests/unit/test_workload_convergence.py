"""``deploy.workload.convergence_gaps``: what the testbed waits for, and what it reports."""

from __future__ import annotations

from typing import Any

import httpx

from deploy.workload import converged, convergence_gaps


def _client(apps: list[dict[str, Any]], plan: list[dict[str, str]] | None) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/apps":
            return httpx.Response(200, json=apps)
        if plan is None:
            return httpx.Response(404, json={"detail": "no plan yet"})
        return httpx.Response(200, json={"assignments": plan})

    return httpx.Client(base_url="http://controller", transport=httpx.MockTransport(answer))


def _app(app_id: str, status: str = "serving", critical: bool = True,
         replicas: list[dict[str, str]] | None = None,
         backups: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"app_id": app_id, "status": status, "spec": {"critical": critical},
            "replicas": replicas or [], "backups": backups or []}


def test_a_converged_cluster_has_no_gaps() -> None:
    backup = {"server_id": "s2", "variant": "v_small"}
    apps = [_app("a", replicas=[{"server_id": "s1", "variant": "v", "role": "primary",
                                 "state": "ready"}], backups=[backup])]
    http = _client(apps, [{"app_id": "a", **backup}])
    assert convergence_gaps(http) == [] and converged(http)


def test_each_gap_is_named() -> None:
    apps = [_app("a", status="degraded",
                 replicas=[{"server_id": "s3", "variant": "v", "role": "warm",
                            "state": "unloading"}],
                 backups=[{"server_id": "s4", "variant": "v"}])]
    gaps = convergence_gaps(_client(apps, [{"app_id": "a", "server_id": "s2",
                                            "variant": "v_small"}]))
    assert gaps == ["a is degraded", "a/v on s3 (warm) is unloading",
                    "planned backup a/v_small on s2 is missing",
                    "backup a/v on s4 is not in the plan"]
    assert convergence_gaps(_client(apps[:0] + [_app("b")], None)) == [
        "b is critical and no warm plan exists"]
