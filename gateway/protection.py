"""An app served by several instances: balancing, and what answers when a prediction is unavailable.

For an app with more than one instance, or a substitute for a late or lost prediction, the
queue's policy is :class:`ProtectedPolicy`; for the others it passes requests on to the usual
exchange (``gateway.exchange``: the serving replica, resends across failovers). A protected
request:

1. goes at once to one instance, the one with the fewest requests in flight (ParM §6.1's single
   queue, which instances pull from as they free up); an instance whose server just refused a
   request is left out for a back-off;
2. with a *substitute* (the app's mode), may be answered by it instead of the model when its
   prediction is **unavailable**: its attempt failed (the server is down, Triton says the model
   is not there), or it is not back ``straggler_ms`` after it was sent (0, the default for
   parity models and approximate backups: as soon as the substitute is ready, ParM §4.1's first
   rule); a parity-coded query not answered ``group_fill_ms`` after its send (by default twice
   the median of the app's latest answers), and unavailable, fills its group, if still open,
   with stand-ins (``gateway.coding``), so that its substitute can come;
3. failing that, is sent again to another instance, until its deadline.

Modes (``--protect APP=MODE``; ``auto`` by default):

=====================  ======================================================================
``auto``               ``parity`` when the app has a ready parity model, else ``equal-resources``
``parity``             ParM: queries coded in groups of k (``gateway.coding``), the missing one
                       reconstructed by the subtraction decoder
``equal-resources``    §6's Equal-Resources: the extra instances are plain replicas; balancing
                       only
``default-response``   §5.2.2's default: an unavailable prediction is answered with a fixed
                       class (``--default-class``), after ``straggler_ms`` (default 100)
``approximate-backup`` §6.2.6: every query is also sent to the app's warm backup (our smaller
                       variant); its answer stands in for an unavailable prediction
``none``               the plain exchange (the serving replica only)
=====================  ======================================================================

An answer that is not the model's own says so: :attr:`Answer.source` is ``reconstructed``,
``default`` or ``approximate`` (the front ends put it in a header and a response parameter).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gateway.board import RouteBoard
from gateway.coding import Coder, Group
from gateway.errors import DeadlineError, StoppingError, UnavailableError
from gateway.exchange import Answer, InferRequest, Send, failure_of
from gateway.protection_modes import (
    FILL_BEFORE_ANSWERS_MS,
    FILL_OF_MEDIAN,
    NoEvents,
    Protection,
    ProtectionEvents,
    effective_mode,
    parity_coding,
)
from gateway.queue import FifoPolicy, Submit
from gateway.routes import AppRoute
from gateway.tensors import (
    NotCodable,
    Query,
    grpc_answer,
    http_answer,
    http_request,
    read_http_reply,
    read_reply,
    read_request,
)
from gateway.upstream import UpstreamError, UpstreamReply
from understudy.client import Location

logger = logging.getLogger(__name__)

ANSWER_TIMES_KEPT = 256
"""Latest model answers whose median sets the default fill time."""
MIN_ANSWER_TIMES = 16
"""Answers needed before their median sets the fill time (and between two medians)."""

class ProtectedPolicy:
    """The dispatch policy of one app (see the module doc); one instance per app."""

    def __init__(self, app_id: str, board: RouteBoard, senders: Mapping[str, Send],
                 protection: Protection, fifo: FifoPolicy, *,
                 retry_min_s: float = 0.05, retry_max_s: float = 1.0,
                 events: ProtectionEvents | None = None,
                 stopping: Callable[[], asyncio.Future[None]] | None = None) -> None:
        self.app_id = app_id
        self.stopping = stopping
        """Resolved when the gateway stops (requests still waiting fail with a reason)."""
        self.board = board
        self.senders = dict(senders)
        self.protection = protection
        self.fifo = fifo
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.events: ProtectionEvents = events or NoEvents()
        self.coder = Coder(app_id, self._send_parity, protection.group_timeout_ms / 1000.0,
                           self.events)
        self.outstanding: dict[str, int] = {}
        """Requests in flight per server (instances and parity models)."""
        self.paced: dict[str, tuple[float, int]] = {}
        """Server -> (when it may be tried again, failures in a row)."""
        self.template: dict[str, np.ndarray] | None = None
        """Outputs of the last model answer (the default response's shapes and types)."""
        self._queries = 0
        self._ids = itertools.count(1)
        self._lingering: set[asyncio.Task[UpstreamReply]] = set()
        self.answer_times: deque[float] = deque(maxlen=ANSWER_TIMES_KEPT)
        """How long the app's latest model answers took from their send."""
        self._answers = 0
        self._fill_median_s: float | None = None
        """Their median, taken again every ``MIN_ANSWER_TIMES`` answers."""

    def next_query_id(self) -> str:
        """A query id unique within the app (coding groups name their members by it)."""
        return f"q{next(self._ids)}"

    async def dispatch(self, request: InferRequest, send: Submit) -> Answer:
        return await self.fifo.dispatch(request, lambda r: self._route(r, send))

    async def _route(self, request: InferRequest, send: Submit) -> Answer:
        route = self.board.route(self.app_id)
        if route is None or request.suffix not in ("/infer", "ModelInfer"):
            return await send(request)
        mode = effective_mode(self.protection, route)
        if mode == "none" or (len(route.members()) <= 1 and mode == "equal-resources"):
            return await send(request)
        if not route.members():
            return await send(request)  # nothing to balance over: wait for a move as usual
        await request.whole_body()  # coding reads its tensors
        return await _Protected(self, request, mode).run()

    # --- instances -----------------------------------------------------------------------

    def pick(self, route: AppRoute, avoid: set[str]) -> Location | float | None:
        """The instance to send to: fewest requests in flight, not backing off.

        Instances in ``avoid`` (tried already) only when no other is left. When every one is
        backing off: the loop time the first may be tried again; None without any instance.
        """
        now = asyncio.get_running_loop().time()
        members = route.members()
        if not members:
            return None
        ready = [m for m in members if self.paced.get(m.server_id, (0.0, 0))[0] <= now]
        if not ready:
            return min(self.paced.get(m.server_id, (now, 0))[0] for m in members)
        usable = [m for m in ready if m.server_id not in avoid] or ready
        self._queries += 1
        start = self._queries % len(usable)  # ties go round-robin
        ordered = usable[start:] + usable[:start]
        return min(ordered, key=lambda m: self.outstanding.get(m.server_id, 0))

    def answered_in(self, seconds: float) -> None:
        """A model answer took ``seconds`` from its send (the fill time's median)."""
        self.answer_times.append(seconds)
        self._answers += 1
        if self._answers % MIN_ANSWER_TIMES == 0:  # a median per query would sort each time
            self._fill_median_s = statistics.median(self.answer_times)

    def fill_s(self) -> float:
        """When a parity-coded query unanswered fills its group, in seconds after its send."""
        if self.protection.group_fill_ms is not None:
            return self.protection.group_fill_ms / 1000.0
        if self._fill_median_s is None:
            return FILL_BEFORE_ANSWERS_MS / 1000.0
        return FILL_OF_MEDIAN * self._fill_median_s

    def failed(self, server_id: str) -> None:
        """An attempt at ``server_id`` failed: back off from it (50 ms, doubling to 1 s)."""
        _, count = self.paced.get(server_id, (0.0, 0))
        delay = min(self.retry_min_s * 2 ** count, self.retry_max_s)
        self.paced[server_id] = (asyncio.get_running_loop().time() + delay, count + 1)

    def succeeded(self, server_id: str) -> None:
        """An attempt at ``server_id`` answered: no back-off."""
        self.paced.pop(server_id, None)

    async def attempt(self, location: Location, request: InferRequest) -> UpstreamReply:
        """One request to one instance, counted in flight."""
        server = location.server_id
        self.outstanding[server] = self.outstanding.get(server, 0) + 1
        try:
            return await self.senders[request.protocol](location, request)
        finally:
            self.outstanding[server] -= 1

    # --- parity ---------------------------------------------------------------------------

    async def _send_parity(self, group: Group, inputs: dict[str, np.ndarray],
                           template: Query) -> dict[str, np.ndarray]:
        """Send a group's parity query to the least busy parity model; its outputs."""
        route = self.board.route(self.app_id)
        candidates = [] if route is None else list(route.parity.values())
        if not candidates:
            raise UnavailableError("no parity model ready")
        location = min(candidates, key=lambda p: self.outstanding.get(p.server_id, 0))
        body, header_length = http_request(inputs)
        headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
        if header_length is not None:
            headers = (("Content-Type", "application/octet-stream"),
                       ("Inference-Header-Content-Length", str(header_length)))
        loop = asyncio.get_running_loop()
        request = InferRequest(self.app_id, loop.time() + max(
            1.0, 10 * self.protection.group_timeout_ms / 1000.0), body, headers)
        group.parity_server = location.server_id
        try:
            reply = await self.attempt(location, request)
        except UpstreamError:
            self.events.parity_sent(self.app_id, "failed")
            raise
        if reply.status != 200:
            self.events.parity_sent(self.app_id, "failed")
            raise UnavailableError(f"parity model answered {reply.status}")
        self.events.parity_sent(self.app_id, "answered")
        return read_http_reply(reply.body, _header_length(reply.headers))

    # --- the default response -------------------------------------------------------------

    def default_reply(self, query: Query, model_name: str) -> UpstreamReply | None:
        """A one-hot answer of the default class, shaped like the last model answer."""
        if self.template is None:
            return None
        batch = next(iter(query.inputs.values())).shape[:1]
        outputs: dict[str, np.ndarray] = {}
        for name, example in self.template.items():
            shape = (*batch, *example.shape[1:]) if example.ndim > 1 else example.shape
            array = np.zeros(shape, dtype=example.dtype)
            if array.shape and array.shape[-1] > self.protection.default_class:
                array[..., self.protection.default_class] = 1
            outputs[name] = array
        if query.protocol == "grpc":
            return UpstreamReply(200, {}, grpc_answer(query, outputs, model_name, "default"))
        body, header_length = http_answer(query, outputs, model_name, "default")
        headers = {"content-type": "application/json"}
        if header_length is not None:
            headers["inference-header-content-length"] = str(header_length)
        return UpstreamReply(200, headers, body)

    def learn_template(self, protocol: str, reply: UpstreamReply) -> None:
        """Keep an answer's output shapes for the default response (first answer only)."""
        if self.template is None:
            try:
                self.template = read_reply(protocol, reply.body, reply.headers)
            except NotCodable:
                return

    def linger(self, task: asyncio.Task[UpstreamReply], until: float) -> None:
        """Let an attempt whose query a stand-in answered run on until its server answers.

        Its instance stays busy with it (counted in flight) until then, as an instance that
        pulls its next query from §6.1's single queue only when it is done: cancelling it
        would make a slow instance look idle and send it the next query. Cancelled at
        ``until`` (the request's deadline) at the latest.
        """
        self._lingering.add(task)
        timer = asyncio.get_running_loop().call_at(until, task.cancel)

        def done(finished: asyncio.Task[UpstreamReply]) -> None:
            timer.cancel()
            self._lingering.discard(finished)
            if not finished.cancelled():
                finished.exception()  # retrieved: a late failure is nobody's concern now

        task.add_done_callback(done)

    def close(self) -> None:
        """Cancel the parity queries and the lingering attempts in flight."""
        self.coder.close()
        for task in list(self._lingering):
            task.cancel()


def _header_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("inference-header-content-length")
    return int(value) if value and value.isdigit() else None


class _Protected:
    """One protected request, from its first attempt to its answer."""

    def __init__(self, policy: ProtectedPolicy, request: InferRequest, mode: str) -> None:
        self.p = policy
        self.request = request
        self.mode = mode
        self.loop = asyncio.get_running_loop()
        self.query: Query | None = None
        self.uncodable = False
        self.group: Group | None = None
        self.backup: asyncio.Task[UpstreamReply] | None = None
        self.backup_route: Location | None = None
        self.attempt: asyncio.Task[UpstreamReply] | None = None
        self.location: Location | None = None
        self.tried: set[str] = set()
        self.attempts = 0
        self.cause = ""
        """Why the prediction is unavailable ('' while it is not): failed or late."""
        self.last_reason = ""
        self.sent_at = self.loop.time()
        self.query_id = policy.next_query_id()
        self.retry_at: float | None = None
        """When every instance backs off: when to try again."""
        self.fill_at: float | None = None
        """When the query, unanswered, fills its open group (None: not, or done)."""

    async def run(self) -> Answer:
        route = self.p.board.route(self.request.app_id)
        assert route is not None  # noqa: S101 - checked by the policy
        answer: Answer | None = None
        try:
            self._send_next(route)  # first: the query is on its way before any coding
            self._prepare(route)
            answer = await self._loop()
            return answer
        finally:
            if answer is not None and answer.source != "model" and self.attempt is not None \
                    and not self.attempt.done():
                self.p.linger(self.attempt, self.request.deadline)
                self.attempt = None
            for task in (self.attempt, self.backup):
                if task is not None:
                    task.cancel()

    def _prepare(self, route: AppRoute) -> None:
        request = self.request
        coding = parity_coding(route)
        if self.mode == "parity" and coding is not None:
            server = self.location.server_id if self.location is not None else ""
            self.group = self.p.coder.join(self.query_id, request, *coding, server)
            fill_s = self.p.fill_s()
            if fill_s < self.p.protection.group_timeout_ms / 1000.0:
                self.fill_at = self.sent_at + fill_s
        if self.mode == "approximate-backup":
            members = {m.server_id for m in route.members()}
            backup = next((b for s, b in sorted(route.backups.items()) if s not in members), None)
            if backup is not None:
                self.backup_route = backup
                self.backup = self.loop.create_task(self.p.attempt(backup, request))

    def _send_next(self, route: AppRoute) -> bool:
        location = self.p.pick(route, self.tried)
        if not isinstance(location, Location):
            self.retry_at = location
            return False
        self.retry_at = None
        self.location = location
        self.tried.add(location.server_id)
        self.attempts += 1
        self.attempt = self.loop.create_task(self.p.attempt(location, self.request))
        return True

    async def _loop(self) -> Answer:
        request = self.request
        straggler_at = self.sent_at + self.p.protection.straggler_s(self.mode)
        while True:
            now = self.loop.time()
            if not self.cause and now >= straggler_at:
                self.cause = "late"
            self._fill(now)
            answer = self._substitute()
            if answer is not None:
                return answer
            if now >= request.deadline:
                raise self._expired()
            waits: list[asyncio.Future[Any]] = [self.p.board.changed(request.app_id)]
            for task in (self.attempt, self.backup):
                if task is not None and not task.done():
                    waits.append(task)
            if self.group is not None and not self.group.hopeless(self.query_id):
                waits.append(self.group.news())
            stopping = self.p.stopping() if self.p.stopping is not None else None
            if stopping is not None:
                waits.append(stopping)
            await asyncio.wait(waits, timeout=max(0.0, self._wake_at(straggler_at) - now),
                               return_when=asyncio.FIRST_COMPLETED)
            if stopping is not None and stopping.done():
                raise StoppingError("the gateway is stopping")
            answer = self._settle()
            if answer is not None:
                return answer

    def _wake_at(self, straggler_at: float) -> float:
        """When to look again with no news: the deadline, or a time the query acts on first."""
        times = [self.request.deadline]
        if not self.cause:
            times.append(straggler_at)
        if self.attempt is None and self.retry_at is not None:
            times.append(self.retry_at)
        if self.fill_at is not None:  # a fill waits for the query to be unavailable too
            times.append(self.fill_at if self.cause else max(self.fill_at, straggler_at))
        return min(times)

    def _settle(self) -> Answer | None:
        """Look at the attempt: its answer, or a failure and the next instance."""
        route = self.p.board.route(self.request.app_id)
        task, location = self.attempt, self.location
        if task is not None and location is not None and not task.done() and route is not None \
                and location.server_id not in {m.server_id for m in route.members()}:
            task.cancel()  # its instance is gone (the server failed, the app moved)
            self._failed(location, "the instance left")
            task = None
        elif task is not None and task.done() and location is not None:
            self.attempt = None
            reason = _failure(task)
            if reason is None:
                reply = task.result()
                self.p.succeeded(location.server_id)
                if self.group is not None:  # only coded queries have a fill time to set
                    self.p.answered_in(self.loop.time() - self.sent_at)
                    self.p.coder.answered(self.group, self.query_id, reply)
                self.fill_at = None
                if self.mode == "default-response" and reply.status == 200:
                    self.p.learn_template(self.request.protocol, reply)
                return Answer(reply, location, self.attempts, self.attempts - 1, False, False)
            self._failed(location, reason)
        if self.attempt is None and route is not None and self._may_resend():
            self._send_next(route)
        return None

    def _fill(self, now: float) -> None:
        """Fill the query's open group with stand-ins once it is late for its fill time.

        Not before its prediction is unavailable (its straggler time, or a failure): a
        reconstruction could not answer it before then.
        """
        if self.fill_at is None or now < self.fill_at or not self.cause:
            return
        self.fill_at = None
        if self.group is not None:
            self.p.coder.fill(self.group)  # a no-op on a group full or closed meanwhile

    def _may_resend(self) -> bool:
        """Whether to send a failed query again now, rather than wait for its substitute.

        A query of a group that may still be decoded waits for the decode (the parity query
        is on its way: a resend would load the instances that are left for an answer that is
        coming anyway); so does one whose approximate backup has not answered yet.
        """
        if self.group is not None and not self.group.hopeless(self.query_id):
            return False
        return self.backup is None or (self.backup.done() and _failure(self.backup) is not None)

    def _failed(self, location: Location, reason: str) -> None:
        self.attempt = None
        self.cause = "failed"
        self.last_reason = f"{location.server_id}/{location.variant}: {reason}"
        self.p.failed(location.server_id)

    def _substitute(self) -> Answer | None:
        """The substitute's answer, when the prediction is unavailable and it is ready."""
        if not self.cause:
            return None
        app_id, model_name = self.request.app_id, self.request.app_id
        if self.group is not None and self.group.decodable(self.query_id):
            try:
                reply = self.group.reconstruct(self.query_id, model_name)
            except (NotCodable, ValueError) as exc:
                logger.debug("%s: no reconstruction: %s", app_id, exc)
                self.group.close(f"not decodable: {exc}")
                return None
            self.p.events.substituted(app_id, "reconstructed", self.cause)
            parity = self._parity_location()
            return Answer(reply, parity, self.attempts, self.attempts - 1, False, False,
                          source="reconstructed", group_id=self.group.group_id)
        if self.backup is not None and self.backup.done() and self.backup_route is not None \
                and _failure(self.backup) is None:
            self.p.events.substituted(app_id, "approximate", self.cause)
            return Answer(self.backup.result(), self.backup_route, self.attempts + 1,
                          self.attempts - 1, False, False, source="approximate")
        if self.mode == "default-response" and self._read_query() is not None:
            assert self.query is not None  # noqa: S101
            default = self.p.default_reply(self.query, model_name)
            if default is not None:
                self.p.events.substituted(app_id, "default", self.cause)
                where = self.location or Location("", "", model_name, "", "default", 0.0)
                return Answer(default, Location(where.http, where.grpc, model_name, "gateway",
                                              "default", 0.0), self.attempts,
                              self.attempts - 1, False, False, source="default")
        return None

    def _read_query(self) -> Query | None:
        """The request's tensors (read once, when a stand-in needs them); None: not codable."""
        if self.query is None and not self.uncodable:
            try:
                self.query = read_request(self.request.protocol, self.request.body,
                                          self.request.headers)
            except NotCodable as exc:
                logger.debug("%s: request not codable (%s)", self.request.app_id, exc)
                self.uncodable = True
        return self.query

    def _parity_location(self) -> Location:
        route = self.p.board.route(self.request.app_id)
        assert self.group is not None  # noqa: S101
        parity = None if route is None else route.parity.get(self.group.parity_server)
        if parity is not None:
            return Location(parity.http, parity.grpc, self.request.app_id, parity.server_id,
                            parity.variant, parity.accuracy, parity.seq)
        return Location("", "", self.request.app_id, self.group.parity_server, "parity", 0.0)

    def _expired(self) -> UnavailableError | DeadlineError:
        if self.attempt is not None:
            where = self.location.server_id if self.location else "?"
            return DeadlineError(f"{self.request.app_id}: no answer from {where} before the "
                                 f"deadline ({self.attempts} attempts)")
        return UnavailableError(f"{self.request.app_id}: not served before the deadline "
                                f"({self.attempts} attempts; last: "
                                f"{self.last_reason or 'no instance'})")


def _failure(task: asyncio.Task[UpstreamReply]) -> str | None:
    """Why a finished attempt is no answer (None: it is one, success or a final error)."""
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    if error is not None:
        if isinstance(error, UpstreamError):
            return str(error)
        raise error
    return failure_of(task.result())
