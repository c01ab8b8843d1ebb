"""One request's way to an answer: attempts, resends across failovers, hedging.

A request is sent to its app's serving replica. Then, until an answer or the deadline:

- the app moves to another server (an event): attempts in flight to the server it left are
  cancelled and the request goes at once to the new replica;
- an attempt fails for a reason another replica or a later try could fix (no connection, Triton
  says the model is unknown or not ready, 503): the request waits for the app's next move and
  goes there, or, when none is announced (the controller may be down), tries the same replica
  again after a back-off;
- with hedging for the app, once the hedge delay passes without an answer, the request also goes
  to a warm backup; the first answer wins and the other attempts are cancelled.

Every request ends with an answer (Triton's reply, passed through) or a :class:`GatewayError`
naming the reason; none is dropped in silence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.arriving import ArrivingBody
from gateway.board import RouteBoard
from gateway.errors import (
    AppDeletedError,
    DeadlineError,
    GatewayError,
    StoppingError,
    UnavailableError,
    UnknownAppError,
)
from gateway.routes import AppRoute, RouteChange
from gateway.upstream import UpstreamError, UpstreamReply
from understudy.client import Location

logger = logging.getLogger(__name__)

UNAVAILABLE_MARKERS = (b"unknown model", b"not ready", b"no available version", b"not found",
                       b"unavailable")
"""Fragments of Triton's 400 replies that mean this replica cannot serve the model now."""
RETRYABLE_STATUSES = frozenset({404, 502, 503})


