"""``understudy testbed report`` shows what the clients saw of a server kill.

A small testbed (Redis, the controller, three agents with real Triton, the testbed's gateway)
with a client per app through the gateway; the server serving the most apps is SIGKILLed. The
report, run as its own process, must list every affected app's gateway client with its
client-observed outage and count every request the clients sent, none lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.inject import kill
from deploy.report import load_requests, serving_on
from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology

pytestmark = pytest.mark.timeout(420)
REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("mobilenet_v3", "shufflenet_v2")


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(servers=3, sites=3, apps=3, critical_fraction=1.0, headroom=0.5,
                             families=FAMILIES)
    bed = Testbed.up(tmp_path_factory.mktemp("outage-bed"), topology, seed=5, scale=0.05,
                     client_rate=5.0, client_via="gateway", timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def _answered(bed: Testbed, app_id: str, after: float = 0.0, not_by: str = "") -> bool:
    return any(r["app_id"] == app_id and r["ok"] and r["done_at"] > after
               and r["server_id"] != not_by
               for r in load_requests(Path(bed.state.run_dir) / "requests"))


def test_report_shows_the_client_observed_outage_of_a_kill(testbed: Testbed) -> None:
    assert testbed.state.gateway_url
    apps = testbed.apps()
    for app in apps:
        wait_until(f"{app['app_id']}'s client answered", lambda a=app["app_id"]: _answered(
            testbed, a), 60, 0.2)
    counts: dict[str, int] = {}
    for app in apps:
        server = app["serving"]["server_id"]
        counts[server] = counts.get(server, 0) + 1
    victim = max(sorted(counts), key=lambda s: counts[s])
    affected = serving_on(apps, [victim])
    at = kill(testbed, [victim])
    for app_id in affected:
        wait_until(f"{app_id} answered from elsewhere", lambda a=app_id: _answered(
            testbed, a, at, victim), 90, 0.2)

    done = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "--log-level", "WARNING", "testbed",
         "report", "--json", "--run-dir", testbed.state.run_dir],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "client-observed" in done.stdout
    for app_id in affected:
        assert any(line.split()[1:2] == [app_id] and "gateway@5" in line
                   for line in done.stdout.splitlines()), done.stdout
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    sent = figures["client_requests"]
    assert sent["requests"] > 0 and sent["lost_requests"] == 0
    assert sent["requests"] == sent["ok"] + sent["errors_returned"] + sent["lost_requests"]
    report = json.loads((Path(testbed.state.run_dir) / "report.json").read_text())
    seen = {o["app_id"]: o for o in report["client_outages"] if o["client"] == "gateway@5"}
    assert sorted(seen) == sorted(affected)
    for outage in seen.values():
        assert outage["outage_ms"] is not None and outage["outage_ms"] > 0
        assert outage["longest_gap_ms"] >= 0 and outage["lost"] == 0
        assert outage["answered_by"].split("/")[0] != victim
