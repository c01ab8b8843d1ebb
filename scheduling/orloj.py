"""Orloj's batch-aware, distribution-based scheduler (Yu et al., §3.2 and §4).

Per batch size ``n`` (``OrlojConfig.batch_sizes``) a queue holds the requests that can still
meet their deadline in a batch of ``n``: each request is a point on that queue's upper convex
hull (``scheduling.hull``) whose position is its eq.-2 priority curve for the latency of a
batch of ``n`` (``scheduling.priority``). As a deadline nears, the request's point moves at each
*milestone* (its slack crosses a bin edge of the latency histogram) and it leaves the queues of
the batch sizes it can no longer meet; once it cannot meet even a batch of one, it is dropped
early (reason ``deadline-unreachable``).

When the worker is free (:meth:`Orloj.next_batch`), a size is *ready* if its queue holds at
least ``n`` requests. The paper's rule (``selection="earliest-deadline"``): among the ready sizes
take those whose queue holds the overall earliest deadline, and of them the largest; the batch
is that queue's ``n`` requests of highest priority. ``selection="goodput"`` (ours) instead takes
the ready size whose top-``n`` batch has the most expected on-time finishes per second of worker
time, once the queue is overloaded; while every request can still be served in time
(``clear_in_time``, ``scheduling.clearing``) the earliest deadline goes at once with the
requests it can carry.

Priorities use the anticipated delay ``a`` (§4.1): ``OrlojConfig.delay_s``, or by default
``delay_p99`` times the p99 of one request's execution time. Point coordinates are relative to
a reference time that moves forward before ``e^{(t - t0)/a}`` nears the float range (§4.4).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Hashable, Sequence

from scheduling.clearing import by_deadline, clears, counts_of, first_if_clears
from scheduling.distribution import Distribution
from scheduling.fresh import RankedQueue, fresh_queues
from scheduling.orloj_config import OrlojConfig
from scheduling.planning import Composition, Planning, RefreshJob
from scheduling.priority import DEAD, Curve
from scheduling.profile import ModelProfile, Profiler
from scheduling.size_queue import Member, SizeQueue
from scheduling.types import UNREACHABLE, BatchDone, Decision, Drop, QueuedRequest
from scheduling.urgency import HARMLESS_LOSS, URGENT_COUNT, Urgent, lost

logger = logging.getLogger(__name__)


APP_DEPTH = 4
"""Request-aware goodput selection looks this many batches deep for each app's own batch."""


_Candidate = tuple[float, int, list[Hashable], float, float]
"""A batch weighed by goodput selection: (goodput, size of its queue, its keys, its expected
latency, its expected on-time finishes)."""


