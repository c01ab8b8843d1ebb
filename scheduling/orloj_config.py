"""Orloj's knobs: the paper's rules by default, our departures as options (docs/scheduling.md)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class OrlojConfig(BaseModel):
    """Orloj's knobs (times in seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    delay_s: float | None = Field(default=None, gt=0)
    """The anticipated delay ``a`` of eq. 2; None: ``delay_p99`` × p99 solo execution time."""
    delay_p99: float = Field(default=1.0, gt=0)
    penalty: float = Field(default=1.0, gt=0)
    """Cost of a missed deadline (the same for every request: maximise the finish rate)."""
    bins: int = Field(default=16, ge=1, le=256)
    """Histogram bins of eq. 2."""
    min_probability: float = Field(default=0.0, ge=0, lt=1)
    """A request leaves size ``n``'s queue once P(batch of n meets its deadline) < this; 0:
    once it is nil (the paper). Below it even alone, it is dropped (``deadline-unreachable``):
    a request that nearly surely misses would hold the worker from requests that can finish."""
    request_aware: bool = False
    """Estimate a request's batch latency with its own app's distribution for itself and the
    mixture for the others (ours), instead of the mixture for all (§4.3)."""
    selection: Literal["earliest-deadline", "goodput"] = "earliest-deadline"
    """``goodput`` (ours): of the ready sizes' candidate batches, the one with the most expected
    on-time finishes per second of worker time; with ``request_aware`` and several apps, a
    size's candidates are its top ``n`` and, per app, that app's top ``n`` among the
    ``APP_DEPTH * n`` highest priorities (a batch of short requests only runs short); then,
    when the best batch would cost one of the most urgent requests left out its chance of
    finishing, the best batch costing none goes first if the best one's requests can still
    finish after it (short requests do not starve long ones while they can wait)."""
    clear_in_time: bool = True
    """With ``goodput``: while the queue could still be cleared in time (served in deadline
    order, in batches, every request finishing by its deadline), never pick a batch after
    which it could not (``Orloj._keep_clearable``); goodput alone decides once it is
    overloaded."""
    while_clearable: Literal["goodput", "earliest-deadline"] = "earliest-deadline"
    """With ``clear_in_time``, which batch goes while the queue can be cleared in time:
    ``goodput``, the candidate of most goodput among those that keep it clearable;
    ``earliest-deadline``, the clearing schedule's own first batch (the earliest deadline and
    the requests after it in deadline order that it can take along), served as soon as
    possible rather than as late as the estimates allow."""
    partial_batches: bool = False
    """Also form a batch from size ``n``'s queue when it holds fewer than ``n`` requests but
    more than the next smaller size (ours: the batch runs at the size it has); False: only
    full queues are ready."""
    refresh_every: int = Field(default=512, ge=1)
    """Profiler measurements between two profile refreshes."""
    refresh_tolerance: float = Field(default=0.0, ge=0, lt=1)
    """Keep the profile in use when no distribution of the new one (each app's, the mixture,
    the overhead) is further from its counterpart than this, as the largest gap between their
    CDFs; 0: rebuild at every refresh (the paper)."""
    background_refresh: bool = False
    """Leave due refreshes to the caller (``Orloj.refresh_job``, run anywhere, its result given
    to ``Orloj.install``) instead of refreshing inside ``completed``: the gateway runs them on a
    worker thread, so its event loop does not stall while the curves are rebuilt (§3.2). False:
    ``completed`` refreshes on the spot (the simulator, whose clock does not move meanwhile)."""
    rebase_after: float = Field(default=500.0, gt=0, le=700)
    """Move the reference time once (now - t0) / a exceeds this (e^700 is near float max)."""

    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if not sizes or min(sizes) < 1 or 1 not in sizes:
            raise ValueError("batch sizes are positive and include 1")
        return tuple(sorted(set(sizes)))


OURS: Mapping[str, Any] = MappingProxyType({
    "request_aware": True, "selection": "goodput", "partial_batches": True,
    "min_probability": 0.1})
"""Our departures from the paper (docs/scheduling.md), on together: the simulator's "Orloj
(ours)" and the gateway's ``orloj`` scheduler. ``OrlojConfig(**OURS, batch_sizes=...)``."""
