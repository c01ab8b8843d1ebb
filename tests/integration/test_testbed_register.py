"""``understudy testbed register`` (the compose ``register`` job) against a real controller.

Redis, the controller and two agents with real Triton start through the testbed with the apps
left unregistered; the command, run as its own process as compose runs it, must register exactly
the apps ``testbed up`` would, be idempotent, and refuse a conflicting or unauthorised run. Its
credential comes from ``--token-file``, ``$UNDERSTUDY_TOKEN_FILE`` or ``$UNDERSTUDY_TOKEN``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.testbed import Testbed
from deploy.topology import make_topology
from deploy.workload import generate_workload

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
SERVERS, SITES, APPS, HEADROOM, CRITICAL, SEED = 2, 2, 3, 0.3, 0.5, 4


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(SERVERS, SITES, APPS, CRITICAL, HEADROOM)
    bed = Testbed.up(tmp_path_factory.mktemp("registerbed"), topology, seed=SEED, scale=0.05,
                     clients=False, register=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def _register(bed: Testbed, *extra: str, env_vars: dict[str, str] | None = None,
              seed: int = SEED) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("UNDERSTUDY_TOKEN", "UNDERSTUDY_TOKEN_FILE")}
    env.update(env_vars or {})
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "testbed", "register",
         "--controller-url", bed.state.controller_url, "--servers", str(SERVERS),
         "--sites", str(SITES), "--apps", str(APPS), "--headroom", str(HEADROOM),
         "--critical", str(CRITICAL), "--seed", str(seed), "--timeout-s", "240", *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False)


def test_register_creates_the_testbeds_apps_once(testbed: Testbed) -> None:
    assert testbed.apps() == []
    refused = _register(testbed)  # no credential: the controller answers 401
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "401" in refused.stderr and testbed.apps() == []
    reader = _register(testbed, "--token-file", str(testbed.token_file("read")))
    assert reader.returncode == 1 and "403" in reader.stderr and testbed.apps() == []

    first = _register(testbed, "--token-file", str(testbed.token_file("admin")))
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{APPS} apps registered, 0 already there" in first.stdout
    workload = generate_workload(make_topology(SERVERS, SITES, APPS, CRITICAL, HEADROOM),
                                 seed=SEED)
    apps = testbed.apps_by_id()
    assert sorted(apps) == sorted(workload.app_ids)
    for spec in workload.specs:
        assert {k: apps[spec["app_id"]]["spec"][k] for k in spec} == spec
        assert apps[spec["app_id"]]["status"] == "serving"
    servers = {s["server_id"]: s for s in testbed.servers()}
    assert sorted(servers) == ["s1", "s2"]
    for server in servers.values():  # the agents were sized for these apps, as testbed up does
        assert server["capacity"] == pytest.approx(workload.capacity)

    again = _register(testbed, env_vars={
        "UNDERSTUDY_TOKEN_FILE": str(testbed.token_file("admin"))})
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"0 apps registered, {APPS} already there" in again.stdout
    assert sorted(a["app_id"] for a in testbed.apps()) == sorted(workload.app_ids)

    other = _register(testbed, "--no-wait", env_vars={"UNDERSTUDY_TOKEN": testbed.token("admin")},
                      seed=SEED + 1)
    assert other.returncode == 1
    assert "registered with another spec" in other.stderr
