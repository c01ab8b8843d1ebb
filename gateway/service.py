"""One gateway process: the routing table, the controller follower, the front ends, a clean stop.

``await Gateway(config).run()`` serves until :meth:`Gateway.stop` (SIGTERM, SIGINT). Stopping
takes at most ``stop_grace_s`` plus a fraction of a second: the listeners close at once, the
requests in flight get ``stop_grace_s`` to be answered, and those still waiting then get a 503
saying the gateway is stopping; nothing is cut off without an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.batching import BatchPolicy, BatchSettings
from gateway.board import RouteBoard
from gateway.config import GatewayConfig
from gateway.dataplane import DataPlane
from gateway.exchange import Dispatcher, Send
from gateway.follower import EventFollower
from gateway.grpc_api import GrpcFrontEnd, grpc_server
from gateway.grpc_upstream import GrpcUpstream, grpc_sender
from gateway.http_api import HttpFrontEnd, http_sender
from gateway.http_server import HttpServer
from gateway.metrics import GatewayMetrics
from gateway.persist import TABLE_FILE, load_table, save_doc
from gateway.protection import ProtectedPolicy
from gateway.protection_modes import Protection
from gateway.queue import FifoPolicy, Queues
from gateway.routes import RouteChange
from gateway.upstream import HttpUpstream

logger = logging.getLogger(__name__)

PERSIST_INTERVAL_S = 0.5
SERVER_SHUTDOWN_S = 0.25
"""After the grace period: how long the HTTP server waits for the last answers to be written."""


class Gateway:
    """Wires the gateway's parts together and runs them."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.table_path = config.run_dir / TABLE_FILE
        self.metrics = GatewayMetrics()
        table = load_table(self.table_path)
        if table is not None:
            logger.info("routing table of an earlier run: %d apps, seq %d", len(table.apps),
                        table.last_seq)
        self.board = RouteBoard(table)
        self.upstream = HttpUpstream(config.connect_timeout_s)
        self.grpc_upstream = GrpcUpstream()
        self.senders = self._senders()
        self.dispatcher = Dispatcher(
            self.board, self.senders, retry_min_s=config.retry_min_s,
            retry_max_s=config.retry_max_s,
            hedge_s={app: ms / 1000.0 for app, ms in config.hedge_ms.items()},
            events=self.metrics)
        self._batch_queues: dict[str, BatchPolicy] = {}
        self.refresher = ThreadPoolExecutor(1, thread_name_prefix="gateway-profile-refresh")
        """Builds Orloj's profile refreshes off the event loop, one at a time."""
        self.queues = Queues(self.dispatcher.send, self._policy, self.metrics)
        self.plane = DataPlane(config, self.board, self.dispatcher, self.queues, self.metrics)
        self.follower = EventFollower(config.controller_url, self.board, config.token,
                                      on_snapshot=self.metrics.snapshots.inc,
                                      ca_file=config.ca_file)
        self.board.add_listener(self._on_change)
        self.metrics.controller_connected.set_function(lambda: float(self.follower.connected))
        self.metrics.last_seq.set_function(lambda: float(self.board.table.last_seq))
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.http = HttpServer(HttpFrontEnd(self.plane), config.max_body_bytes,
                               stream_from=config.cut_through_bytes)
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._stop: asyncio.Event | None = None

    def _senders(self) -> dict[str, Send]:
        return {"http": http_sender(self.upstream), "grpc": grpc_sender(self.grpc_upstream)}

    def _policy(self, app_id: str) -> ProtectedPolicy | BatchPolicy:
        config = self.config
        scheduler = config.scheduler.get(app_id, "none")
        if scheduler != "none":
            return self._batch_policy(config.model_queue.get(app_id, app_id), scheduler)
        protection = Protection(mode=config.protect.get(app_id, "auto"),
                                straggler_ms=config.straggler_ms.get(app_id),
                                group_timeout_ms=config.group_timeout_ms,
                                group_fill_ms=config.group_fill_ms,
                                default_class=config.default_class.get(app_id, 0))
        return ProtectedPolicy(app_id, self.board, self.senders, protection,
                               FifoPolicy(config.max_in_flight, config.max_waiting),
                               retry_min_s=config.retry_min_s, retry_max_s=config.retry_max_s,
                               events=self.metrics, stopping=lambda: self.dispatcher.stopping)

    def _batch_policy(self, queue_id: str, scheduler: str) -> BatchPolicy:
        """The batch queue ``queue_id`` (an app's own, or one that apps share), made once."""
        policy = self._batch_queues.get(queue_id)
        if policy is None:
            config = self.config
            policy = self._batch_queues[queue_id] = BatchPolicy(
                queue_id, BatchSettings(scheduler, config.max_batch, config.exec_output),
                self._slo_ms, place=self._place, events=self.metrics,
                stopping=lambda: self.dispatcher.stopping, refresher=self.refresher)
            self.metrics.watch_scheduler(queue_id, policy.decision_cpu_p50_s)
        return policy

    def _place(self, app_id: str) -> tuple[str, str] | None:
        """Where the app is served now: (server, Triton model); None: nowhere."""
        route = self.board.route(app_id)
        if route is None or route.serving is None:
            return None
        return route.serving.server_id, route.serving.model_name

    def _slo_ms(self, app_id: str) -> float | None:
        """The app's latency objective: the gateway's setting, else its registration's."""
        configured = self.config.slo_ms.get(app_id)
        if configured is not None:
            return configured
        route = self.board.route(app_id)
        return None if route is None else route.slo_ms

    def _on_change(self, change: RouteChange) -> None:
        if change.deleted:
            self.queues.forget(change.app_id)
            if change.app_id not in self.config.model_queue:  # a shared queue outlives one app
                self._batch_queues.pop(change.app_id, None)
        if change.before is not change.after:
            self.metrics.route_changes.labels(change.app_id).inc()
        left = change.left_server
        if left is not None and change.before is not None:
            # A dead server's idle connections would each cost a failed attempt to find out.
            self.upstream.drop(change.before.http.removeprefix("http://"))
            self.grpc_upstream.drop(change.before.grpc)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, and start following the controller."""
        self._stop = asyncio.Event()
        self.http_port = await self.http.start(self.config.host, self.config.port)
        if self.config.grpc_port is not None:
            self._grpc = grpc_server(GrpcFrontEnd(self.plane))
            self.grpc_port = self._grpc.add_insecure_port(
                f"{self.config.host}:{self.config.grpc_port}")
            await self._grpc.start()
        self._tasks = [asyncio.create_task(self.follower.run(), name="gateway-follower"),
                       asyncio.create_task(self._persist_loop(), name="gateway-persist")]
        logger.info("gateway listening on http://%s:%s%s (controller %s)", self.config.host,
                    self.http_port, f", grpc port {self.grpc_port}" if self._grpc else "",
                    self.config.controller_url)

    def stop(self) -> None:
        """Ask :meth:`run` to stop (safe from a signal handler)."""
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`, then shut down."""
        await self.start()
        if self._stop is not None:
            await self._stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Close the listeners, let requests in flight finish (bounded), fail the rest."""
        started = time.monotonic()
        self.plane.closing = True
        self.http.stop_listening()  # no new connections; idle ones closed
        grpc_stopped = (asyncio.ensure_future(self._grpc.stop(self.config.stop_grace_s
                                                              + SERVER_SHUTDOWN_S))
                        if self._grpc is not None else None)
        self.follower.stop()
        try:
            async with asyncio.timeout(self.config.stop_grace_s):
                await self.plane.idle.wait()
        except TimeoutError:
            logger.warning("stopping with %d requests unanswered: they get a 503",
                           self.plane.in_flight)
        self.dispatcher.stop()
        await self.http.close(SERVER_SHUTDOWN_S)
        if grpc_stopped is not None:
            await grpc_stopped
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._persist()
        self.refresher.shutdown(wait=False, cancel_futures=True)
        await self.upstream.close()
        await self.grpc_upstream.close()
        logger.info("gateway stopped in %.2f s", time.monotonic() - started)

    # --- persistence ---------------------------------------------------------------------

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            if self.board.dirty:
                self.board.dirty = False
                doc = self.board.table.to_doc()
                try:
                    await asyncio.to_thread(save_doc, doc, self.table_path)
                except OSError as exc:
                    logger.warning("routing table not persisted: %s", exc)
                    self.board.dirty = True

    def _persist(self) -> None:
        if not self.board.dirty:
            return
        try:
            save_doc(self.board.table.to_doc(), self.table_path)
            self.board.dirty = False
        except OSError as exc:
            logger.warning("routing table not persisted: %s", exc)
