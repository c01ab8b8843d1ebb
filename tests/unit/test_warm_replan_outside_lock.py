"""The warm re-plan solves outside the planning lock and applies only what is still right."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from controller.records import ServerState
from policies.model import Role
from tests.unit.controller_harness import (
    LARGE,
    Controller,
    app_record,
    new_cluster,
    replica,
)
from tests.unit.scenario import TEST_LIMIT_S, run


def cluster() -> Controller:
    """Two critical apps without a warm backup yet."""
    return new_cluster([
        app_record("c1", [replica("s1", LARGE)], serving=("s1", LARGE), critical=True),
        app_record("c2", [replica("s3", LARGE)], serving=("s3", LARGE), critical=True),
    ], auto_load=True)


def gate_the_solve(ctl: Controller) -> tuple[threading.Event, threading.Event, list[int]]:
    """The policy's solve waits (in its thread) until released; returns (started, release)."""
    started, release = threading.Event(), threading.Event()
    solves: list[int] = []
    real = ctl.orchestrator.policy

    class Gated:
        def __init__(self) -> None:
            self.inner = real()

        def plan_warm(self, snapshot: Any) -> Any:
            solves.append(1)
            started.set()
            release.wait(TEST_LIMIT_S)
            return self.inner.plan_warm(snapshot)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    ctl.warm.policy = Gated
    return started, release, solves


def warm_of(ctl: Controller, app_id: str) -> list[str]:
    return [r.server_id for r in ctl.store.app(app_id).replicas if r.role is Role.WARM]


def test_the_planning_lock_is_free_while_the_warm_plan_is_solved() -> None:
    async def body() -> None:
        ctl = cluster()
        started, release, _ = gate_the_solve(ctl)
        replan = asyncio.ensure_future(ctl.warm.replan())
        await asyncio.to_thread(started.wait, TEST_LIMIT_S)
        # A failover's cold round (or a placement) takes the lock while the solve runs.
        await asyncio.wait_for(ctl.executor.locks.plan.acquire(), 1.0)
        ctl.executor.locks.plan.release()
        release.set()
        summary = await replan
        assert summary["loads"] == 2 and summary["held_back"] == 0
        assert warm_of(ctl, "c1") and warm_of(ctl, "c2")

    run(body)


def test_an_app_written_during_the_solve_is_held_back_for_the_next_replan() -> None:
    async def body() -> None:
        ctl = cluster()
        started, release, _ = gate_the_solve(ctl)
        replan = asyncio.ensure_future(ctl.warm.replan())
        await asyncio.to_thread(started.wait, TEST_LIMIT_S)
        record = ctl.store.app("c1")
        record.reason = "written meanwhile"
        ctl.store.put_app_now(record)
        release.set()
        summary = await replan
        assert summary["held_back"] >= 1
        assert warm_of(ctl, "c1") == []  # left for the next re-plan, which was requested
        assert ctl.warm._pending  # noqa: SLF001 - the follow-up request

    run(body)


def test_a_server_failing_during_the_solve_makes_it_solve_again() -> None:
    async def body() -> None:
        ctl = cluster()
        started, release, solves = gate_the_solve(ctl)
        replan = asyncio.ensure_future(ctl.warm.replan())
        await asyncio.to_thread(started.wait, TEST_LIMIT_S)
        server = ctl.store.server("s4")
        server.state = ServerState.FAILED
        ctl.store.put_server_now(server)
        release.set()
        await replan
        assert len(solves) == 2
        assert all(s != "s4" for a in ("c1", "c2") for s in warm_of(ctl, a))

    run(body)


def test_a_server_joining_during_the_solve_does_not_make_it_solve_again() -> None:
    async def body() -> None:
        ctl = cluster()
        started, release, solves = gate_the_solve(ctl)
        replan = asyncio.ensure_future(ctl.warm.replan())
        await asyncio.to_thread(started.wait, TEST_LIMIT_S)
        joined = ctl.store.server("s4").model_copy(update={"server_id": "s9"})
        ctl.store.put_server_now(joined)
        release.set()
        summary = await replan
        assert len(solves) == 1 and summary["loads"] == 2

    run(body)
