"""Where service-graph replicas run on the cluster: primary and backup apart, standbys spread,
and the coordinator's standby choice that keeps them apart after a promotion."""

from __future__ import annotations

from collections import Counter

import pytest

from controller.graphs.placement import (
    Host,
    OperatorSlots,
    PlacementError,
    ReplicaDemand,
    place_graph,
    place_spare,
    spare_rank,
)
from stateful.core.coordinator import Coordinator, initial_config
from stateful.core.effects import Effect, LaunchSpare, Send
from stateful.messages import Fence, FenceAck, Freeze, FreezeAck, Resume, ResumeAck, RuntimeOptions
from stateful.services import sp_graph


def hosts(*specs: str, load: dict[str, int] | None = None) -> list[Host]:
    """``"s1@a"`` -> server s1 in site a."""
    return [Host(s.split("@")[0], s.split("@")[1], (load or {}).get(s.split("@")[0], 0))
            for s in specs]


def sp_slots() -> list[OperatorSlots]:
    config = initial_config(sp_graph(8), RuntimeOptions())
    return [OperatorSlots(op, w.primary or "", w.backup) for op, w in config.placements.items()]


@pytest.mark.parametrize("cluster", [
    ("s1@a", "s2@b", "s3@c"),
    ("s1@a", "s2@a", "s3@b"),
    ("s1@a", "s2@a"),
    ("s1@a", "s2@b", "s3@b", "s4@b", "s5@c"),
])
def test_primary_and_backup_never_share_a_server_and_split_sites_when_they_can(
        cluster: tuple[str, ...]) -> None:
    live = hosts(*cluster)
    site = {h.server_id: h.site_id for h in live}
    where = place_graph(sp_slots(), ["spare.0", "spare.1"], live)
    several_sites = len(set(site.values())) > 1
    for slot in sp_slots():
        if slot.backup is None:
            continue
        primary, backup = where[slot.primary], where[slot.backup]
        assert primary != backup, slot
        if several_sites:
            assert site[primary] != site[backup], slot
    assert set(where) == {n for s in sp_slots() for n in (s.primary, s.backup) if n} | \
        {"spare.0", "spare.1"}


def test_replicas_spread_over_the_least_loaded_servers() -> None:
    where = place_graph(sp_slots(), ["spare.0", "spare.1"], hosts("s1@a", "s2@b", "s3@c"))
    counts = Counter(where.values())
    assert max(counts.values()) - min(counts.values()) <= 1  # 9 replicas over 3 servers
    busy = place_graph(sp_slots(), [], hosts("s1@a", "s2@b", "s3@c", load={"s1": 10}))
    assert "s1" not in busy.values()


def test_a_pair_needs_two_servers_and_a_graph_needs_one() -> None:
    with pytest.raises(PlacementError, match="two live servers"):
        place_graph(sp_slots(), [], hosts("s1@a"))
    with pytest.raises(PlacementError, match="no live server"):
        place_graph(sp_slots(), [], [])


def test_standbys_go_where_they_are_needed() -> None:
    live = hosts("s1@a", "s2@b", "s3@c")
    assert place_spare(live, {"s1": 1, "s2": 0, "s3": 0}) == "s2"
    assert place_spare(live, {"s1": 0, "s2": 0, "s3": 0}, needed_away_from={"s1"}) == "s2"
    with pytest.raises(PlacementError):
        place_spare([], {})


def test_spare_rank_prefers_other_sites_and_refuses_the_partners_server() -> None:
    site = {"s1": "a", "s2": "a", "s3": "b"}
    live = ["s1", "s2", "s3"]
    assert spare_rank("s3", "s1", site, live) == 0
    assert spare_rank("s2", "s1", site, live) == 1
    assert spare_rank("s1", "s1", site, live) is None
    assert spare_rank("s1", "s1", site, ["s1"]) == 2  # the last server: better than nothing
    assert spare_rank("s1", None, site, live) == 0


def sends(effects: list[Effect], kind: type) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def fail_sentiment_primary(mgr: Coordinator) -> list[Effect]:
    """Run the recovery of sentiment's primary with every node answering at once."""
    out = mgr.on_replica_failed("sentiment", "sentiment.p0")
    for s in sends(out, Freeze):
        out = mgr.on_message(s.dst, FreezeAck(recovery=1, node=s.dst, applied={"sentiment": 0}))
    for s in sends(out, Fence):
        out = mgr.on_message(s.dst, FenceAck(recovery=1, round=1, node=s.dst))
    effects = list(out)
    for s in sends(out, Resume):
        effects += mgr.on_message(s.dst, ResumeAck(recovery=1, node=s.dst))
    return effects


def coordinator(server: dict[str, str]) -> Coordinator:
    def rank(candidate: str, partner: str | None) -> int | None:
        return spare_rank(server.get(candidate), server.get(partner or ""),
                          {"s1": "a", "s2": "b", "s3": "c"}, ["s2", "s3"])

    mgr = Coordinator(clock=lambda: 0.0, spare_rank=rank)
    return mgr


