"""The per-app queue every inference request passes through, and its dispatch policy.

``AppQueue.submit(request) -> Answer`` is the seam where request-level schemes plug in: a
:class:`DispatchPolicy` decides when and how the app's requests reach the dispatcher. Parity
coding (ParM: encode k queries into a parity query, decode a late one) and distribution-aware
batching (Orloj: order requests and size batches from the execution-time distribution against
each request's deadline) are policies that see every request of the app here. The policy today
is :class:`FifoPolicy`: pass-through in arrival order with a bound on what is in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.errors import DeadlineError, GatewayError, QueueFullError
from gateway.exchange import Answer, InferRequest

Submit = Callable[[InferRequest], Awaitable[Answer]]


class DispatchPolicy(Protocol):
    """How an app's requests reach its replicas (one instance per app)."""

    async def dispatch(self, request: InferRequest, send: Submit) -> Answer:
        """Answer ``request``, sending it (or what it is coded into) with ``send``."""
        ...


class QueueObserver(Protocol):
    """What the queue reports per request (the metrics)."""

    def answered(self, app_id: str, answer: Answer, latency_s: float) -> None: ...

    def failed(self, app_id: str, reason: str, latency_s: float) -> None: ...


class FifoPolicy:
    """Arrival order, at most ``max_in_flight`` requests sent at once, ``max_waiting`` queued.

    A request waiting for a slot still counts its deadline; one that cannot be queued is refused
    at once (503), never left waiting without bound.
    """

    def __init__(self, max_in_flight: int = 64, max_waiting: int = 1024) -> None:
        self.max_waiting = max_waiting
        self._slots = asyncio.Semaphore(max_in_flight)
        self.waiting = 0

    async def dispatch(self, request: InferRequest, send: Submit) -> Answer:
        if self._slots.locked():
            await self._wait_for_slot(request)
        else:
            await self._slots.acquire()  # free: no wait (Semaphore keeps arrival order)
        try:
            return await send(request)
        finally:
            self._slots.release()

    async def _wait_for_slot(self, request: InferRequest) -> None:
        if self.waiting >= self.max_waiting:
            raise QueueFullError(f"{request.app_id}: {self.waiting} requests already queued")
        self.waiting += 1
        try:
            remaining = request.deadline - asyncio.get_running_loop().time()
            async with asyncio.timeout(max(0.0, remaining)):
                await self._slots.acquire()
        except TimeoutError:
            raise DeadlineError(f"{request.app_id}: the deadline passed in the gateway's "
                                f"queue") from None
        finally:
            self.waiting -= 1


class AppQueue:
    """Every inference request of one app goes through :meth:`submit`."""

    def __init__(self, app_id: str, policy: DispatchPolicy, send: Submit,
                 observer: QueueObserver | None = None) -> None:
        self.app_id = app_id
        self.policy = policy
        self._send = send
        self._observer = observer

    async def submit(self, request: InferRequest) -> Answer:
        """The answer to ``request`` (GatewayError with the reason when there is none)."""
        started = time.perf_counter()
        try:
            answer = await self.policy.dispatch(request, self._send)
        except GatewayError as exc:
            if self._observer is not None:
                self._observer.failed(self.app_id, exc.reason, time.perf_counter() - started)
            raise
        if self._observer is not None:
            self._observer.answered(self.app_id, answer, time.perf_counter() - started)
        return answer


PolicyFactory = Callable[[str], DispatchPolicy]


class Queues:
    """The queue of each app, made at its first request with the policy the factory gives."""

    def __init__(self, send: Submit, policy_for: PolicyFactory,
                 observer: QueueObserver | None = None) -> None:
        self._send = send
        self._policy_for = policy_for
        self._observer = observer
        self._queues: dict[str, AppQueue] = {}

    def get(self, app_id: str) -> AppQueue:
        """The app's queue (made on first use; call only for apps the routing table knows)."""
        queue = self._queues.get(app_id)
        if queue is None:
            queue = self._queues[app_id] = AppQueue(app_id, self._policy_for(app_id),
                                                   self._send, self._observer)
        return queue

    def forget(self, app_id: str) -> None:
        """Drop a deleted app's queue (requests in it finish on their own)."""
        self._queues.pop(app_id, None)
