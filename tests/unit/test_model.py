"""Data model validation, primary worst-fit placement and the cluster generator."""

from __future__ import annotations

import pytest

from model_repo.profiles import load_families
from policies.errors import (
    CapacityExceededError,
    DuplicateIdError,
    InvalidInputError,
    NegativeCapacityError,
    UnknownFamilyError,
    UnknownReferenceError,
    VariantTooLargeError,
)
from policies.model import Role, Site, Variant, accuracy_reduction
from policies.primary import place_primaries
from policies.resources import Resources
from sim.generator import generate_cluster
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement

FAM = make_family("fam", [("small", 100, 0.8), ("large", 500, 1.0)], compute_per_rps=1.0,
                  latency_ms=[2.0, 8.0])


def test_family_orders_variants_by_memory_and_finds_the_best():
    fam = make_family("f", [("b", 300, 1.0), ("a", 100, 0.7)])
    assert [v.name for v in fam.variants] == ["a", "b"]
    assert fam.smallest.name == "a" and fam.largest.name == "b" and fam.most_accurate.name == "b"
    assert fam.index("b") == 1
    with pytest.raises(UnknownReferenceError):
        fam.variant("zzz")


@pytest.mark.parametrize("build, error", [
    (lambda: make_family("f", [("a", 100, 1.0), ("a", 200, 0.9)]), DuplicateIdError),
    (lambda: make_family("f", [("a", -5, 1.0)]), NegativeCapacityError),
    (lambda: make_family("f", [("a", 100, 1.5)]), InvalidInputError),
    (lambda: make_server("s", -1), NegativeCapacityError),
    (lambda: make_server("s", 100, speed=0), InvalidInputError),
    (lambda: Resources(memory_mb=float("nan")), NegativeCapacityError),
    (lambda: make_app("", "fam"), InvalidInputError),
    (lambda: make_app("a", "fam", max_rate_rps=0), InvalidInputError),
    (lambda: make_app("a", "fam", warm_replicas=-1), InvalidInputError),
    (lambda: Variant("v", "f", 1.0, Resources(memory_mb=10), latency_ms={"a2": 1.0}),
     InvalidInputError),
])
def test_invalid_entities_are_rejected(build, error):
    with pytest.raises(error):
        build()


def test_snapshot_rejects_inconsistent_input():
    servers = [make_server("s0", 1000), make_server("s1", 1000)]
    with pytest.raises(UnknownFamilyError, match="unknown family 'nope'"):
        make_snapshot([FAM], servers, [make_app("a", "nope")])
    with pytest.raises(DuplicateIdError):
        make_snapshot([FAM], servers + [make_server("s0", 5)], [])
    with pytest.raises(DuplicateIdError):
        make_snapshot([FAM], servers, [make_app("a", FAM), make_app("a", FAM)])
    with pytest.raises(VariantTooLargeError, match="more than any server"):
        make_snapshot([FAM], [make_server("s0", 400)], [make_app("a", FAM)])
    with pytest.raises(VariantTooLargeError):  # compute: 1 %/rps x 200 rps > 100 %
        make_snapshot([FAM], servers, [make_app("a", FAM, max_rate_rps=200)])
    with pytest.raises(UnknownReferenceError):
        make_snapshot([FAM], servers, [make_app("a", FAM, pinned_server="s9")])
    with pytest.raises(UnknownReferenceError):
        make_snapshot([FAM], servers, [make_app("a", FAM)], failed={"s7"})
    with pytest.raises(UnknownReferenceError):
        make_snapshot([FAM], servers, [make_app("a", FAM)],
                      placements=[placement("a", "s9", "large")])
    with pytest.raises(UnknownReferenceError):
        make_snapshot([FAM], servers, [make_app("a", FAM)],
                      placements=[placement("a", "s0", "huge")])
    with pytest.raises(DuplicateIdError, match="two primaries"):
        make_snapshot([FAM], servers, [make_app("a", FAM)],
                      placements=[placement("a", "s0", "large"), placement("a", "s1", "large")])
    with pytest.raises(CapacityExceededError):
        make_snapshot([FAM], servers, [make_app("a", FAM), make_app("b", FAM),
                                       make_app("c", FAM)],
                      placements=[placement(x, "s0", "large") for x in "abc"])


def test_snapshot_free_capacity_ignores_cold_and_failed():
    servers = [make_server("s0", 1000), make_server("s1", 1000)]
    apps = [make_app("a", FAM, max_rate_rps=2.0)]
    snap = make_snapshot([FAM], servers, apps, placements=[
        placement("a", "s0", "large"), placement("a", "s1", "small", Role.COLD)])
    assert snap.free["s0"]["memory_mb"] == 500 and snap.free["s0"]["compute"] == 98
    assert snap.free["s1"]["memory_mb"] == 1000
    assert "s1" not in snap.with_failed(["s1"]).free
    assert snap.primary_by_app["a"].server_id == "s0"


def test_accuracy_reduction_is_relative():
    assert accuracy_reduction(FAM.largest, FAM.smallest) == pytest.approx(0.2)
    assert accuracy_reduction(FAM.largest, FAM.largest) == 0.0


def test_primary_worst_fit_pinning_and_unplaced():
    servers = [make_server("s0", 1000, site="x"), make_server("s1", 800, site="y"),
               make_server("s2", 600, site="y")]
    apps = [make_app("a", FAM), make_app("b", FAM), make_app("c", FAM, pinned_server="s2"),
            make_app("d", FAM, pinned_site="y"), make_app("e", FAM)]
    snap = make_snapshot([FAM], servers, apps)
    result = place_primaries(snap, ["a", "b", "c", "d", "e"], largest_first=False)
    where = {p.app_id: p.server_id for p in result.placements}
    # a -> s0 (1000 free), b -> s1 (800 > 500 left on s0), c pinned to s2, d: site y,
    # s1 has 300 and s2 100 left: nothing fits; e -> s0 (500 left).
    assert where == {"a": "s0", "b": "s1", "c": "s2", "e": "s0"}
    assert [(u.app_id, "pinned site 'y'" in u.reason) for u in result.unplaced] == [("d", True)]
    assert all(p.role is Role.PRIMARY and p.variant == "large" for p in result.placements)


def test_generator_is_deterministic_and_respects_headroom():
    families = load_families()
    a = generate_cluster(families, servers=20, sites=4, apps=200, headroom=0.3, seed=5)
    b = generate_cluster(families, servers=20, sites=4, apps=200, headroom=0.3, seed=5)
    assert a.apps == b.apps and a.placements == b.placements and a.servers == b.servers
    assert len(a.primary_by_app) == 200 and len({s.site_id for s in a.servers}) == 4
    assert sum(x.critical for x in a.apps) == 100
    total = sum(s.capacity["memory_mb"] for s in a.servers)
    free = sum(f["memory_mb"] for f in a.free.values())
    assert 0.25 <= free / total <= 0.31
    assert a.sites == tuple(Site(f"site-{i:02d}") for i in range(4))