def test_a_promoted_backup_gets_a_new_backup_from_another_server() -> None:
    server = {"sentiment.p0": "s1", "sentiment.b0": "s2", "spare.0": "s2", "spare.1": "s3"}
    mgr = coordinator(server)
    mgr.deploy(initial_config(sp_graph(8), RuntimeOptions()), spares=["spare.0", "spare.1"])
    fail_sentiment_primary(mgr)
    assert mgr.config is not None
    where = mgr.config.placements["sentiment"]
    assert (where.primary, where.backup) == ("sentiment.b0", "spare.1")  # not spare.0 on s2


def test_refused_standbys_make_the_coordinator_ask_for_another() -> None:
    server = {"sentiment.p0": "s1", "sentiment.b0": "s2", "spare.0": "s2", "spare.2": "s3"}
    mgr = coordinator(server)
    mgr.deploy(initial_config(sp_graph(8), RuntimeOptions()), spares=["spare.0"])
    effects = fail_sentiment_primary(mgr)
    assert mgr.config is not None
    assert mgr.config.placements["sentiment"].backup is None  # spare.0 sits on s2 too
    assert sum(e.count for e in effects if isinstance(e, LaunchSpare)) >= 1
    mgr.on_spare_ready("spare.2", "127.0.0.1:9")
    assert mgr.config.placements["sentiment"].backup == "spare.2"
    assert mgr.spares == ["spare.0"]


def test_replicas_of_one_server_fail_in_one_recovery() -> None:
    mgr = Coordinator(clock=lambda: 0.0)
    mgr.deploy(initial_config(sp_graph(8), RuntimeOptions()), spares=["spare.0"])
    out = mgr.on_replicas_failed([("predict", "predict.s0"), ("sentiment", "sentiment.p0"),
                                  ("stock", "stock.b0"), (None, "spare.0")])
    assert mgr.recovery is not None and mgr.recovery.failed == \
        {"predict.s0", "sentiment.p0", "stock.b0"}
    assert mgr.recoveries == 1 and not mgr.queued
    assert any(isinstance(e, LaunchSpare) for e in out)  # the lost standby is replaced


# --- memory and compute -----------------------------------------------------------------------

def roomy(memory: dict[str, float], sites: dict[str, str] | None = None,
          compute: dict[str, float] | None = None) -> list[Host]:
    """Hosts with the free memory (and compute) left after their apps."""
    return [Host(s, (sites or {}).get(s, f"site-{s}"), 0, m,
                 (compute or {}).get(s, float("inf"))) for s, m in memory.items()]


def test_replicas_go_where_memory_is_left_and_never_past_it() -> None:
    demand = ReplicaDemand(memory_mb=100)
    where = place_graph(sp_slots(), ["spare.0"], roomy({"s1": 1000, "s2": 250, "s3": 450}),
                        demand)
    used = Counter(where.values())
    assert used["s2"] * 100 <= 250 and used["s3"] * 100 <= 450 and sum(used.values()) == 8
    assert used["s1"] > used["s3"] > used["s2"]  # worst-fit: the most free memory first
    for primary, backup in (("sentiment.p0", "sentiment.b0"), ("stock.p0", "stock.b0")):
        assert where[primary] != where[backup]


def test_a_graph_that_fits_nowhere_is_refused_with_what_is_left() -> None:
    with pytest.raises(PlacementError, match="room for a replica"):
        place_graph(sp_slots(), [], roomy({"s1": 150, "s2": 150}), ReplicaDemand(memory_mb=100))
    # The pair rule still holds when only one server has room for the backup.
    with pytest.raises(PlacementError, match="two live servers with room"):
        place_graph([OperatorSlots("lstm", "lstm.p0", "lstm.b0")], [],
                    roomy({"s1": 1000, "s2": 50}), ReplicaDemand(memory_mb=100))


def test_compute_is_a_limit_too() -> None:
    where = place_graph([OperatorSlots("mlp", "mlp.s0")], [],
                        roomy({"s1": 1000, "s2": 10}, compute={"s1": 0.05, "s2": 1.0}),
                        ReplicaDemand(memory_mb=5, compute=0.1))
    assert where == {"mlp.s0": "s2"}


def test_undeclared_demand_still_prefers_free_memory() -> None:
    where = place_graph([OperatorSlots("mlp", "mlp.s0")], [], roomy({"s1": 10, "s2": 900}))
    assert where == {"mlp.s0": "s2"}


def test_standbys_only_start_where_they_fit() -> None:
    demand = ReplicaDemand(memory_mb=100)
    assert place_spare(roomy({"s1": 50, "s2": 120}), {"s2": 3}, demand=demand) == "s2"
    with pytest.raises(PlacementError, match="room"):
        place_spare(roomy({"s1": 50, "s2": 60}), {}, demand=demand)
