"""The values a batch scheduler takes and returns, and the interface every scheduler implements.

A scheduler is a sans-IO core: its caller (the simulator, later the gateway's per-app queue)
hands it each request as it arrives (:meth:`BatchScheduler.enqueue`), asks for the next batch
whenever a worker is free (:meth:`BatchScheduler.next_batch`) and reports what each batch took
(:meth:`BatchScheduler.completed`). It never reads a clock or sleeps: time is the ``now_s``
argument, and a :class:`Decision` with no batch says when to ask again (``wake_at_s``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

UNREACHABLE = "deadline-unreachable"
"""Dropped early: the request can no longer finish by its deadline, even alone."""
EXPIRED = "expired"
"""Dropped: its deadline had passed before it could be sent."""
WINDOW_MISSED = "action-window-missed"
"""Dropped by the Clockwork-like baseline: the previous batch overran its predicted end, so the
batch planned to start then missed its execution window (Clockwork's action timeout)."""


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request as the scheduler sees it (times in seconds on the caller's clock)."""

    key: Hashable
    app: str
    arrival_s: float
    deadline_s: float


@dataclass(frozen=True, slots=True)
class Drop:
    """A request the scheduler gives up on, and why (one of the reasons above)."""

    request: QueuedRequest
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now: send ``batch`` (possibly empty), report ``drops`` as failed."""

    batch: tuple[QueuedRequest, ...] = ()
    drops: tuple[Drop, ...] = ()
    wake_at_s: float | None = None
    """With an empty batch: call ``next_batch`` again at this time even if nothing arrives
    (None: only on the next arrival)."""
    expected_latency_s: float | None = None
    """The scheduler's estimate of the batch's latency (for logs and the report)."""


@dataclass(frozen=True, slots=True)
class BatchDone:
    """What a batch took, reported back to its scheduler."""

    batch: tuple[QueuedRequest, ...]
    started_s: float
    latency_s: float
    solo_s: Mapping[Hashable, float] = field(default_factory=dict)
    """Execution times measured alone, for the requests the profiler sampled (§3.2: finished
    requests are re-run alone off the critical path); may be empty."""
    overhead_s: float | None = None
    """What the batch took beyond its model's own time (transfer, the server, the caller):
    its latency minus the longest execution time the model reported for its rows; None when
    the model reports none."""


class BatchScheduler(Protocol):
    """One queue of requests to one model served by one worker at a time."""

    name: str

    def enqueue(self, request: QueuedRequest, now_s: float) -> None:
        """Take ``request`` into the queue."""
        ...

    def next_batch(self, now_s: float) -> Decision:
        """The batch to send now that a worker is free, and the drops decided meanwhile."""
        ...

    def completed(self, done: BatchDone) -> None:
        """Learn from a finished batch."""
        ...

    def __len__(self) -> int:
        """Requests waiting."""
        ...


@dataclass(frozen=True, slots=True)
class BatchLaw:
    """Latency of a batch of ``n`` from its longest member's solo time ``m`` (eq. 3-4).

    ``latency = overhead_s + m · (1 + slope · (n - 1))``: requests are padded to the longest, and
    each extra request adds ``slope`` of that time (0: batching is free; 1: no gain).
    """

    slope: float = 0.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.slope < 0 or self.overhead_s < 0:
            raise ValueError("slope and overhead are non-negative")

    def scale(self, n: int) -> float:
        return 1.0 + self.slope * (n - 1)

    def latency(self, n: int, longest_s: float) -> float:
        return self.overhead_s + longest_s * self.scale(n)
