"""One call's way to an answer: attempts, and resends across failovers.

A call (an inference, a metadata request) goes to its app's serving replica. Then, until an
answer or the deadline:

- the app moves to another server (an event): the attempt in flight to the server it left is
  cancelled and the call goes at once to the new replica;
- an attempt fails for a reason another replica or a later try could fix (no connection, Triton
  says the model is unknown or not ready, 503): the call waits for the app's next move and
  goes there, or, when none is announced (the controller may be down), tries the same replica
  again after a back-off (50 ms, doubling to 1 s);
- the client is closed: the attempt is cancelled and the call ends with :class:`ClosedError`.

Every call ends with an answer or an :class:`SdkError` naming the reason; none is dropped in
silence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from understudy.sdk.board import RouteBoard
from understudy.sdk.errors import (
    AppDeletedError,
    ClosedError,
    DeadlineError,
    SdkError,
    UnavailableError,
)
from understudy.sdk.locations import Location
from understudy.sdk.routes import AppRoute, RouteChange
from understudy.sdk.transport import RetryableError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Attempt = Callable[[Location, float], Coroutine[Any, Any, T]]
"""One try at one replica, given the seconds left; raises RetryableError or an SdkError."""


class RouteSource(Protocol):
    """Where routes come from (the controller, or a fixed table in tests)."""

    board: RouteBoard

    async def resolve(self, app_id: str, deadline: float) -> AppRoute:
        """The app's route, learnt if need be before ``deadline`` (loop time)."""
        ...


class Exchange(Generic[T]):
    """The attempts of one call (see the module doc); read the counts after :meth:`run`."""

    def __init__(self, routes: RouteSource, attempt: Attempt[T], app_id: str, deadline: float,
                 closing: asyncio.Future[None], retry_min_s: float = 0.05,
                 retry_max_s: float = 1.0) -> None:
        self.routes = routes
        self.board = routes.board
        self.attempt = attempt
        self.app_id = app_id
        self.deadline = deadline
        self.closing = closing
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.attempts = 0
        self.resends = 0
        self.moved = 0
        self.last_reason = ""
        self._inflight: tuple[asyncio.Task[T], Location] | None = None
        """The attempt in flight, and the replica it went to."""
        self._paced: dict[tuple[str, str], float] = {}
        """(server, model) that failed -> when it may be tried again (no move announced)."""
        self._failures: dict[tuple[str, str], int] = {}
        self._loop = asyncio.get_running_loop()

    async def run(self) -> tuple[T, Location]:
        """The answer and the replica that gave it; SdkError with the reason otherwise."""
        await self._resolve()
        try:
            while True:
                app = self.board.route(self.app_id)
                if app is None:
                    raise AppDeletedError(f"app {self.app_id!r} was deleted")
                now = self._loop.time()
                if now >= self.deadline:
                    raise self._expired(app)
                self._launch(app, now)
                changed = self.board.changed(self.app_id)
                waits: list[asyncio.Future[Any]] = [changed, self.closing]
                if self._inflight is not None:
                    waits.append(self._inflight[0])
                done, _ = await asyncio.wait(waits, timeout=self._wake(app, now) - now,
                                             return_when=asyncio.FIRST_COMPLETED)
                if self._inflight is not None and self._inflight[0] in done:
                    answer = self._settle(*self._inflight)
                    if answer is not None:
                        return answer
                if self.closing.done():
                    raise ClosedError(f"{self.app_id}: the client was closed")
                if changed in done:
                    self._moved(changed.result())
        finally:
            if self._inflight is not None:
                self._inflight[0].cancel()

    async def _resolve(self) -> None:
        if self.board.route(self.app_id) is not None:
            return
        if self.closing.done():
            raise ClosedError(f"{self.app_id}: the client was closed")
        task = asyncio.ensure_future(self.routes.resolve(self.app_id, self.deadline))
        try:
            waits: list[asyncio.Future[Any]] = [task, self.closing]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task.cancelled() or not task.done():
            raise ClosedError(f"{self.app_id}: the client was closed")
        task.result()

    def _launch(self, app: AppRoute, now: float) -> None:
        route = app.serving
        if self._inflight is not None or route is None:
            return
        retry_at = self._paced.get((route.server_id, route.model_name))
        if retry_at is not None and now < retry_at:
            return
        task = self._loop.create_task(self.attempt(route, self.deadline - now))
        self._inflight = (task, route)
        self.attempts += 1
        if self.attempts > 1:
            self.resends += 1

    def _wake(self, app: AppRoute, now: float) -> float:
        """When to look again without news: the deadline, or a paced retry."""
        wake = self.deadline
        if self._inflight is None and app.serving is not None:
            retry_at = self._paced.get((app.serving.server_id, app.serving.model_name))
            if retry_at is not None:
                wake = min(wake, retry_at)
        return max(wake, now)

    def _settle(self, task: asyncio.Task[T], target: Location) -> tuple[T, Location] | None:
        self._inflight = None
        if task.cancelled():
            return None
        error = task.exception()
        if error is None:
            return task.result(), target
        if isinstance(error, RetryableError):
            self._failed(target, str(error))
            return None
        if isinstance(error, SdkError):
            raise error
        raise UnavailableError(f"{self.app_id}: {type(error).__name__}: {error}") from error

    def _failed(self, location: Location, reason: str) -> None:
        key = (location.server_id, location.model_name)
        count = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(self.retry_min_s * 2 ** (count - 1), self.retry_max_s)
        self._paced[key] = self._loop.time() + delay
        self.last_reason = f"{location.server_id}/{location.variant}: {reason}"
        logger.debug("%s: attempt at %s failed (%s)", self.app_id, location.server_id, reason)

    def _moved(self, change: RouteChange) -> None:
        if change.deleted:
            raise AppDeletedError(f"app {self.app_id!r} was deleted")
        # A replica named anew is worth a try at once, even one that failed before.
        self._paced.clear()
        self._failures.clear()
        if self._inflight is None or change.after is None:
            return  # nothing in flight, or nowhere better to go: let the attempt run
        task, target = self._inflight
        if change.after.server_id != target.server_id:
            logger.info("%s: moved from %s to %s with an attempt in flight: resending",
                        self.app_id, target.server_id, change.after.server_id)
            task.cancel()
            self._inflight = None
            self.moved += 1

    def _expired(self, app: AppRoute) -> SdkError:
        if self._inflight is not None:
            target = self._inflight[1]
            return DeadlineError(f"{self.app_id}: no answer from {target.server_id}/"
                                 f"{target.variant} before the deadline "
                                 f"({self.attempts} attempts)")
        reason = self.last_reason or (
            f"no serving replica{f' ({app.reason})' if app.reason else ''}")
        return UnavailableError(f"{self.app_id}: not served before the deadline "
                                f"({self.attempts} attempts; last: {reason})")
