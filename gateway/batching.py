"""Batch scheduling in an app's queue: Orloj or one of its baselines picks what is sent, and when.

For an app with a scheduler (``--scheduler APP=NAME``), :class:`BatchPolicy` is the queue's
dispatch policy. Apps given the same ``--model-queue`` name share one policy (the per-model
queue of Orloj §3.2): one scheduler sees all their requests, each with its own app's execution
times and objective, and batches them together; a batch's requests whose apps are served at
different places (one moved after a failover) go in separate Triton requests.

1. each inference request is wrapped as a ``QueuedRequest`` whose deadline is the earlier of
   its own (its timeout) and its arrival plus the app's latency objective, handed to the
   scheduler (``enqueue``), and waits for its answer;
2. one dispatcher task per queue asks the scheduler for the next batch at ``time.monotonic()``
   whenever the queue's worker (the serving replica) is free; requests the scheduler drops are
   answered at once with :class:`DroppedError`, whose reason says why
   (``deadline-unreachable``: it can no longer finish in time, even alone), and counted in the
   metrics; a batch is sent as one Triton request with the batch dimension
   (``gateway.batch_wire``) through the usual exchange, so a failover cancels and resends it to
   the new replica like any request; with nothing to send, the task sleeps until the
   scheduler's ``wake_at_s`` or the next arrival, and ends when the queue is empty;
3. the answer is cut back into each request's rows; the batch's time, each row's execution
   time when the model reports it, and then the batch's overhead beside the model's time (its
   latency minus the longest reported execution), go back to the scheduler (``completed``) and
   to the window its profile is rebuilt from (``gateway.calibration``).

The first requests of a queue are its warm-up: sent one at a time, each followed by a probe, to
measure the execution times and the batch law every scheduler starts from. The scheduler's CPU
time per decision (``next_batch`` and the ``enqueue`` calls since the previous one) is measured
and exposed in the metrics.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.batch_wire import (
    Member,
    exec_times,
    groups,
    pack,
    probe,
    read_member,
    read_outputs,
    split,
)
from gateway.calibration import (
    REFRESH_EVERY,
    Calibration,
    batch_sizes,
    describe_apps,
    describe_overhead,
    make_scheduler,
    profile_of,
    replan,
)
from gateway.errors import (
    DeadlineError,
    DroppedError,
    GatewayError,
    StoppingError,
    UnavailableError,
)
from gateway.exchange import Answer, InferRequest
from gateway.queue import Submit
from gateway.tensors import NotCodable
from scheduling.baselines import TritonBatcher
from scheduling.orloj import Orloj
from scheduling.planning import Planning
from scheduling.profile import ModelProfile
from scheduling.types import (
    EXPIRED,
    UNREACHABLE,
    BatchDone,
    BatchLaw,
    BatchScheduler,
    Drop,
    QueuedRequest,
)

logger = logging.getLogger(__name__)

WARMUP_REQUESTS = 24
"""Requests sent alone (each with a probe) before the app's scheduler takes over."""
SOLO_WINDOW = 2048
FALLBACK_WAKE_S = 0.005
"""With requests waiting, no batch and no wake-up time: look again after this long."""
PROBE_DEADLINE_S = 2.0
INFER_SUFFIXES = ("/infer", "ModelInfer")


class SchedulerEvents(Protocol):
    """What a batch policy reports (the metrics)."""

    def decided(self, queue_id: str, scheduler: str, cpu_s: float, batch_size: int) -> None: ...

    def dropped(self, app_id: str, scheduler: str, reason: str) -> None: ...

    def batch_overhead(self, queue_id: str, seconds: float) -> None: ...

    def profile_refreshed(self, queue_id: str, outcome: str) -> None: ...


class _NoEvents:
    def decided(self, queue_id: str, scheduler: str, cpu_s: float, batch_size: int) -> None:
        return None

    def dropped(self, app_id: str, scheduler: str, reason: str) -> None:
        return None

    def batch_overhead(self, queue_id: str, seconds: float) -> None:
        return None

    def profile_refreshed(self, queue_id: str, outcome: str) -> None:
        return None


