"""Redis outages: API calls fail fast, background work waits, the outage is logged and counted.

Every command the controller sends to Redis goes through :class:`GuardedRedis`, whose client has
short connect and command timeouts and retries a dropped connection only briefly. The first
command that still fails marks Redis down (:meth:`RedisHealth.failed`, logged once), and from
then until a probe gets an answer (logged once more, with the outage's length):

* a caller a client is waiting on (an HTTP request: :func:`request_scope`) fails at once with
  :class:`RedisUnavailableError`, a 503 with ``Retry-After``; the API's front gate
  (``controller.http_guard``) answers such requests before any work starts, and cuts off one
  already in flight that has not answered :data:`CUT_OFF_S` after the outage began (it may be
  waiting for a lock held by background work, which waits for Redis);
* everything else (the failover, the reconciler, the watchdog, the convergence pass, the warm
  planner, agents' hellos) waits for Redis and then sends its command again, as redis-py's own
  retry would: those loops stall through the outage instead of failing every pass, and go on
  when it ends. Once the controller stops, they fail instead (:meth:`RedisHealth.close`).

Before this, a call hung for as long as the client retried (about 40 s) and a POST that timed
out at its client was applied once Redis came back; nothing was logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controller.errors import ControllerError

logger = logging.getLogger(__name__)

T = TypeVar("T")

REDIS_CONNECTIONS = 32
REDIS_POOL_WAIT_S = 30.0
"""How long a caller waits for a free pooled connection before failing."""
CONNECT_TIMEOUT_S = 0.5
COMMAND_TIMEOUT_S = 2.0
"""Longest wait for one answer: a Redis that takes longer is treated as down (a stopped or
unreachable host; Redis itself answers the controller's commands in milliseconds)."""
RECONNECTS = 2
"""Times a command is sent again on a fresh connection (after 40 and 80 ms) before Redis counts
as down: a connection Redis dropped, or a restart's first moments."""
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 0.5
RETRY_AFTER_S = 1
"""What a 503 tells a client to wait before it tries again."""
CUT_OFF_S = 0.5
"""How long an API request in flight when an outage begins may still take to answer."""


class RedisUnavailableError(ControllerError, RedisConnectionError):
    """Redis is unreachable and the caller cannot wait: answered 503 with ``Retry-After``."""

    status = 503
    retryable = True


@dataclass(eq=False)
class RequestScope:
    """One API request in flight: its commands fail fast; it is cut off in an outage."""

    active: bool = True
    answered: bool = False
    deadline: asyncio.Timeout | None = None


_REQUEST: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar(
    "understudy_request", default=None)


def failing_fast() -> bool:
    """Whether the running code serves a request that is still waiting for its answer.

    Work the request spawned (a load in the background) inherits the scope, and fails fast
    only while the request lasts: after that it waits for Redis like other background work.
    """
    scope = _REQUEST.get()
    return scope is not None and scope.active


@contextlib.contextmanager
def request_scope() -> Iterator[RequestScope]:
    """Mark the code run inside as serving one request (see :func:`failing_fast`)."""
    scope = RequestScope()
    token = _REQUEST.set(scope)
    try:
        yield scope
    finally:
        scope.active = False
        _REQUEST.reset(token)


@dataclass(frozen=True)
class RedisStats:
    """What /metrics reports about Redis outages."""

    up: bool
    outages: int
    outage_seconds: float
    """Seconds spent in outages, the one under way included."""


@dataclass
class RedisHealth:
    """Whether Redis answers; logs, counts and ends outages (see the module's docstring)."""

    probe: Callable[[], Awaitable[Any]]
    """One command that succeeds only when Redis answers (a PING on its own connection)."""
    close_probe: Callable[[], Awaitable[Any]] | None = None
    clock: Callable[[], float] = time.monotonic
    outages: int = 0
    _down_since: float | None = None
    _finished_s: float = 0.0
    _back: asyncio.Event = field(default_factory=asyncio.Event)
    _closing: bool = False
    _probe_task: asyncio.Task[None] | None = None
    _requests: set[RequestScope] = field(default_factory=set)

    @property
    def down(self) -> bool:
        """Whether an outage is under way."""
        return self._down_since is not None

    def stats(self) -> RedisStats:
        """The outage figures as of now."""
        ongoing = self.clock() - self._down_since if self._down_since is not None else 0.0
        return RedisStats(not self.down, self.outages, self._finished_s + ongoing)

    def failed(self, error: BaseException) -> None:
        """A command failed for want of Redis: the outage begins (unless it has)."""
        if self.down or self._closing:
            return
        self._down_since = self.clock()
        self.outages += 1
        self._back = asyncio.Event()
        logger.error("redis unreachable (%s): API calls answer 503 (Retry-After %d s) and "
                     "background work waits for it", error, RETRY_AFTER_S)
        self._probe_task = asyncio.ensure_future(self._probe_until_back())
        self._cut_off_requests()

    async def _probe_until_back(self) -> None:
        while not self._closing:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                await self.probe()
            except Exception:  # noqa: BLE001, S112 - any failure: still down
                continue
            self._back_up()
            return

    def _back_up(self) -> None:
        assert self._down_since is not None  # noqa: S101 - only the probe of an outage calls
        lasted = self.clock() - self._down_since
        self._finished_s += lasted
        self._down_since = None
        self._back.set()
        for request in self._requests:
            if request.deadline is not None and not request.deadline.expired():
                request.deadline.reschedule(None)
        logger.warning("redis answers again after %.1f s unreachable (outage %d)", lasted,
                       self.outages)

    async def admit(self) -> None:
        """Before a command: go on when Redis is up; in an outage fail fast, or wait for it."""
        while self._down_since is not None:
            if self._closing or failing_fast():
                raise RedisUnavailableError(
                    f"redis is unreachable; retry in {RETRY_AFTER_S} s")
            await self._back.wait()

    async def call(self, command: Callable[[], Awaitable[T]]) -> T:
        """``command()`` once Redis is admitted; sent again after an outage unless failing fast."""
        while True:
            await self.admit()
            try:
                return await command()
            except RedisUnavailableError:
                raise
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.failed(exc)
                if self._closing or failing_fast():
                    raise RedisUnavailableError(
                        f"redis is unreachable ({exc}); retry in {RETRY_AFTER_S} s") from exc

    # --- API requests in flight ---------------------------------------------------------------

    def track(self, request: RequestScope) -> None:
        """An API request started (its ``deadline`` set): cut it off in an outage."""
        self._requests.add(request)
        if self.down:
            self._cut_off(request)

    def untrack(self, request: RequestScope) -> None:
        """The request ended."""
        self._requests.discard(request)

    def _cut_off_requests(self) -> None:
        for request in self._requests:
            self._cut_off(request)

    @staticmethod
    def _cut_off(request: RequestScope) -> None:
        if request.deadline is not None and not request.answered:
            loop = asyncio.get_running_loop()
            request.deadline.reschedule(loop.time() + CUT_OFF_S)

    # --- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """The controller stops: nothing waits for Redis any more (waiting callers fail)."""
        self._closing = True
        self._back.set()
        if self._probe_task is not None:
            self._probe_task.cancel()

    async def aclose(self) -> None:
        """:meth:`close`, and the probe's connection."""
        self.close()
        if self.close_probe is not None:
            await self.close_probe()


class GuardedRedis(aioredis.Redis):
    """The controller's Redis client: every command and pipeline passes :class:`RedisHealth`."""

    health: RedisHealth

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """One command (see :meth:`RedisHealth.call`)."""
        run = super().execute_command
        return await self.health.call(lambda: run(*args, **options))

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        """A pipeline whose ``execute`` passes the health check too."""
        pipe = GuardedPipeline(self.connection_pool, self.response_callbacks, transaction,
                               shard_hint)
        pipe.health = self.health
        return pipe


class GuardedPipeline(Pipeline):
    """A pipeline (transaction) sent again whole after an outage, or failed fast."""

    health: RedisHealth

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands (see :meth:`RedisHealth.call`)."""
        queued = list(self.command_stack)
        run = super().execute

        async def attempt() -> list[Any]:
            self.command_stack = list(queued)  # a failed attempt's reset() emptied it
            return await run(raise_on_error)

        return await self.health.call(attempt)


def connect(url: str) -> GuardedRedis:
    """The controller's client of the Redis at ``url``, with its health (``client.health``).

    A bounded pool that makes a caller wait for a free connection: the default pool raises
    MaxConnectionsError past 100, which a connect storm of agents reached. Timed-out commands
    are not sent again by the client (one may have been applied); dropped connections are.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url, decode_responses=True, socket_timeout=COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=0.1, base=0.02), retries=RECONNECTS,
                    supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError], health_check_interval=5,
        max_connections=REDIS_CONNECTIONS, timeout=REDIS_POOL_WAIT_S)
    client = GuardedRedis(connection_pool=pool)
    prober = aioredis.Redis.from_url(
        url, socket_timeout=PROBE_TIMEOUT_S, socket_connect_timeout=PROBE_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0), single_connection_client=True)
    client.health = RedisHealth(prober.ping, close_probe=prober.aclose)
    return client
