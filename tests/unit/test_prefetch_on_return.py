"""A server that comes back without a new hello gets the interim variants it missed.

The interim variants are prefetched to every up server when apps register; a server failed
at that moment (its Triton had just died) was skipped, and it came back through its agent's
``TritonUp`` (or a heartbeat revival), which asked nothing: its first failover as a target then
had to download the weights first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from controller.records import ServerState
from tests.unit.controller_harness import SMALL, app_record, new_cluster
from tests.unit.fakes import FakeAgents, endpoints_of
from tests.unit.scenario import run
from understudy.wire.protocol import TritonUp


def test_a_server_back_from_a_triton_restart_is_asked_for_the_interims_it_missed() -> None:
    async def body() -> None:
        ctl = new_cluster()
        store, agents, clock = ctl.store, ctl.agents, ctl.clock
        failed = (await store.servers())["s1"]
        failed.state = ServerState.FAILED
        await store.put_server(failed)
        store.put_app_now(app_record("a", [], serving=None))
        ctl.prefetcher.request()  # what a registration asks
        await until(lambda: {e.server_id for e in prefetches(agents)} == {"s2", "s3", "s4"})
        assert all(e.variant == SMALL for e in prefetches(agents))

        endpoints = endpoints_of("s1")
        await ctl.returns.on_triton_up("s1", TritonUp(at=clock.time(), endpoints=endpoints,
                                                       restarts=1))
        await until(lambda: any(e.server_id == "s1" for e in prefetches(agents)))
        assert [e.variant for e in prefetches(agents) if e.server_id == "s1"] == [SMALL]
        assert (await store.servers())["s1"].state is ServerState.UP

    run(body)


def prefetches(agents: FakeAgents) -> list[Any]:
    return [e for e in agents.log if e.what == "prefetch"]


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)
