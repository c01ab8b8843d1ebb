"""A testbed with no generated apps gets real server capacity (issue 22, Build item 5)."""

from __future__ import annotations

import os

import pytest

from deploy.topology import make_topology
from deploy.workload import generate_workload, machine_capacity


def test_no_apps_gives_each_server_a_share_of_the_machine_not_nothing() -> None:
    topology = make_topology(servers=4, sites=2, apps=0)
    workload = generate_workload(topology)
    assert workload.specs == ()
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    assert workload.capacity["memory_mb"] * 4 == pytest.approx(total_mb)
    assert workload.capacity["compute"] == 100.0
    # The agents' --capacity and the generated cluster say the same.
    for server in workload.sized(topology).servers:
        assert server.capacity == workload.capacity
    assert all(dict(s.capacity) == workload.capacity for s in workload.cluster.servers)


def test_apps_still_size_the_servers_for_the_generated_workload() -> None:
    workload = generate_workload(make_topology(servers=4, sites=2, apps=8))
    assert len(workload.specs) == 8
    assert workload.capacity != machine_capacity(4)
    assert 0 < workload.capacity["memory_mb"] < machine_capacity(4)["memory_mb"]
