"""NSPB with real replica processes over TCP: SIGKILL replicas mid-stream, then check that every
request got exactly one reply and the consistency checker finds nothing (issue 6, "Show it").

One deployment of the SP-like service serves four failure phases in a row (process start-up,
mostly importing torch, is the expensive part on a 2-core machine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from stateful.core.frontend import ClientRequest
from stateful.messages import Mode, NoiseSpec, RuntimeOptions
from stateful.runtime import LocalGraph
from stateful.services import request_maker, sp_graph

pytestmark = pytest.mark.timeout(300)


async def stream(graph: LocalGraph, make: Callable[[int], ClientRequest], start: int,
                 count: int, window: int = 24,
                 midway: asyncio.Event | None = None) -> list[object]:
    """Closed-loop client: at most ``window`` requests in flight; sets ``midway`` once a
    third of the replies are in."""
    semaphore = asyncio.Semaphore(window)
    replied = 0

    async def one(i: int) -> object:
        nonlocal replied
        async with semaphore:
            reply = await graph.submit(make(i), timeout_s=60.0)
        replied += 1
        if midway is not None and replied >= count // 3:
            midway.set()
        return reply

    return await asyncio.gather(*(one(i) for i in range(start, start + count)))


PHASES: list[tuple[str, list[tuple[str, str]]]] = [
    ("stateful primary", [("sentiment", "primary")]),
    ("downstream stateful primary", [("stock", "primary")]),
    ("stateless replica", [("embed", "stateless")]),
    # HAMS §IV-C correlated failure: upstream primary and downstream backup at once.
    ("adjacent", [("sentiment", "primary"), ("stock", "backup")]),
]


def test_sigkill_replicas_mid_stream_loses_nothing_and_stays_consistent(tmp_path: Path) -> None:
    async def scenario() -> None:
        options = RuntimeOptions(mode=Mode.NSPB, observe=True, noise=NoiseSpec(seed=7))
        async with LocalGraph(sp_graph(8), options, run_dir=tmp_path, spares=3) as graph:
            make = request_maker("sp", seed=7)
            assert len(await stream(graph, make, 0, 40)) == 40
            promoted: list[set[str]] = []
            restarted: list[set[str]] = []
            for phase, (name, victims) in enumerate(PHASES, start=1):
                nodes = [graph.node_of(op, role) for op, role in victims]
                before = len(graph.recoveries)
                midway = asyncio.Event()
                running = asyncio.ensure_future(stream(graph, make, 1000 * phase, 60,
                                                       midway=midway))
                await asyncio.wait_for(midway.wait(), 60.0)
                for node in nodes:
                    assert node is not None, name
                    graph.kill(node)
                await graph.wait_recoveries(before + 1, timeout_s=30.0)
                assert len(await running) == 60, name
                await graph.wait_replicated(timeout_s=90.0, standbys=2)
                # Two kills at once may be detected in either order: one recovery or two.
                new = graph.recoveries[before:]
                promoted.append({op for r in new for op in r.promoted})
                restarted.append({op for r in new for op in r.restarted})
            assert "sentiment" in promoted[0]
            assert "stock" in promoted[1]
            assert restarted[2] == {"embed"}
            assert "sentiment" in promoted[3]
            report = graph.report()
            assert report.ok, report.summary()
            assert report.submitted == 40 + 60 * len(PHASES)

    asyncio.run(scenario())


def test_remus_serves_on_processes(tmp_path: Path) -> None:
    async def scenario() -> None:
        options = RuntimeOptions(mode=Mode.REMUS, observe=True)
        async with LocalGraph(sp_graph(4), options, run_dir=tmp_path, spares=0) as graph:
            assert len(await stream(graph, request_maker("sp"), 0, 20)) == 20
            assert graph.report().ok

    asyncio.run(scenario())
