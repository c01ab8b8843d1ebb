"""The simulator's cluster generator (sim/cluster.py) and failure scenarios (sim/runner.py)."""

from __future__ import annotations

import math

import pytest

from model_repo.profiles import load_families
from policies.resources import COMPUTE, MEMORY_MB
from sim.cluster import (
    A2_CAPACITY,
    ClusterSpec,
    build_cluster,
    family_class,
    mix_families,
    priority_order,
    utilisation,
    with_critical,
    with_headroom,
)
from sim.runner import each_server, site_failures

FAMILIES = load_families()


def test_classes_follow_the_papers_examples() -> None:
    assert family_class(FAMILIES["mobilenet_v3"]) == "small"  # paper: Mobilenet, 12 MB
    assert family_class(FAMILIES["convnext"]) == "large"      # paper: ConvNext, 648 MB
    assert family_class(FAMILIES["alexnet"]) is None          # one variant: no trade-off
    assert mix_families(FAMILIES, "large") == ("convnext", "regnet_y", "vit")
    assert set(mix_families(FAMILIES, "small")) == {"mnasnet", "mobilenet_v3", "shufflenet_v2",
                                                    "squeezenet", "vgg"}
    assert len(mix_families(FAMILIES, "all")) == 22
    classified = sum(len(mix_families(FAMILIES, c)) for c in ("small", "medium", "large"))
    assert classified == 17  # the multi-variant families
    with pytest.raises(ValueError, match="unknown mix"):
        mix_families(FAMILIES, "huge")


def test_paper_sized_cluster_is_deterministic() -> None:
    spec = ClusterSpec(servers=20, sites=4, apps=100, seed=3)
    a, b = build_cluster(FAMILIES, spec), build_cluster(FAMILIES, spec)
    assert a == b and a.placements == b.placements
    assert all(s.capacity == A2_CAPACITY for s in a.servers)
    assert len(a.primary_by_app) == 100 and sum(x.critical for x in a.apps) == 50
    assert [sum(s.site_id == site.site_id for s in a.servers) for site in a.sites] == [5] * 4
    assert build_cluster(FAMILIES, ClusterSpec(servers=20, sites=4, apps=100, seed=4)) != a


def test_fill_to_target_utilisation() -> None:
    spec = ClusterSpec(servers=10, sites=2, apps=None, target_utilisation=0.4, mix="large")
    snap = build_cluster(FAMILIES, spec)
    used = utilisation(snap)
    assert max(used.values()) <= 0.4 + 1e-9
    assert max(used.values()) > 0.3  # stopped near the target, not far below
    assert {a.family for a in snap.apps} <= {"convnext", "regnet_y", "vit"}
    with pytest.raises(ValueError, match="exactly one"):
        ClusterSpec(apps=10, target_utilisation=0.5)


def test_headroom_is_usable_backup_capacity_on_top_of_the_primaries() -> None:
    base = build_cluster(FAMILIES, ClusterSpec(servers=10, sites=2, apps=40, seed=1))
    snap = with_headroom(base, 0.1)
    for server in snap.servers:
        used = base.used[server.server_id]
        for r in (MEMORY_MB, COMPUTE):
            expected = min(A2_CAPACITY[r], used[r] + 0.1 * A2_CAPACITY[r])
            assert server.capacity[r] == pytest.approx(expected)
            assert snap.free[server.server_id][r] <= 0.1 * A2_CAPACITY[r] + 1e-6
    assert snap.placements == base.placements


def test_k_sweep_grows_one_nested_set() -> None:
    snap = build_cluster(FAMILIES, ClusterSpec(servers=10, sites=2, apps=50, seed=2))
    order = priority_order(snap, 2)
    sets = [{a.app_id for a in with_critical(snap, order, k).apps if a.critical}
            for k in (0.0, 0.2, 0.6, 1.0)]
    assert [len(s) for s in sets] == [0, 10, 30, 50]
    assert sets[0] <= sets[1] <= sets[2] <= sets[3]


def test_failure_scenarios() -> None:
    snap = build_cluster(FAMILIES, ClusterSpec(servers=20, sites=10, apps=60, seed=0))
    every = each_server(snap)
    assert all(len(s.failed) == 1 for s in every)
    assert {s.failed[0] for s in every} == {p.server_id for p in snap.primary_by_app.values()}
    sample = each_server(snap, limit=5, seed=1)
    assert len(sample) == 5 and sample == each_server(snap, limit=5, seed=1)
    five = site_failures(snap, 5, 10, seed=0)
    assert len(five) == 10 and len({s.name for s in five}) == 10
    assert all(len(s.failed) == 10 for s in five)  # 5 sites x 2 servers
    assert len(site_failures(snap, 9, 100, seed=0)) == math.comb(10, 9)