class Orloj:
    """The scheduler (``BatchScheduler``); ``profile``: the offline profile it starts from."""

    name = "orloj"

    def __init__(self, profile: ModelProfile, config: OrlojConfig | None = None,
                 profiler: Profiler | None = None) -> None:
        self.config = config or OrlojConfig()
        self.profiler = profiler or Profiler(law=profile.law)
        self._requests: dict[Hashable, QueuedRequest] = {}
        self._arrived: list[QueuedRequest] = []
        """Not placed, in arrival order: those enqueued since the last decision, after those
        an earlier decision left while no request was placed (``_from_idle``); placed by a
        decision only when the queues are needed."""
        self._left = 0
        """How many of ``_arrived`` (its head) an earlier decision left."""
        self._queues = [SizeQueue(n) for n in self.config.batch_sizes]
        self._drops: list[Drop] = []
        self._seq = itertools.count()
        self._t0 = 0.0
        self._refreshed_at = 0
        self._job_out = False
        """A refresh job is out (``refresh_job``) and has not been installed yet."""
        self.planning = Planning(profile, self.config)

    def __len__(self) -> int:
        return len(self._requests) + len(self._arrived)

    # --- profile -------------------------------------------------------------------------

    @property
    def profile(self) -> ModelProfile:
        """The profile in use."""
        return self.planning.profile

    @property
    def delay_s(self) -> float:
        """The anticipated delay ``a`` of eq. 2, in use."""
        return self.planning.delay_s

    def curve(self, app: str | None, n: int) -> Curve:
        """Eq. 2's curve for a batch of ``n`` (per app when request-aware)."""
        return self.planning.curve(app, n)

    def refresh(self, now_s: float) -> None:
        """Rebuild the profile from the profiler's windows now and re-place every request."""
        self.install(self._refresh_job()(), now_s)

    def refresh_job(self) -> RefreshJob | None:
        """The refresh that is due, to run anywhere (``background_refresh``), or None.

        None until ``refresh_every`` measurements came in since the last one, and while the
        last one has not come back (``install``). Its result goes to :meth:`install`.
        """
        if self._job_out or \
                self.profiler.observations - self._refreshed_at < self.config.refresh_every:
            return None
        self._job_out = True
        return self._refresh_job()

    def _refresh_job(self) -> RefreshJob:
        self._refreshed_at = self.profiler.observations
        return RefreshJob(self.profiler.windows(), self.profile, self.config,
                          self.planning.keys())

    def install(self, planning: Planning | None, now_s: float) -> None:
        """Plan with a refresh's result from now on and re-place every request.

        None (the profile did not move, or the job failed): keep the planning in use.
        """
        self._job_out = False
        if planning is None:
            return
        self.planning = planning
        pending = list(self._requests.values())
        self._queues = [SizeQueue(n) for n in self.config.batch_sizes]
        self._requests.clear()
        self._t0 = max(self._t0, now_s)
        for request in pending:
            self._place(request, self._t0)
        logger.debug("orloj: profile refreshed (a=%.6f s, %d apps, %d pending)", self.delay_s,
                     len(planning.profile.apps), len(pending))

    # --- the BatchScheduler interface ----------------------------------------------------

    def enqueue(self, request: QueuedRequest, now_s: float) -> None:
        self.profiler.arrival(request.app)
        self._arrived.append(request)

    def next_batch(self, now_s: float) -> Decision:
        if self._arrived:
            at_once = self._from_idle(now_s)
            if at_once is not None:
                batch, expected = at_once
                drops, self._drops = tuple(self._drops), []
                return Decision(tuple(batch), drops, expected_latency_s=expected)
        if (now_s - self._t0) / self.delay_s > self.config.rebase_after:
            self._rebase(now_s)
        for queue in self._queues:
            self._advance(queue, now_s)
        drops, self._drops = tuple(self._drops), []
        ready = self._ready(self._queues)
        if not ready:
            return Decision(drops=drops)
        keys, expected = self._choose(ready, self._queues[0], now_s)
        return Decision(self._take(keys), drops, expected_latency_s=expected)

    def completed(self, done: BatchDone) -> None:
        self.profiler.batch(len(done.batch), done.latency_s)
        if done.overhead_s is not None:
            self.profiler.overhead(done.overhead_s)
        apps = {r.key: r.app for r in done.batch}
        for key, seconds in done.solo_s.items():
            if key in apps:
                self.profiler.solo(apps[key], seconds)
        if not self.config.background_refresh and \
                self.profiler.observations - self._refreshed_at >= self.config.refresh_every:
            self.refresh(done.started_s + done.latency_s)

    # --- queues --------------------------------------------------------------------------

    def _from_idle(self, now_s: float) -> tuple[list[QueuedRequest], float] | None:
        """Place the requests that arrived since the last decision, or return the batch to send.

        The size queues are for requests that wait long, many at a time. While none is placed,
        the batch they would give is found without placing the requests not placed yet (those
        that arrived since the last decision, and those it left): one arrival that can still
        make a batch of one goes alone (the only batch the queues would give); several, up to
        ``hull.SMALL``, are weighed on queues that rank them as the size queues would, from
        their slack now, without hulls and heaps (``scheduling.fresh``), and those the batch
        leaves stay unplaced for the next decision. Placing a request costs a hull insertion
        and two heap pushes per batch size, taking it out as much, and moving it at each of
        its milestones more: most of a decision's CPU time at a moderate load, where the
        queue holds a handful of requests, spent while the worker waits.
        """
        arrived, self._arrived = self._arrived, []
        left, self._left = self._left, 0
        if not self._requests:  # an idle queue: no point keeps the old reference time
            self._t0 = now_s
            size = self._queues[0].size
            alive = []
            for request in arrived:  # the requests that make no queue are dropped, as placed
                if self.curve(request.app, size).regime(request.deadline_s - now_s) == DEAD:
                    self._drops.append(Drop(request, UNREACHABLE))
                else:
                    alive.append(request)
            if len(arrived) == 1 and alive and not left:
                return alive, self._mix_latency(1).mean()
            found = self._fresh_choice(alive, now_s)
            if found is not None:
                chosen = {r.key for r in found[0]}
                self._arrived = [r for r in alive if r.key not in chosen]
                self._left = len(self._arrived)
                return found
            arrived = alive
        for request in arrived:
            self._place(request, now_s)
        return None

    def _fresh_choice(self, requests: list[QueuedRequest],
                      now_s: float) -> tuple[list[QueuedRequest], float] | None:
        """The batch ``_choose`` would take if ``requests`` were the whole queue, placed now.

        With its expected latency. While the queue can be cleared, the clearing schedule's
        first batch (``_clearing_batch``) where goodput selection serves it; else the choice
        on queues that rank ``requests`` as the size queues would (``scheduling.fresh``).
        None where it is left to the size queues: no request, or one that they might rank
        otherwise.
        """
        if not requests:
            return None
        tried = self._clearing_first()
        if tried:
            cleared = self._clearing_batch(requests, now_s)
            if cleared is not None:
                return cleared
        queues = fresh_queues(requests, now_s, self.curve, self.config.batch_sizes)
        if queues is None:
            return None
        for request in requests:  # known to the choice (apps, deadlines) while it weighs
            self._requests[request.key] = request
        keys, expected = self._choose(self._ready(queues), queues[0], now_s,
                                      clearable=not tried)
        batch = [self._requests[key] for key in keys]
        for request in requests:  # the caller places those left
            del self._requests[request.key]
        return batch, expected

    def _clearing_first(self) -> bool:
        """Whether ``_choose`` serves the clearing schedule's first batch while it can."""
        cfg = self.config
        return cfg.selection == "goodput" and cfg.clear_in_time and \
            cfg.while_clearable == "earliest-deadline"

    def _place(self, request: QueuedRequest, now_s: float) -> None:
        """Put ``request`` in the queue of every size it can still meet; else drop it."""
        slack = request.deadline_s - now_s
        placed = False
        for queue in self._queues:  # feasible sizes are a prefix: a batch only grows slower
            curve = self.curve(request.app, queue.size)
            regime = curve.regime(slack)
            if regime == DEAD:
                break
            self._join(queue, request, curve, regime, 0)
            placed = True
        if placed:
            self._requests[request.key] = request
        else:
            self._drops.append(Drop(request, UNREACHABLE))

    def _join(self, queue: SizeQueue, request: QueuedRequest, curve: Curve, regime: int,
              generation: int) -> None:
        a, beta = curve.point(regime, request.deadline_s - self._t0)
        queue.hull.insert(request.key, a, beta)
        joined = request.key not in queue.members
        queue.members[request.key] = Member(regime, generation)
        if joined:
            heapq.heappush(queue.deadlines, (request.deadline_s, next(self._seq), request.key))
            if len(queue.deadlines) > 2 * len(queue.members) + 64:  # drop departed entries
                queue.deadlines = [e for e in queue.deadlines if e[2] in queue.members]
                heapq.heapify(queue.deadlines)
        heapq.heappush(queue.milestones, (curve.leaves_at(regime, request.deadline_s),
                                          next(self._seq), request.key, generation))

    def _advance(self, queue: SizeQueue, now_s: float) -> None:
        """Move the requests whose slack crossed a bin edge; drop those out of every queue."""
        heap = queue.milestones
        while heap and heap[0][0] <= now_s:
            _, _, key, generation = heapq.heappop(heap)
            member = queue.members.get(key)
            if member is None or member.generation != generation:
                continue
            request = self._requests[key]
            curve = self.curve(request.app, queue.size)
            regime = min(curve.regime(request.deadline_s - now_s), member.regime - 1)
            if regime >= 0:
                self._join(queue, request, curve, regime, generation + 1)
                continue
            queue.leave(key)
            if queue.size == 1:  # out of the smallest size: out of all of them
                for other in self._queues:
                    other.leave(key)
                del self._requests[key]
                self._drops.append(Drop(request, UNREACHABLE))

    def _rebase(self, now_s: float) -> None:
        self._t0 = now_s
        for queue in self._queues:
            for key, member in queue.members.items():
                request = self._requests[key]
                curve = self.curve(request.app, queue.size)
                queue.hull.insert(key, *curve.point(member.regime, request.deadline_s - now_s))

    def _choose(self, ready: Sequence[RankedQueue], smallest: RankedQueue, now_s: float,
                clearable: bool = True) -> tuple[list[Hashable], float]:
        """The keys to batch (from one of the ``ready`` queues) and their expected latency.

        ``smallest``: the queue of batches of one (every request is in it). ``clearable``:
        whether the queue may still be cleared in time (False: found it cannot, just now).
        """
        if self.config.selection == "goodput":
            cfg = self.config
            if clearable and self._clearing_first():
                first = self._clearing_batch(list(self._requests.values()), now_s)
                if first is not None:
                    return [r.key for r in first[0]], first[1]
            best: _Candidate | None = None
            harmless: _Candidate | None = None
            urgent = self._urgent(smallest, now_s)
            entries: list[_Candidate] = []
            for queue in ready:
                for keys in self._candidates(queue, now_s):
                    entry = self._candidate(queue.size, keys, now_s)
                    entries.append(entry)
                    if best is None or entry[:2] > best[:2]:
                        best = entry
                    if urgent and (harmless is None or entry[:2] > harmless[:2]) and \
                            lost(keys, urgent, entry[3]) <= HARMLESS_LOSS:
                        harmless = entry
            assert best is not None  # ready is not empty
            if harmless is not None and harmless is not best and lost(
                    best[2], urgent, best[3]) > HARMLESS_LOSS and self._waits(
                    best, harmless[3], now_s):
                # the best batch would cost an urgent request its chance, and it can still
                # finish as well after one that costs nobody theirs: that one first
                best = harmless
            if cfg.clear_in_time and cfg.while_clearable == "goodput":
                best = self._keep_clearable(best, entries, now_s)
            return best[2], best[3]
        earliest = min(q.earliest() for q in ready)
        queue = max((q for q in ready if q.earliest() == earliest), key=lambda q: q.size)
        keys = self._top(queue, now_s)
        return keys, self._mix_latency(len(keys)).mean()

    def _keep_clearable(self, best: _Candidate, entries: list[_Candidate],
                        now_s: float) -> _Candidate:
        """``best``, unless it would make a queue that can be cleared in time unclearable.

        Cleared in time (``_clears``): served in deadline order, in batches, every request
        finishes by its deadline. When the queue can be cleared from now but not after
        ``best``, ``best`` would cost a request its deadline for nothing (everyone could be
        served): the candidate of most goodput after which it still can be goes instead, or
        else the request of earliest deadline alone. A queue that cannot be cleared even from
        now is overloaded: goodput decides who finishes. Without this, at loose objectives,
        short requests' batches (more finishes per second) keep long requests waiting until
        they cannot finish even alone.
        """
        order = self._deadline_order()
        if order is None:
            return best
        if self._clears(order, now_s + best[3], set(best[2])) or not self._clears(order, now_s):
            return best
        keeping = [e for e in entries if self._clears(order, now_s + e[3], set(e[2]))]
        if keeping:
            return max(keeping, key=lambda e: e[:2])
        return self._candidate(self._queues[0].size, [order[0].key], now_s)

    def _clearing_batch(self, requests: list[QueuedRequest],
                        now_s: float) -> tuple[list[QueuedRequest], float] | None:
        """The clearing schedule's first batch of ``requests`` and its mean latency, or None.

        None once they cannot all be cleared in time (or are too many to check,
        ``clearing.CLEAR_LIMIT``): goodput decides then. While they can, the earliest
        deadline goes now with what it can carry (``clearing.first_batch``): served as soon
        as possible, a request keeps for the machine's jitter the slack that a batch picked
        for goodput would have spent on other requests first.
        """
        order = by_deadline(requests)
        if order is None:
            return None
        return first_if_clears(order, now_s, self._latency_of, self.config.batch_sizes[-1])

    def _deadline_order(self) -> list[QueuedRequest] | None:
        """The queued requests by deadline, for the clearing check (None: too many)."""
        return by_deadline(list(self._requests.values()))

    def _counts(self, keys: list[Hashable]) -> dict[str, int]:
        """Requests per app among ``keys``."""
        return counts_of([self._requests[key] for key in keys])

    def _candidate(self, size: int, keys: list[Hashable], now_s: float) -> _Candidate:
        """The batch ``keys`` from the queue of ``size``, weighed: goodput first.

        Goodput: expected on-time finishes per second of worker time.
        """
        on_time, expected = self._on_time(keys, now_s)
        return (on_time / max(expected, 1e-12), size, keys, expected, on_time)

    def _clears(self, order: list[QueuedRequest], start_s: float,
                skip: set[Hashable] | None = None) -> bool:
        """``scheduling.clearing.clears`` with this profile's batch latencies."""
        return clears(order, start_s, self._latency_of, self.config.batch_sizes[-1],
                      skip or ())

    def _latency_of(self, counts: dict[str, int]) -> tuple[float, float]:
        """(mean, p99) latency of a batch with ``counts`` requests per app, cached."""
        if len(counts) == 1:  # most batches: one app's (no sorting)
            ((app, count),) = counts.items()
            return self.planning.moments(((app, count),) if count else ())
        return self.planning.moments(tuple(sorted((a, c) for a, c in counts.items() if c)))

    def _ready(self, queues: Sequence[RankedQueue]) -> list[RankedQueue]:
        """The sizes a batch can be formed at.

        A full queue, or (``partial_batches``) one holding more requests than the next
        smaller size.
        """
        if not self.config.partial_batches:
            return [q for q in queues if len(q.members) >= q.size]
        ready: list[RankedQueue] = []
        below = 0
        for queue in queues:
            if len(queue.members) > below:
                ready.append(queue)
            below = queue.size
        return ready

    def _candidates(self, queue: RankedQueue, now_s: float) -> list[list[Hashable]]:
        """The batches of ``queue``'s size worth weighing (see ``OrlojConfig.selection``)."""
        if not self._several_apps():
            return [self._top(queue, now_s)]
        ranked = self._top(queue, now_s, APP_DEPTH * queue.size)
        found = [ranked[:queue.size]]
        by_app: dict[str, list[Hashable]] = {}
        for key in ranked:
            by_app.setdefault(self._requests[key].app, []).append(key)
        if len(by_app) > 1:  # a mixed top: each app's own batch too
            found += [keys[:queue.size] for keys in by_app.values()]
        return found

    def _urgent(self, smallest: RankedQueue, now_s: float) -> list[Urgent]:
        """The requests of highest priority overall (none with one app, or not request-aware).

        The size-1 queue (``smallest``) holds every request; every candidate batch is
        weighed against what it costs them (``scheduling.urgency``).
        """
        if not self._several_apps():
            return []
        top = [self._requests[key] for key in self._top(smallest, now_s, URGENT_COUNT)]
        return [Urgent.alone(r.key, r.deadline_s - now_s, self._composition(((r.app, 1),)))
                for r in top]

    def _several_apps(self) -> bool:
        """Whether requests are told apart by app (request-aware) and there are several."""
        return self.config.request_aware and len(self.profile.apps) > 1

    def _waits(self, batch: _Candidate, wait_s: float, now_s: float) -> bool:
        """Whether ``batch`` sent ``wait_s`` later finishes about as many on time."""
        return batch[4] - self._on_time(batch[2], now_s + wait_s)[0] <= HARMLESS_LOSS

    def _top(self, queue: RankedQueue, now_s: float, count: int = 0) -> list[Hashable]:
        """The ``count`` (default: ``size``) keys of highest priority in ``queue`` at ``now_s``."""
        return queue.top(math.exp((now_s - self._t0) / self.delay_s), count)

    def _on_time(self, keys: list[Hashable], now_s: float) -> tuple[float, float]:
        """(expected on-time finishes, expected latency) of a batch sent at ``now_s``.

        Request-aware, the batch's latency is that of its actual members' apps (eq. 7-8 on
        the known composition, the overhead's distribution added); otherwise, or for a static
        model (one draw per batch), the size's mixture estimate. One CDF lookup per member.
        """
        requests = [self._requests[key] for key in keys]
        slacks = [r.deadline_s - now_s for r in requests]
        if not self.config.request_aware or self.profile.per_batch:
            latency = self._mix_latency(len(requests))
        else:
            latency = self._composition(tuple(sorted(self._counts(keys).items())))
        return sum(latency.cdf_list(slacks)), latency.mean()

    def _mix_latency(self, n: int) -> Distribution:
        """Latency of a batch of ``n`` drawn from the model's mixture (§4.3)."""
        return self.planning.mix_latency(n)

    def _composition(self, counts: Composition) -> Distribution:
        """The latency of a batch with ``counts`` requests per app (cached per profile)."""
        return self.planning.composition(counts)

    def _take(self, keys: list[Hashable]) -> tuple[QueuedRequest, ...]:
        batch = []
        for key in keys:
            for other in self._queues:
                other.leave(key)
            batch.append(self._requests.pop(key))
        return tuple(batch)

