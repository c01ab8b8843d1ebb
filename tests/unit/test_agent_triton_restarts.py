"""When the agent restarts its Triton: a quick death gets new ports, a long life a new count,
a start that fails is tried again within the policy's limit.

The agent's Triton keeper (``agent.triton_keeper``) and what the agent reports, on a stand-in
Triton; ``tests/integration/test_agent.py`` kills a real one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.triton_config import TritonConfig, TritonStartError
from agent.triton_keeper import QUICK_EXIT_S, STABLE_RUN_S
from understudy.wire.protocol import TritonDown, TritonUp


class StandInProcess:
    pid = 4242


class StandInTriton:
    """The TritonServer surface the agent uses to start Triton and when it exits."""

    fail_starts = 0
    """Starts that raise before one succeeds (class-wide: set it per test)."""
    dies_at_start = False
    """A start that returns with the process already gone."""

    def __init__(self, config: TritonConfig) -> None:
        self.config = config
        self.on_exit: Any = None
        self.model_backend = "python"
        self.process = StandInProcess()
        self.starts = 0

    def kill(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True

    def start(self) -> None:
        self.starts += 1
        if self.starts <= self.fail_starts:
            raise TritonStartError("torch runtime not listening after 60 s: (nothing logged)")

    def alive(self) -> bool:
        return not self.dies_at_start


def agent(tmp_path: Path, fail_starts: int = 0, dies_at_start: bool = False,
          **overrides: Any) -> tuple[Agent, list[Any]]:
    config = AgentConfig(server_id="s1", site_id="site-a", controller_url="http://127.0.0.1:9",
                         capacity={"memory_mb": 1000.0, "compute": 100.0},
                         artifacts=str(tmp_path / "store"), run_dir=tmp_path,
                         restart_backoff_s=0.0, **overrides)
    triton_type = type("Triton", (StandInTriton,), {"fail_starts": fail_starts,
                                                    "dies_at_start": dies_at_start})
    found = Agent(config, triton_factory=triton_type)
    sent: list[Any] = []

    async def record(message: Any, keep: bool = False) -> None:
        sent.append(message)

    found._send = record  # type: ignore[method-assign]
    return found, sent


def exit_after(found: Agent, ran_s: float) -> None:
    found.keeper.alive = True
    found.keeper.started_at = time.monotonic() - ran_s
    found.keeper.exited(found.triton.process, -9)


def test_a_triton_that_ran_long_is_restarted_whatever_the_earlier_count(tmp_path: Path) -> None:
    async def body() -> None:
        found, sent = agent(tmp_path, max_restarts=2)
        found.keeper.restarts = 2  # the limit, reached by crashes long ago
        exit_after(found, STABLE_RUN_S + 1)
        await asyncio.sleep(0.05)
        down = next(m for m in sent if isinstance(m, TritonDown))
        assert down.restarting
        assert found.keeper.restarts == 1  # counted again from zero
    asyncio.run(body())


def test_a_crash_loop_still_stops_at_the_limit(tmp_path: Path) -> None:
    async def body() -> None:
        found, sent = agent(tmp_path, max_restarts=2)
        found.keeper.restarts = 2
        exit_after(found, STABLE_RUN_S / 2)
        await asyncio.sleep(0.05)
        down = next(m for m in sent if isinstance(m, TritonDown))
        assert not down.restarting
    asyncio.run(body())


def test_a_triton_dead_right_after_its_start_restarts_on_new_ports(tmp_path: Path) -> None:
    async def body() -> None:
        found, _ = agent(tmp_path)
        before = found.triton.config
        exit_after(found, QUICK_EXIT_S / 10)
        after = found.triton.config
        assert (after.http_port, after.grpc_port, after.metrics_port) != \
            (before.http_port, before.grpc_port, before.metrics_port)
        # Fixed ports are the operator's choice: kept.
        pinned, _ = agent(tmp_path / "pinned", http_port=18000)
        exit_after(pinned, QUICK_EXIT_S / 10)
        assert pinned.triton.config.http_port == 18000
        await asyncio.sleep(0.05)
    asyncio.run(body())


def test_a_start_that_fails_at_boot_is_tried_again_until_triton_runs(tmp_path: Path) -> None:
    """A first start that fails (a runtime slow to import torch on a busy machine) is retried
    under the restart policy; the controller hears TritonUp when one succeeds."""
    async def body() -> None:
        found, sent = agent(tmp_path, fail_starts=2, max_restarts=5)
        await found.keeper.bring_up()
        for _ in range(100):
            if any(isinstance(m, TritonUp) for m in sent):
                break
            await asyncio.sleep(0.01)
        assert found.triton.starts == 3
        assert found.keeper.alive
        up = next(m for m in sent if isinstance(m, TritonUp))
        assert up.restarts == 2
    asyncio.run(body())


def test_starts_that_keep_failing_stop_at_the_limit(tmp_path: Path) -> None:
    async def body() -> None:
        found, sent = agent(tmp_path, fail_starts=100, max_restarts=3)
        await found.keeper.bring_up()
        await asyncio.sleep(0.2)
        assert found.triton.starts == 1 + 3  # the first start, then the policy's three
        assert not found.keeper.alive
        assert not any(isinstance(m, TritonUp) for m in sent)
        assert not found.keeper.restarting
    asyncio.run(body())


def test_a_triton_gone_when_its_start_returns_is_a_failed_start(tmp_path: Path) -> None:
    """Its exit reached the agent before the start did (and was left to the start): the
    start fails, so the retries go on instead of marking a dead Triton alive."""
    async def body() -> None:
        found, sent = agent(tmp_path, dies_at_start=True, max_restarts=1)
        found.keeper.exited(found.triton.process, -9)  # not ready yet: ignored
        assert not sent
        assert not await found.keeper.start()
        assert not found.keeper.alive
    asyncio.run(body())


def test_the_exit_of_a_triton_the_agent_stops_is_no_crash(tmp_path: Path) -> None:
    """Stopping the agent stops Triton: its exit is neither reported nor restarted."""
    async def body() -> None:
        found, sent = agent(tmp_path, max_restarts=5)
        await found.keeper.bring_up()
        assert found.keeper.alive
        await found.keeper.stop()
        assert found.triton.stopped
        found.keeper.exited(found.triton.process, 0)
        await asyncio.sleep(0.05)
        assert not any(isinstance(m, TritonDown) for m in sent)
        assert found.triton.starts == 1 and not found.keeper.restarting
    asyncio.run(body())
