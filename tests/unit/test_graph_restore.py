"""Restoring a graph after a controller restart: the adoption plan (pure), the agents'
inventories, and the manager's write-ahead (no config leaves before Redis has it)."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.graphs.records import GraphRecord, GraphRegistration, ReplicaView
from controller.graphs.restore import Inventories, Running, plan_adoption
from controller.graphs.runtime import ClusterGraph, needs_record
from stateful.core.coordinator import initial_config
from stateful.core.effects import Effect, Kill, Send
from stateful.graph import MANAGER
from stateful.messages import Configure, Durable, GraphConfig, Mode, Placement, RuntimeOptions
from stateful.services import sp_graph
from understudy.wire.protocol import ReplicaInfo

OPTIONS = RuntimeOptions(mode=Mode.NSPB)


def _record(config: GraphConfig, *, spares: list[str], dead: list[str] = (),  # type: ignore[assignment]
            wanted_spares: int = 2) -> GraphRecord:
    reg = GraphRegistration(spec=config.graph, spares=wanted_spares)
    nodes = [*config.nodes, *spares]
    return GraphRecord(name=config.graph.name, registration=reg,
                       config=config.model_dump(mode="json"), spares=spares, dead=list(dead),
                       replicas=[ReplicaView(node=n, server_id="s1", role="x") for n in nodes])


def _running(nodes: list[str], server: str = "s1") -> dict[str, Running]:
    return {n: Running(server, f"{server}:{i}") for i, n in enumerate(nodes)}


def test_everything_running_is_adopted_and_nothing_fails() -> None:
    config = initial_config(sp_graph(4), OPTIONS)
    record = _record(config, spares=["spare.0", "spare.1"])
    plan = plan_adoption(record, _running([*config.nodes, "spare.0", "spare.1"]))
    assert plan.config == config
    assert set(plan.adopt) == {*config.nodes, "spare.0", "spare.1"}
    assert plan.failed == [] and plan.stop == []
    assert plan.spares == ["spare.0", "spare.1"] and plan.missing_spares == 0
    assert plan.next_spare == 2


def test_a_primary_gone_while_no_controller_watched_fails_and_strays_are_stopped() -> None:
    config = initial_config(sp_graph(4), OPTIONS)
    record = _record(config, spares=["spare.0", "spare.3"])
    running = _running([n for n in config.nodes if n != "sentiment.p0"] + ["spare.3"])
    running["spare.9"] = Running("s2", "s2:1")  # started as the old controller died
    plan = plan_adoption(record, running)
    assert plan.failed == [("sentiment", "sentiment.p0")]
    assert "sentiment.p0" not in plan.adopt and "sentiment.b0" in plan.adopt
    assert plan.spares == ["spare.3"] and plan.missing_spares == 1
    assert plan.stop == [("s2", "spare.9")]
    assert plan.next_spare == 10  # never reuses a standby's name


def test_a_replica_declared_failed_is_failed_again_even_if_it_runs() -> None:
    config = initial_config(sp_graph(4), OPTIONS)
    config = config.evolve(placements={**config.placements, "stock": Placement(
        primary="stock.p0", backup="spare.0")})
    record = _record(config, spares=[], dead=["stock.b0", "spare.0"], wanted_spares=0)
    plan = plan_adoption(record, _running([*config.nodes, "stock.b0"]))
    # spare.0 holds a role and was declared failed: adopted (so the fence reaches it), failed.
    assert plan.failed == [("stock", "spare.0")] and "spare.0" in plan.adopt
    assert ("s1", "stock.b0") in plan.stop  # no role any more


def test_inventories_follow_hellos_exits_and_failures() -> None:
    async def scenario() -> None:
        inv = Inventories()
        waiting = asyncio.ensure_future(inv.wait_for({"s1", "s2"}, 5.0))
        await asyncio.sleep(0)
        inv.hello("s1", [ReplicaInfo(graph="g", node="a.s0", address="h:1"),
                         ReplicaInfo(graph="h", node="b.s0", address="h:2")])
        assert not waiting.done()
        inv.hello("s2", [ReplicaInfo(graph="g", node="c.s0", address="k:1")])
        assert await waiting == set()
        assert inv.running("g") == {"a.s0": Running("s1", "h:1"), "c.s0": Running("s2", "k:1")}
        inv.exited("s1", "g", "a.s0")
        inv.forget("s2")
        assert inv.running("g") == {}
        assert await inv.wait_for({"s3"}, 0.05) == {"s3"}

    asyncio.run(scenario())


def test_configs_and_fences_wait_for_the_write_and_keep_their_order() -> None:
    async def scenario() -> None:
        written = asyncio.Event()
        log: list[str] = []

        async def persist() -> None:
            log.append("persist")
            await written.wait()

        graph = ClusterGraph(sp_graph(4), OPTIONS, launcher=object(),  # type: ignore[arg-type]
                             persist=persist)
        applied: list[tuple[str, list[Effect]]] = []
        graph.node_host.apply = lambda name, effects: applied.append((name, effects))  # type: ignore[method-assign]
        config = initial_config(sp_graph(4), OPTIONS)
        configure: list[Effect] = [Send("embed.s0", Configure(config=config))]
        durable: list[Effect] = [Send("stock.b0", Durable(op="sentiment", epoch=0, seq=1))]
        assert needs_record(configure) and needs_record([Kill("x")])
        assert not needs_record(durable)
        graph._apply(MANAGER, durable)  # nothing to write: out at once
        assert applied == [(MANAGER, durable)]
        graph._apply(MANAGER, configure)
        graph._apply("frontend", durable)  # queues behind the config
        await asyncio.sleep(0.01)
        assert log == ["persist"] and len(applied) == 1
        written.set()
        await asyncio.sleep(0.01)
        assert applied == [(MANAGER, durable), (MANAGER, configure), ("frontend", durable)]

    asyncio.run(scenario())


def test_a_new_incarnation_uses_new_manager_and_frontend_names() -> None:
    graph: Any = ClusterGraph(sp_graph(4), OPTIONS, launcher=object(),  # type: ignore[arg-type]
                              incarnation=2)
    assert (graph.manager_node, graph.frontend_node) == ("manager~2", "frontend~2")
    assert set(graph.node_host.cores) == {"manager~2", "frontend~2"}
    assert graph.frontend.node == "frontend~2"
