"""Worker processes for the simulator's parallel runs (``--jobs``).

Workers are *spawned*, never forked. A forked child inherits a copy of the parent's memory
but none of its threads: once the parent has solved an ILP, HiGHS's worker threads are part
of that copy, and a child that solves one in turn waits on threads that do not exist (seen as
workers spinning at 100 % CPU forever when a test ran an ILP before a ``--jobs 2`` suite).
Spawning costs each worker a fresh import (well under a second) and rules that out.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def worker_pool(jobs: int, initializer: Callable[..., object] | None = None,
                initargs: tuple[Any, ...] = ()) -> ProcessPoolExecutor:
    """A pool of ``jobs`` spawned worker processes."""
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=initializer, initargs=initargs)


def map_jobs(run: Callable[[Job], Result], work: Sequence[Job], jobs: int) -> list[Result]:
    """``run`` over ``work``, results in order.

    In this process with ``jobs`` <= 1, else in a pool of ``jobs`` spawned workers (``run``
    must then be a module-level function).
    """
    if jobs <= 1:
        return [run(w) for w in work]
    with worker_pool(jobs) as pool:
        return list(pool.map(run, work))
