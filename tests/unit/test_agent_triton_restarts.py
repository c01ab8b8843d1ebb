"""When the agent restarts its Triton: a quick death gets new ports, a long life a new count.

The agent's reaction to its Triton's exit (``Agent._on_triton_exit``) on a stand-in Triton;
``tests/integration/test_agent.py`` kills a real one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.daemon import QUICK_EXIT_S, STABLE_RUN_S, Agent
from agent.triton_config import TritonConfig
from understudy.wire.protocol import TritonDown


class StandInProcess:
    pid = 4242


class StandInTriton:
    """The TritonServer surface the agent uses when Triton exits; starts nothing."""

    def __init__(self, config: TritonConfig) -> None:
        self.config = config
        self.on_exit: Any = None
        self.model_backend = "python"
        self.process = StandInProcess()

    def kill(self) -> None:
        return None

    def start(self) -> None:
        return None


def agent(tmp_path: Path, **overrides: Any) -> tuple[Agent, list[Any]]:
    config = AgentConfig(server_id="s1", site_id="site-a", controller_url="http://127.0.0.1:9",
                         capacity={"memory_mb": 1000.0, "compute": 100.0},
                         artifacts=str(tmp_path / "store"), run_dir=tmp_path,
                         restart_backoff_s=0.0, **overrides)
    found = Agent(config, triton_factory=StandInTriton)  # type: ignore[arg-type]
    sent: list[Any] = []

    async def record(message: Any, keep: bool = False) -> None:
        sent.append(message)

    found._send = record  # type: ignore[method-assign]
    return found, sent


def exit_after(found: Agent, ran_s: float) -> None:
    found._triton_alive = True
    found._triton_started_at = time.monotonic() - ran_s
    found._on_triton_exit(found.triton.process, -9)


def test_a_triton_that_ran_long_is_restarted_whatever_the_earlier_count(tmp_path: Path) -> None:
    async def body() -> None:
        found, sent = agent(tmp_path, max_restarts=2)
        found.restarts = 2  # the limit, reached by crashes long ago
        exit_after(found, STABLE_RUN_S + 1)
        await asyncio.sleep(0.05)
        down = next(m for m in sent if isinstance(m, TritonDown))
        assert down.restarting
        assert found.restarts == 1  # counted again from zero
    asyncio.run(body())


def test_a_crash_loop_still_stops_at_the_limit(tmp_path: Path) -> None:
    async def body() -> None:
        found, sent = agent(tmp_path, max_restarts=2)
        found.restarts = 2
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