@dataclass(frozen=True)
class BatchSettings:
    """One queue's scheduling settings."""

    scheduler: str
    max_batch: int = 8
    exec_output: str = "exec_us"
    warmup_requests: int = WARMUP_REQUESTS


@dataclass(eq=False)
class _Waiting:
    member: Member
    future: asyncio.Future[Answer]
    arrival: float


class BatchPolicy:
    """The dispatch policy of one queue (an app, or apps sharing a model) with a batch scheduler.

    See the module doc. ``place``: where an app is served now (requests of apps served at
    different places never share a Triton request); by default all in one place.
    """

    def __init__(self, queue_id: str, settings: BatchSettings,
                 slo_ms: Callable[[str], float | None], *,
                 place: Callable[[str], Hashable] | None = None,
                 events: SchedulerEvents | None = None,
                 stopping: Callable[[], asyncio.Future[None]] | None = None,
                 refresher: Executor | None = None) -> None:
        self.queue_id = queue_id
        self.settings = settings
        self.slo_ms = slo_ms
        """An app's latency objective now (None: none; requests keep their own timeouts)."""
        self.place = place or (lambda app_id: None)
        self.events: SchedulerEvents = events or _NoEvents()
        self.stopping = stopping
        self.refresher = refresher
        """Where Orloj's profile refreshes are built (None: the loop's default executor)."""
        self.calibration = Calibration()
        self.scheduler: BatchScheduler = TritonBatcher(1, 0.0)
        """The warm-up's: one request at a time, in arrival order."""
        self.warm = False
        self.slo_s = 0.0
        self.profile: ModelProfile | None = None
        self.solo: dict[str, deque[float]] = {}
        """Per app: the window of solo execution times its profile is built from."""
        self.arrivals: deque[str] = deque(maxlen=SOLO_WINDOW)
        """The apps of the latest requests (the weights of the model's mixture)."""
        self.since_replan = 0
        self.waiting: dict[Hashable, _Waiting] = {}
        self.decision_cpu_s: deque[float] = deque(maxlen=4096)
        self._pending_cpu_s = 0.0
        self._ids = itertools.count(1)
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._send: Submit | None = None
        self._timeouts: deque[float] = deque(maxlen=256)
        self._probe_sizes = itertools.cycle(batch_sizes(settings.max_batch)[1:] or (1,))
        self.clock: Callable[[], float] = time.monotonic
        """The schedulers' clock: arrivals, deadlines, decisions and measured latencies. Not
        ``loop.time()``: uvloop's is in whole milliseconds, cached per loop turn, and a model
        that answers in about a millisecond would be measured as 0, 1 or 2."""

    @property
    def name(self) -> str:
        """The scheduler's name (``warmup`` until the warm-up is over)."""
        return self.settings.scheduler if self.warm else "warmup"

    def decision_cpu_p50_s(self) -> float:
        """Median CPU time of the recent decisions (0 before the first)."""
        return statistics.median(self.decision_cpu_s) if self.decision_cpu_s else 0.0

    # --- requests ------------------------------------------------------------------------

    async def dispatch(self, request: InferRequest, send: Submit) -> Answer:
        if request.suffix not in INFER_SUFFIXES:
            return await send(request)
        await request.whole_body()  # its tensors are read below
        self._send = send
        loop = asyncio.get_running_loop()
        now = self.clock()
        key = next(self._ids)
        deadline = self._deadline(request, now, loop.time())
        waiting = _Waiting(read_member(key, request), loop.create_future(), now)
        self.waiting[key] = waiting
        self.arrivals.append(request.app_id)
        started = time.thread_time()
        self.scheduler.enqueue(QueuedRequest(key, request.app_id, now, deadline), now)
        self._pending_cpu_s += time.thread_time() - started
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"scheduler-{self.queue_id}")
        try:
            return await self._answer(waiting, request)
        finally:
            self.waiting.pop(key, None)  # answered, failed, or its client went away

    def _deadline(self, request: InferRequest, now: float, loop_now: float) -> float:
        """The request's deadline on ``self.clock`` (its own is on the loop's clock)."""
        own = now + (request.deadline - loop_now)
        self._timeouts.append(own - now)
        slo_ms = self.slo_ms(request.app_id)
        if slo_ms is None or not self.warm:  # the warm-up serves everything it can
            return own
        return min(own, now + slo_ms / 1000.0)

    async def _answer(self, waiting: _Waiting, request: InferRequest) -> Answer:
        waits: list[asyncio.Future[Any]] = [waiting.future]
        stopping = self.stopping() if self.stopping is not None else None
        if stopping is not None:
            waits.append(stopping)
        remaining = request.deadline - asyncio.get_running_loop().time()
        await asyncio.wait(waits, timeout=max(0.0, remaining),
                           return_when=asyncio.FIRST_COMPLETED)
        if waiting.future.done():
            return waiting.future.result()
        if stopping is not None and stopping.done():
            raise StoppingError("the gateway is stopping")
        raise DeadlineError(f"{request.app_id}: no answer before the deadline (queued in the "
                            f"{self.name} scheduler or in its batch)")

    # --- the dispatcher ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # noqa: BLE001 - no request may wait for a dead dispatcher
            logger.exception("%s: the %s scheduler failed", self.queue_id, self.name)
            for waiting in list(self.waiting.values()):
                if not waiting.future.done():
                    waiting.future.set_exception(UnavailableError(
                        f"{self.queue_id}: the {self.name} scheduler failed: {exc}"))

    async def _loop(self) -> None:
        while True:  # ends once the queue is empty (the next arrival starts another)
            if self.stopping is not None and self.stopping().done():
                return
            now = self.clock()
            started = time.thread_time()
            decision = self.scheduler.next_batch(now)
            cpu = time.thread_time() - started + self._pending_cpu_s
            self._pending_cpu_s = 0.0
            self._drop(decision.drops, now)
            batch = [r for r in decision.batch if r.key in self.waiting]
            if decision.batch:
                self.decision_cpu_s.append(cpu)
                self.events.decided(self.queue_id, self.name, cpu, len(decision.batch))
            if batch:
                await self._serve(batch, self.clock())
                continue
            if decision.batch:
                continue
            if not len(self.scheduler):
                return
            wake = decision.wake_at_s
            self._arrived.clear()
            timeout = FALLBACK_WAKE_S if wake is None else max(0.0, wake - now)
            try:
                async with asyncio.timeout(timeout):
                    await self._arrived.wait()
            except TimeoutError:
                pass

    def _drop(self, drops: tuple[Drop, ...], now: float) -> None:
        for drop in drops:
            waiting = self.waiting.get(drop.request.key)
            if waiting is None or waiting.future.done():
                continue
            self.events.dropped(drop.request.app, self.name, drop.reason)
            waiting.future.set_exception(self._drop_error(drop, now))

    def _drop_error(self, drop: Drop, now: float) -> GatewayError:
        request = drop.request
        left_ms = (request.deadline_s - now) * 1000.0
        waited_ms = (now - request.arrival_s) * 1000.0
        if drop.reason == UNREACHABLE:
            why = (f"its deadline can no longer be met ({left_ms:.1f} ms left after "
                   f"{waited_ms:.1f} ms queued)")
        elif drop.reason == EXPIRED:
            why = f"its deadline passed while it was queued ({waited_ms:.1f} ms)"
        else:
            why = "the batch planned for it missed its execution window"
        return DroppedError(f"{request.app}: dropped by the {self.name} scheduler: {why} "
                            f"[{drop.reason}]", drop.reason)

    async def _serve(self, batch: list[QueuedRequest], started: float) -> None:
        members = [self.waiting[r.key].member for r in batch]
        results = await asyncio.gather(
            *(self._send_group(g) for g in groups(
                members, self.settings.max_batch, lambda m: self.place(m.request.app_id))))
        latency = self.clock() - started
        execs: dict[Hashable, float] = {}
        for found in results:
            execs.update(found)
        if not self.warm:
            await self._warmup(members[0], latency, execs.get(members[0].key))
            return
        self._learn(tuple(batch), started, latency, execs)

    async def _send_group(self, group: list[Member]) -> dict[Hashable, float]:
        """Send one Triton request of a batch; answer its members; their execution times."""
        assert self._send is not None  # noqa: S101 - set by the first dispatch
        if group[0].query is None:
            await self._settle(group, self._send(group[0].request), passthrough=True)
            return {}
        body, headers = pack(group)
        deadline = max(m.request.deadline for m in group)
        request = InferRequest(group[0].request.app_id, deadline, body, headers)
        return await self._settle(group, self._send(request), passthrough=False)

    async def _settle(self, group: list[Member], sent: Any, passthrough: bool
                      ) -> dict[Hashable, float]:
        try:
            answer: Answer = await sent
        except GatewayError as exc:
            self._fail(group, exc)
            return {}
        except Exception as exc:  # noqa: BLE001 - every member gets an answer
            logger.exception("%s: batch of %d failed", self.queue_id, len(group))
            self._fail(group, UnavailableError(f"{self.queue_id}: batch failed: {exc}"))
            return {}
        if passthrough or answer.reply.status != 200:
            for member in group:  # an error (or an unbatched reply) goes to each as it is
                self._resolve(member, answer)
            return {}
        try:
            outputs = read_outputs(answer.reply)
            replies = split(outputs, group)
        except (NotCodable, ValueError) as exc:
            self._fail(group, UnavailableError(f"{self.queue_id}: the batch's reply could not "
                                               f"be split: {exc}"))
            return {}
        for member, reply in zip(group, replies, strict=True):
            self._resolve(member, Answer(reply, answer.route, answer.attempts, answer.resends,
                                         answer.hedged, answer.hedge_won))
        return exec_times(outputs, group, self.settings.exec_output)

    def _resolve(self, member: Member, answer: Answer) -> None:
        waiting = self.waiting.get(member.key)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_result(answer)

    def _fail(self, group: list[Member], error: GatewayError) -> None:
        for member in group:
            waiting = self.waiting.get(member.key)
            if waiting is not None and not waiting.future.done():
                waiting.future.set_exception(error)

    # --- profile -------------------------------------------------------------------------

    async def _warmup(self, member: Member, latency: float, exec_s: float | None) -> None:
        """Keep a request sent alone, probe batching with its rows, and maybe take over."""
        calibration = self.calibration
        calibration.alone.append(latency)
        calibration.apps.append(member.request.app_id)
        if exec_s is not None:
            calibration.alone_exec.append(exec_s)
        if member.query is not None and self._send is not None:
            n = next(self._probe_sizes)
            if n > 1 and member.rows * n <= self.settings.max_batch:
                await self._probe(member, n, latency)
        if len(calibration.alone) >= self.settings.warmup_requests:
            self._take_over()

    async def _probe(self, member: Member, n: int, alone_s: float) -> None:
        assert self._send is not None  # noqa: S101
        body, headers = probe(member, n)
        started = self.clock()
        deadline = asyncio.get_running_loop().time() + PROBE_DEADLINE_S
        try:
            answer = await self._send(InferRequest(member.request.app_id, deadline, body,
                                                   headers))
        except GatewayError as exc:
            logger.debug("%s: probe of %d failed: %s", self.queue_id, n, exc)
            return
        if answer.reply.status == 200:
            self.calibration.probes.setdefault(n, []).append((self.clock() - started, alone_s))

    def _take_over(self) -> None:
        """End the warm-up: build the queue's scheduler and hand it the requests waiting."""
        law = self.calibration.law()
        for app_id, times in self.calibration.solo_by_app().items():
            self._window(app_id).extend(times)
        self.profile = self._profile(law, self.calibration.static())
        self.slo_s = self._queue_slo_s()
        scheduler = make_scheduler(self.settings.scheduler, self.profile, self.slo_s,
                                   self.settings.max_batch)
        now = self.clock()
        pending = list(getattr(self.scheduler, "queue", ()))
        for request in pending:
            scheduler.enqueue(request, now)
        self.scheduler = scheduler
        self.warm = True
        logger.info("%s: %s scheduler on (SLO %.1f ms, solo p50 / p99 ms: %s; batch law "
                    "slope %.3f, overhead %.3f ms, %d requests handed over)", self.queue_id,
                    self.settings.scheduler, self.slo_s * 1000, describe_apps(self.profile),
                    law.slope, law.overhead_s * 1000, len(pending))

    def _learn(self, batch: tuple[QueuedRequest, ...], started: float, latency: float,
               execs: dict[Hashable, float]) -> None:
        """Report a finished batch to the scheduler and the window of solo times."""
        assert self.profile is not None  # noqa: S101 - warm
        law = self.profile.law
        scale = law.scale(len(batch))
        # a reported time runs from the batch's start to the row's exit, slowed by the rows
        # beside it: the law's scale takes that back out
        solo = {key: seconds / scale for key, seconds in execs.items()}
        if not solo and batch:  # a static model: the batch's time, per request alone
            solo[batch[0].key] = max(0.0, latency - law.overhead_s) / scale
        app_of = {request.key: request.app for request in batch}
        for key, seconds in solo.items():
            self._window(app_of[key]).append(seconds)
        self.since_replan += len(solo)
        # beyond the model's own time: transfer, Triton and this gateway, under the load of now
        # (a model that reports more than the batch took measured itself on another clock)
        overhead = max(0.0, latency - max(execs.values())) if execs else None
        if overhead is not None:
            self.events.batch_overhead(self.queue_id, overhead)
        self.scheduler.completed(BatchDone(batch, started, latency, solo, overhead))
        if isinstance(self.scheduler, Orloj):  # refreshes its own profile, off the loop
            self._refresh(self.scheduler)
        elif self.since_replan >= REFRESH_EVERY:
            self.since_replan = 0
            self.profile = self._profile(self.profile.law, self.profile.per_batch)
            self.slo_s = self._queue_slo_s()
            replan(self.scheduler, self.profile, self.slo_s, self.settings.max_batch)

    def _refresh(self, orloj: Orloj) -> None:
        """Start Orloj's due profile refresh on the refresher's thread, if one is due.

        Building the distributions and curves takes milliseconds of CPU; on the event loop
        it would hold every queue's requests meanwhile. The result is installed on the loop.
        """
        job = orloj.refresh_job()
        if job is None:
            return
        future = asyncio.get_running_loop().run_in_executor(self.refresher, job)
        future.add_done_callback(functools.partial(self._install, orloj))

    def _install(self, orloj: Orloj, future: asyncio.Future[Planning | None]) -> None:
        planning: Planning | None = None
        if future.cancelled():
            outcome = "failed"
        elif future.exception() is not None:
            outcome = "failed"
            logger.warning("%s: profile refresh failed, the profile in use is kept: %r",
                           self.queue_id, future.exception())
        else:
            planning = future.result()
            outcome = "unchanged" if planning is None else "installed"
        orloj.install(planning, self.clock())
        self.events.profile_refreshed(self.queue_id, outcome)
        if planning is not None:
            logger.info("%s: profile refreshed (solo p50 / p99 ms: %s; overhead p50 %s)",
                        self.queue_id, describe_apps(planning.profile),
                        describe_overhead(planning.profile))

    def _queue_slo_s(self) -> float:
        """The one objective the fixed-profile baselines plan for.

        The tightest of the queue's recent apps' (else the median request timeout).
        """
        slos = [ms for ms in map(self.slo_ms, sorted(set(self.arrivals))) if ms is not None]
        if slos:
            return min(slos) / 1000.0
        return statistics.median(self._timeouts) if self._timeouts else 1.0

    def _window(self, app_id: str) -> deque[float]:
        window = self.solo.get(app_id)
        if window is None:
            window = self.solo[app_id] = deque(maxlen=SOLO_WINDOW)
        return window

    def _profile(self, law: BatchLaw, per_batch: bool) -> ModelProfile:
        """The queue's profile from its windows, its apps weighed by their recent requests."""
        return profile_of(self.solo, law, per_batch, Counter(self.arrivals),
                          pooled=self.queue_id)