@dataclass(slots=True)
class InferRequest:
    """A client's request, as the gateway forwards it (the body is never decoded)."""

    app_id: str
    deadline: float
    """Loop time (``loop.time()``) by which the answer is due."""
    body: bytes | bytearray = b""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers forwarded as they are (content type, binary header length, encoding)."""
    method: str = "POST"
    suffix: str = "/infer"
    """Path after ``/v2/models/<model>[/versions/<version>]``."""
    version: str = ""
    protocol: str = "http"
    """Which front end it came from; picks the sender (HTTP or gRPC) for the upstream."""
    arriving: ArrivingBody | None = None
    """Set while ``body`` is still coming in from the client: senders forward it as it
    comes; whoever reads the tensors first awaits :meth:`whole_body`."""

    async def whole_body(self) -> None:
        """Return once the body is all in (BodyLostError if the client went away first)."""
        if self.arriving is not None:
            await self.arriving.wait()


@dataclass(slots=True)
class Answer:
    """The reply that answered a request, and how it got there."""

    reply: UpstreamReply
    route: Location
    attempts: int
    resends: int
    hedged: bool
    hedge_won: bool
    source: str = "model"
    """Who answered: ``model`` (the replica's own prediction), or a stand-in for an unavailable
    one (``gateway.protection``): ``reconstructed`` (decoded from a parity model's output),
    ``default`` (the default response), ``approximate`` (the approximate backup)."""
    group_id: str = ""
    """The coding group a reconstructed answer was decoded from."""


Send = Callable[[Location, InferRequest], Coroutine[Any, Any, UpstreamReply]]
"""Sends a request to one replica; raises UpstreamError when no reply comes."""


class ExchangeEvents(Protocol):
    """What an exchange reports as it goes (the metrics)."""

    def resent(self, app_id: str, cause: str) -> None: ...

    def hedged(self, app_id: str) -> None: ...


class _NoEvents:
    def resent(self, app_id: str, cause: str) -> None:
        return None

    def hedged(self, app_id: str) -> None:
        return None


def failure_of(reply: UpstreamReply) -> str | None:
    """Why a reply calls for another try (None: it is the answer, success or a final error)."""
    status = reply.status
    if status < 300:
        return None
    if status in RETRYABLE_STATUSES:
        return f"Triton answered {status}"
    if status == 400 and len(reply.body) < 4096:
        text = reply.body.lower()
        if any(marker in text for marker in UNAVAILABLE_MARKERS):
            return "model not available there: " + reply.body.decode("utf-8", "replace")[:200]
    return None


class Dispatcher:
    """Sends requests to their apps' replicas until they are answered (see the module doc)."""

    def __init__(self, board: RouteBoard, senders: Mapping[str, Send], *,
                 retry_min_s: float = 0.05, retry_max_s: float = 1.0,
                 hedge_s: Mapping[str, float] | None = None,
                 events: ExchangeEvents | None = None) -> None:
        self.board = board
        self.senders = dict(senders)
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.hedge_s = dict(hedge_s or {})
        self.events: ExchangeEvents = events or _NoEvents()
        self._stopping: asyncio.Future[None] | None = None

    @property
    def stopping(self) -> asyncio.Future[None]:
        """Resolved when the gateway stops: requests still waiting fail with a reason."""
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_future()
        return self._stopping

    def stop(self) -> None:
        """Fail every request still waiting (the gateway is stopping)."""
        if not self.stopping.done():
            self.stopping.set_result(None)

    async def send(self, request: InferRequest) -> Answer:
        """The answer to ``request``; GatewayError with the reason when there is none."""
        if self.stopping.done():
            raise StoppingError("the gateway is stopping")
        return await _Exchange(self, request).run()


MOVED, STOPPING, DEADLINE = "moved", "stopping", "deadline"


class _Interrupt:
    """Cancels a request's task when its single attempt must end (see ``_Exchange._first``).

    ``why`` says what happened: the app left the attempt's server (or was deleted), the
    gateway stops, or the deadline passed. Once disarmed it never fires: a change resolved in
    the loop pass that ended the attempt has its callback already scheduled (removing it from
    the future comes too late), and a cancel then would hit whatever the request's task awaits
    next (writing the answer) and leave the client without one.
    """

    __slots__ = ("task", "board", "app_id", "server_id", "why", "armed", "_changed",
                 "_stopping", "_timer")

    def __init__(self, task: asyncio.Task[Any], board: RouteBoard, request: InferRequest,
                 server_id: str, stopping: asyncio.Future[None]) -> None:
        self.task = task
        self.board = board
        self.app_id = request.app_id
        self.server_id = server_id
        self.why: str | None = None
        self.armed = True
        self._changed = board.changed(request.app_id)
        self._changed.add_done_callback(self._on_change)
        self._stopping = stopping
        stopping.add_done_callback(self._on_stop)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_at(
            request.deadline, self._fire, DEADLINE)

    def _on_change(self, _: asyncio.Future[RouteChange]) -> None:
        if self.why is not None or not self.armed:
            return
        app = self.board.route(self.app_id)
        if app is None or (app.serving is not None and app.serving.server_id != self.server_id):
            self._fire(MOVED)
            return
        # Another change (a backup ready, the app served nowhere for now): keep waiting. The
        # route is read, not the change, so a change that nobody was waiting for is not missed.
        self._changed = self.board.changed(self.app_id)
        self._changed.add_done_callback(self._on_change)

    def _on_stop(self, _: asyncio.Future[None]) -> None:
        self._fire(STOPPING)

    def _fire(self, why: str) -> None:
        if self.why is None and self.armed:
            self.why = why
            self.task.cancel()

    def disarm(self) -> None:
        """The attempt ended: no more interruptions."""
        self.armed = False
        self._changed.remove_done_callback(self._on_change)
        self._stopping.remove_done_callback(self._on_stop)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Exchange:
    """The attempts of one request."""

    def __init__(self, dispatcher: Dispatcher, request: InferRequest) -> None:
        self.d = dispatcher
        self.request = request
        self.send = dispatcher.senders[request.protocol]
        self.hedge_s = dispatcher.hedge_s.get(request.app_id)
        self.tasks: dict[asyncio.Task[UpstreamReply], tuple[Location, bool]] = {}
        self.paced: dict[tuple[str, str], float] = {}
        """(server, model) that failed -> when it may be tried again (no move announced)."""
        self.failures: dict[tuple[str, str], int] = {}
        self.attempts = 0
        self.resends = 0
        self.hedged = False
        self.first_sent: float | None = None
        self.cause = "failed"
        self.last_reason = ""
        self.loop = asyncio.get_running_loop()

    async def run(self) -> Answer:
        request = self.request
        board = self.d.board
        if not board.loaded.is_set():
            await self._wait_loaded()
        app = board.route(request.app_id)
        if (self.hedge_s is None and app is not None and app.serving is not None
                and self.loop.time() < request.deadline):
            answer = await self._first(app.serving)
            if answer is not None:
                return answer
        try:
            while True:
                app = board.route(request.app_id)
                if app is None:
                    raise (AppDeletedError(f"app {request.app_id!r} was deleted")
                           if self.attempts else
                           UnknownAppError(f"app {request.app_id!r} is not registered"))
                now = self.loop.time()
                if now >= request.deadline:
                    raise self._expired(app)
                self._launch(app, now)
                changed = board.changed(request.app_id)
                waits: list[asyncio.Future[Any]] = [*self.tasks, changed, self.d.stopping]
                done, _ = await asyncio.wait(
                    waits,
                    timeout=self._wake(app, now) - now, return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in self.tasks if t in done]:
                    answer = self._settle(task)
                    if answer is not None:
                        return answer
                if self.d.stopping.done():
                    raise StoppingError("the gateway is stopping")
                if changed in done:
                    self._moved(changed.result())
        finally:
            for task in self.tasks:
                task.cancel()

    async def _first(self, route: Location) -> Answer | None:
        """The usual case: one attempt, awaited in the request's own task; None to go on.

        No task per attempt and no wait on several futures: the attempt is interrupted (its
        task cancelled, then uncancelled) only when the app leaves its server, the gateway
        stops or the deadline passes. Anything but an answer leaves the rest to the loop of
        :meth:`run`, as if the attempt had been one of its own.
        """
        task = asyncio.current_task()
        if task is None:
            return None
        self.attempts = 1
        self.first_sent = self.loop.time()
        interrupt = _Interrupt(task, self.d.board, self.request, route.server_id,
                               self.d.stopping)
        try:
            reply = await self.send(route, self.request)
        except asyncio.CancelledError:
            if interrupt.why is None or task.uncancel() > 0:
                raise  # the client went away, or someone else cancelled the request
            self._interrupted(interrupt.why, route)
            return None
        except UpstreamError as exc:
            self._failed(route, str(exc))
            return None
        finally:
            interrupt.disarm()
        reason = failure_of(reply)
        if reason is not None:
            self._failed(route, reason)
            return None
        return Answer(reply, route, self.attempts, self.resends, False, False)

    def _interrupted(self, why: str, route: Location) -> None:
        if why == STOPPING:
            raise StoppingError("the gateway is stopping")
        if why == DEADLINE:
            raise DeadlineError(f"{self.request.app_id}: no answer from {route.server_id}/"
                                f"{route.variant} before the deadline (1 attempts)")
        if self.d.board.route(self.request.app_id) is None:
            raise AppDeletedError(f"app {self.request.app_id!r} was deleted")
        self.paced.clear()  # a replica named anew is worth a try at once
        self.failures.clear()
        self.cause = "moved"

    async def _wait_loaded(self) -> None:
        remaining = self.request.deadline - self.loop.time()
        loaded = self.loop.create_task(self.d.board.loaded.wait())
        waits: list[asyncio.Future[Any]] = [loaded, self.d.stopping]
        try:
            await asyncio.wait(waits, timeout=max(0.0, remaining),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            loaded.cancel()
        if self.d.stopping.done():
            raise StoppingError("the gateway is stopping")
        if not self.d.board.loaded.is_set():
            raise UnavailableError("no routing table yet: the controller has not been "
                                   "reached")

    # --- attempts ------------------------------------------------------------------------

    def _launch(self, app: AppRoute, now: float) -> None:
        route = app.serving
        if route is not None and self._should_send(route, now):
            self._start(route, hedge=False, now=now)
            if self.attempts > 1:
                self.resends += 1
                self.d.events.resent(app.app_id, self.cause)
        if self._hedge_due(app, now):
            running = {loc.server_id for loc, _ in self.tasks.values()}
            backup = next((b for b in app.backups.values() if b.server_id not in running), None)
            if backup is not None:
                self.hedged = True
                self._start(backup, hedge=True, now=now)
                self.d.events.hedged(app.app_id)

    def _should_send(self, route: Location, now: float) -> bool:
        for location, hedge in self.tasks.values():
            if not hedge or (location.server_id, location.model_name) == (
                    route.server_id, route.model_name):
                return False  # a primary attempt is in flight, or one already at this replica
        retry_at = self.paced.get((route.server_id, route.model_name))
        return retry_at is None or now >= retry_at

    def _hedge_due(self, app: AppRoute, now: float) -> bool:
        return (self.hedge_s is not None and not self.hedged and self.first_sent is not None
                and bool(self.tasks) and bool(app.backups)
                and now >= self.first_sent + self.hedge_s)

    def _start(self, route: Location, hedge: bool, now: float) -> None:
        task = self.loop.create_task(self.send(route, self.request))
        self.tasks[task] = (route, hedge)
        self.attempts += 1
        if self.first_sent is None:
            self.first_sent = now

    def _wake(self, app: AppRoute, now: float) -> float:
        """When to look again without news: the deadline, a retry, or the hedge."""
        wake = self.request.deadline
        if app.serving is not None:
            retry_at = self.paced.get((app.serving.server_id, app.serving.model_name))
            if retry_at is not None and retry_at > now:
                wake = min(wake, retry_at)
        if (self.hedge_s is not None and not self.hedged and self.first_sent is not None
                and app.backups and self.tasks):
            wake = min(wake, self.first_sent + self.hedge_s)
        return max(wake, now)

    def _settle(self, task: asyncio.Task[UpstreamReply]) -> Answer | None:
        location, hedge = self.tasks.pop(task)
        if task.cancelled():
            return None
        error = task.exception()
        if error is not None:
            if not isinstance(error, UpstreamError):
                for other in self.tasks:
                    other.cancel()
                raise error
            self._failed(location, str(error))
            return None
        reply = task.result()
        reason = failure_of(reply)
        if reason is not None:
            self._failed(location, reason)
            return None
        return Answer(reply, location, self.attempts, self.resends, self.hedged, hedge)

    def _failed(self, location: Location, reason: str) -> None:
        key = (location.server_id, location.model_name)
        count = self.failures[key] = self.failures.get(key, 0) + 1
        delay = min(self.d.retry_min_s * 2 ** (count - 1), self.d.retry_max_s)
        self.paced[key] = self.loop.time() + delay
        self.last_reason = f"{location.server_id}/{location.variant}: {reason}"
        self.cause = "failed"
        logger.debug("%s: attempt at %s failed (%s)", self.request.app_id, location.server_id,
                     reason)

    def _moved(self, change: RouteChange) -> None:
        if change.deleted:
            raise AppDeletedError(f"app {self.request.app_id!r} was deleted")
        # A replica named anew is worth a try at once, even one that failed before.
        self.paced.clear()
        self.failures.clear()
        left = change.left_server
        if left is None:
            return
        for task, (location, _) in list(self.tasks.items()):
            if location.server_id == left:
                task.cancel()
                del self.tasks[task]
                self.cause = "moved"

    def _expired(self, app: AppRoute) -> GatewayError:
        if self.tasks:
            where = ", ".join(f"{loc.server_id}/{loc.variant}" for loc, _ in self.tasks.values())
            return DeadlineError(f"{app.app_id}: no answer from {where} before the deadline "
                                 f"({self.attempts} attempts)")
        if not self.attempts and app.serving is not None:
            # a replica to send to, and the deadline passed before the request could go
            # (it came in late, or waited for a batch): the client's deadline, not a lack of
            # replicas
            return DeadlineError(f"{app.app_id}: the deadline passed before the request "
                                 f"could be sent to {app.serving.server_id}/"
                                 f"{app.serving.variant}")
        reason = self.last_reason or (
            f"no serving replica{f' ({app.reason})' if app.reason else ''}")
        return UnavailableError(f"{app.app_id}: not served before the deadline "
                                f"({self.attempts} attempts; last: {reason})")
