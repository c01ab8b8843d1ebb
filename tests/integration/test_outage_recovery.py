"""Apps in an outage on real processes: when every server is lost, the first one back brings
the apps back as a failover would (the smallest variants at once, the best that fits after),
not only the apps whose own variant fits there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology

pytestmark = pytest.mark.timeout(600)
FAMILIES = ("mobilenet_v3",)


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = make_topology(servers=2, sites=1, apps=4, critical_fraction=0.0, headroom=0.3,
                             families=FAMILIES)
    bed = Testbed.up(tmp_path_factory.mktemp("outage-bed"), topology, seed=5, scale=0.05,
                     clients=False, timeout_s=300)
    try:
        yield bed
    finally:
        bed.down()


def test_the_first_server_back_serves_every_app_small_first(testbed: Testbed) -> None:
    before = testbed.apps_by_id()
    homes = {a: v["serving"]["variant"] for a, v in before.items()}
    servers = [s["server_id"] for s in testbed.servers()]
    testbed.fail(servers)
    wait_until("every app to be down", lambda: all(
        v["serving"] is None for v in testbed.apps_by_id().values()), 60, 0.1)
    back = servers[0]
    testbed.start_agent(back)
    wait_until("every app to serve from the server back", lambda: all(
        v["serving"] is not None for v in testbed.apps_by_id().values()), 120, 0.25)
    after = testbed.apps_by_id()
    assert {v["serving"]["server_id"] for v in after.values()} == {back}
    # The server holds half the apps at their own variant: the rest came back smaller,
    # progressively (an interim, then the best that fits), not left waiting for room.
    smaller = [a for a, v in after.items() if v["serving"]["variant"] != homes[a]]
    assert smaller, after
    events = testbed.http.get("/v1/events", params={"limit": 10000}).json()
    for app_id in smaller:
        assert after[app_id]["status"] == "degraded", after[app_id]
        kinds = [e["kind"] for e in events if e["app_id"] == app_id]
        assert "unrecoverable" in kinds or "unplaced" in kinds, kinds  # it was down first
