"""The snapshot's fast paths give what the full, validating paths give.

``with_failed`` and ``with_placements`` reuse what cannot change, ``Variant.demand``
remembers its answers and ``Resources`` arithmetic skips re-validating names; each is pinned
here against the slow path it replaces (exact float equality, same errors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import pytest

from model_repo.profiles import load_families
from policies.config import WarmPlanConfig
from policies.errors import (
    CapacityExceededError,
    DuplicateIdError,
    NegativeCapacityError,
    PolicyError,
    UnknownReferenceError,
)
from policies.failover import UnderstudyPolicy, with_warm_plan
from policies.model import _DEMAND_MEMO_SIZE, ClusterSnapshot, Placement, Role
from policies.resources import COMPUTE, MEMORY_MB, Resources, total
from sim.generator import generate_cluster
from tests.unit.builders import make_app, make_family, make_server, make_snapshot, placement

FAM = make_family("fam", [("small", 100, 0.8), ("large", 500, 1.0)], compute_per_rps=1.0)


@pytest.fixture(scope="module")
def cluster() -> ClusterSnapshot:
    """A generated cluster with primaries, warm backups and a few cold replicas."""
    base = generate_cluster(load_families(), servers=12, sites=3, apps=60, headroom=0.3,
                            critical_fraction=0.5, seed=3, rate_rps=(1.0, 5.0))
    policy = UnderstudyPolicy(warm=WarmPlanConfig(method="heuristic"))
    warm = with_warm_plan(base, policy.plan_warm(base))
    assert any(p.role is Role.WARM for p in warm.placements)
    cold: list[Placement] = []
    for primary in base.primary_by_app.values():
        smallest = base.family_of(base.app_by_id[primary.app_id]).smallest.name
        if smallest != primary.variant and len(cold) < 10:
            cold.append(Placement(primary.app_id, primary.server_id, smallest, Role.COLD))
    assert cold
    return warm.with_placements(warm.placements + tuple(cold))


def rebuilt(snapshot: ClusterSnapshot, **changes: object) -> ClusterSnapshot:
    """``snapshot`` built again from scratch through the validating constructor."""
    return replace(snapshot, **changes)  # type: ignore[arg-type]


def exact(vectors: Mapping[str, Resources]) -> list[tuple[str, dict[str, float]]]:
    """A mapping of vectors as plain, ordered data: compares floats exactly."""
    return [(k, v.as_dict()) for k, v in vectors.items()]


def test_with_failed_equals_a_full_build(cluster: ClusterSnapshot) -> None:
    victims = [cluster.servers[0].server_id, cluster.servers[5].server_id]
    fast = cluster.with_failed(victims)
    full = rebuilt(cluster, failed_servers=frozenset(victims))
    assert fast == full
    assert fast.failed_servers == frozenset(victims)
    assert exact(fast.free) == exact(full.free)
    assert exact(fast.used) == exact(full.used)
    assert dict(fast.primary_by_app) == dict(full.primary_by_app)
    assert fast.live_servers() == full.live_servers()
    again = fast.with_failed([victims[0], cluster.servers[7].server_id])
    assert exact(again.free) == exact(rebuilt(fast, failed_servers=again.failed_servers).free)
    assert exact(cluster.with_failed([]).free) == exact(cluster.free)


def test_with_failed_rejects_unknown_servers(cluster: ClusterSnapshot) -> None:
    known = cluster.servers[0].server_id
    with pytest.raises(UnknownReferenceError, match=r"failed servers \['nope'\] are unknown"):
        cluster.with_failed([known, "nope"])
    with pytest.raises(UnknownReferenceError):
        cluster.with_failed(known)  # a string is an iterable of one-letter ids
    assert cluster.failed_servers == frozenset()  # the original is untouched


def test_used_and_free_are_the_plain_sums(cluster: ClusterSnapshot) -> None:
    for server in cluster.servers:
        demands = [cluster.variant_of(p).demand(cluster.app_by_id[p.app_id].max_rate_rps)
                   for p in cluster.placements
                   if p.server_id == server.server_id and p.role is not Role.COLD]
        used = total(demands)
        assert cluster.used[server.server_id].as_dict() == used.as_dict()
        assert cluster.free[server.server_id].as_dict() == (server.capacity - used).as_dict()


def test_with_placements_equals_a_full_build(cluster: ClusterSnapshot) -> None:
    kept = tuple(p for p in cluster.placements if p.role is not Role.WARM)
    fast = cluster.with_failed([cluster.servers[1].server_id]).with_placements(kept)
    full = rebuilt(cluster, placements=kept,
                   failed_servers=frozenset([cluster.servers[1].server_id]))
    assert fast == full
    assert exact(fast.free) == exact(full.free)
    assert exact(fast.used) == exact(full.used)
    assert dict(fast.primary_by_app) == dict(full.primary_by_app)


@pytest.mark.parametrize("placements", [
    [placement("x", "s0", "large")],
    [placement("a", "s9", "large")],
    [placement("a", "s0", "huge")],
    [placement("a", "s0", "small", Role.WARM), placement("a", "s0", "small", Role.WARM)],
    [placement("a", "s0", "large"), placement("a", "s1", "large")],
    [placement("a", "s0", "large"), placement("b", "s0", "large"),
     placement("c", "s0", "large")],
    [placement("a", "s9", "large"), placement("x", "s0", "large")],  # the first error wins
])
def test_with_placements_raises_what_a_full_build_raises(placements: list[Placement]) -> None:
    servers = [make_server("s0", 1000), make_server("s1", 1000)]
    apps = [make_app(a, FAM) for a in "abc"]
    snapshot = make_snapshot([FAM], servers, apps)
    with pytest.raises(PolicyError) as full:
        make_snapshot([FAM], servers, apps, placements=placements)
    with pytest.raises(type(full.value)) as fast:
        snapshot.with_placements(placements)
    assert str(fast.value) == str(full.value)
    assert isinstance(full.value, UnknownReferenceError | DuplicateIdError
                      | CapacityExceededError)


def test_demand_memo_returns_what_it_would_compute() -> None:
    variant = FAM.variant("large")
    first = variant.demand(2.5)
    assert first.as_dict() == (variant.base_demand + {COMPUTE: 2.5}).as_dict()
    assert variant.demand(2.5) is first
    assert variant.demand(2) == variant.demand(2.0)
    assert variant.demand(2).as_dict() == {COMPUTE: 2.0, MEMORY_MB: 500.0}
    other = replace(variant)  # an equal variant has its own memo
    assert other.demand(2.5) == first and other.demand(2.5) is not first
    assert other == variant


def test_demand_memo_is_bounded() -> None:
    variant = replace(FAM.variant("small"))
    for k in range(1, 3 * _DEMAND_MEMO_SIZE):
        assert variant.demand(k / 7).as_dict() == {COMPUTE: 1.0 * (k / 7), MEMORY_MB: 100.0}
        assert len(variant._demand_memo) <= _DEMAND_MEMO_SIZE


def test_demand_rejects_what_it_always_rejected() -> None:
    variant = FAM.variant("large")
    with pytest.raises(NegativeCapacityError, match="must be a finite number"):
        variant.demand(math.nan)
    with pytest.raises(NegativeCapacityError, match="must be a finite number"):
        variant.demand(math.inf)
    assert variant.demand(0).as_dict() == {COMPUTE: 0.0, MEMORY_MB: 500.0}


def test_arithmetic_matches_the_validating_constructor() -> None:
    a = Resources(memory_mb=100, compute=1.5)
    b = Resources({"zeta": 2.0, "alpha": 1.0, MEMORY_MB: 30.0})
    assert (a + b).as_dict() == Resources(
        {MEMORY_MB: 130.0, COMPUTE: 1.5, "zeta": 2.0, "alpha": 1.0}).as_dict()
    assert list(a + b) == sorted(a.keys() | b.keys())  # names stay in order
    assert list(b - a) == sorted(a.keys() | b.keys())
    assert (a - b).as_dict() == {"alpha": -1.0, COMPUTE: 1.5, MEMORY_MB: 70.0, "zeta": -2.0}
    assert a.scaled(2).as_dict() == {COMPUTE: 3.0, MEMORY_MB: 200.0}
    assert a.scaled(True).as_dict() == a.as_dict()
    assert total([a, {"gpu": 1}, b]).as_dict() == (a + b + {"gpu": 1.0}).as_dict()
    assert total([]).as_dict() == {}
    assert a.plus(COMPUTE, 0.5) == Resources(memory_mb=100, compute=2.0)
    assert a.plus("new", 1.0).as_dict() == {COMPUTE: 1.5, MEMORY_MB: 100.0, "new": 1.0}
    assert a + b == b + a and hash(a + b) == hash(b + a)
    assert all(type(v) is float for v in (a + {"n": 1}).values())


@pytest.mark.parametrize("compute", [
    lambda: Resources(m=1e308) + Resources(m=1e308),
    lambda: Resources(m=-1e308) - Resources(m=1e308),
    lambda: Resources(m=1e308).scaled(10.0),
    lambda: Resources(m=1.0).scaled(math.nan),
    lambda: total([Resources(m=1e308), Resources(m=1e308)]),
    lambda: Resources(m=1.0) + {"": 1.0},
    lambda: Resources(m=1.0) - {"m": math.inf},
    lambda: Resources(m=1e308).plus("m", 1e308),
    lambda: Resources(m=1.0).plus("", 1.0),
])
def test_arithmetic_still_rejects_what_it_rejected(compute: object) -> None:
    with pytest.raises(NegativeCapacityError):
        compute()  # type: ignore[operator]


def test_finite_terms_whose_plain_sum_overflows_are_accepted() -> None:
    big = Resources(a=1e308, b=1e308)
    assert (big + Resources(a=1.0)).as_dict() == {"a": 1e308 + 1.0, "b": 1e308}
    assert big.scaled(1.0) == big


def test_arithmetic_results_are_immutable_and_independent() -> None:
    a = Resources(memory_mb=100)
    b = a + Resources(compute=1)
    copy = Resources(b)
    assert copy == b and copy is not b
    with pytest.raises(TypeError):
        b[MEMORY_MB] = 5.0  # type: ignore[index]
    with pytest.raises(TypeError):
        b.items().mapping[MEMORY_MB] = 5.0  # type: ignore[attr-defined]
    assert a.as_dict() == {MEMORY_MB: 100.0}
    plain = b.as_dict()
    plain[MEMORY_MB] = 0.0
    assert b[MEMORY_MB] == 100.0 and copy[MEMORY_MB] == 100.0
