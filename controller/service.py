"""Wiring: settings, the embedded Redis, store, detector, agent hub, orchestrator, lifecycle.

Configuration precedence: the runtime config stored in Redis (what an operator set through the
API) > explicit command-line options (applied as a patch at start) > defaults.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from controller.access import Gate
from controller.agents import AgentHub
from controller.artifacts import ArtifactCatalog
from controller.collector import pace_collector
from controller.credentials import CredentialStore
from controller.declarations import DeclarationLog
from controller.detector import FailureDetector
from controller.events import EventHub
from controller.executor import Executor
from controller.graphs.manager import GraphManager
from controller.interfaces import SystemClock
from controller.lifecycle import ServerLifecycle
from controller.metrics import Metrics
from controller.orchestrator import Orchestrator
from controller.prefetch import InterimPrefetcher
from controller.protection import ProtectionKeeper
from controller.reconciler import Reconciler
from controller.records import AppStatus, ConfigPatch, RuntimeConfig, ServerState
from controller.redis_server import RedisServer, with_password
from controller.returns import ServerReturns
from controller.stopping import cancel_and_wait
from controller.store import Store
from controller.warm_plan import WarmPlanner
from model_repo.profiles import load_families
from understudy.wire.secret_files import read_secret_file, redact_url, url_has_password

logger = logging.getLogger(__name__)


class ControllerSettings(BaseModel):
    """Start-up settings of one controller process."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, lt=65536)
    run_dir: Path = Path("runs/controller")
    redis_url: str | None = None
    """None: start a private redis-server under ``run_dir/redis`` (the embedded default, with a
    password generated into ``run_dir/redis/password``)."""
    redis_password_file: Path | None = None
    """File (mode 0600) with the password of the Redis at ``redis_url``."""
    redis_password: SecretStr | None = None
    """The password of the Redis at ``redis_url`` (from ``UNDERSTUDY_REDIS_PASSWORD``; a file
    wins over it)."""
    credentials_dir: Path | None = None
    """The credential store (``controller.credentials``); None: ``run_dir/credentials``,
    created with a credential per role on first start."""
    insecure: bool = False
    """Authentication off: every caller may do everything (a warning at every start)."""
    tls_cert: Path | None = None
    """Serve HTTPS and WSS with this certificate (PEM, the chain after it) and ``tls_key``."""
    tls_key: Path | None = None
    artifacts: Path | None = None
    """Artifact store served to agents at /v1/artifacts."""
    profiles_dir: Path | None = None
    startup_grace_s: float = Field(3.0, gt=0)
    """After a restart, how long a known server has to reconnect before it is failed."""
    config: ConfigPatch | None = None
    """Explicit runtime settings from the command line."""
    heartbeat_port: int = Field(0, ge=0, lt=65536)
    """UDP port of the heartbeat channel (0: a free one; agents learn it after their hello)."""
    heartbeat_advertise: str | None = None
    """Host agents send heartbeats to; None: the host they reached the controller at."""
    graph_host: str = "127.0.0.1"
    """Address the service graphs' frontends and managers listen on; replica processes on the
    servers connect to it, so it must be reachable from them (not 0.0.0.0)."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ControllerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        return self

    @property
    def credentials_path(self) -> Path:
        """Where the credential store is."""
        return self.credentials_dir or self.run_dir / "credentials"

    @property
    def scheme(self) -> str:
        """``https`` with a certificate, else ``http``."""
        return "https" if self.tls_cert is not None else "http"


class Controller:
    """One controller: ``await start()``, serve the API, ``await stop()``."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.redis_server: RedisServer | None = None
        self.store: Store | None = None
        self.metrics = Metrics()
        # The packaged (synthetic) families, and the ones imported into the artifact store.
        self.families = load_families(settings.profiles_dir,
                                      stores=[settings.artifacts] if settings.artifacts else [])
        self.artifacts = ArtifactCatalog(settings.artifacts)
        self.ready = False
        self._gauges_at: int | None = None
        # The store is opened (created on first start) by start(); until then no one gets in.
        self.gate = Gate(None if settings.insecure else CredentialStore(settings.credentials_path))

    def open_credentials(self) -> None:
        """Create the credential store on first start; say where it is, or that there is none."""
        store = self.gate.store
        if store is None:
            logger.warning("authentication is OFF (--insecure): anyone who reaches this "
                           "controller may read and change everything and speak for any server")
            return
        created = store.init()
        if created:
            logger.warning("credentials generated in %s (mode 0600): %s; agents need one each: "
                           "understudy credentials agent --dir %s --server-id ID",
                           store.directory, ", ".join(p.name for p in created), store.directory)
        else:
            store.load()  # fails now, not at the first request, when it is unreadable
            logger.info("credentials from %s", store.directory)

    async def start(self) -> None:
        """Start Redis (if embedded) and the core; reconcile with what Redis remembers."""
        self.open_credentials()
        url = self.settings.redis_url
        if url is None:
            self.redis_server = RedisServer(self.settings.run_dir / "redis")
            await asyncio.to_thread(self.redis_server.start)
            url = self.redis_server.url
        else:
            url = with_password(url, self.redis_password())
            if not url_has_password(url):
                logger.warning("Redis at %s is used without a password: anyone who reaches it "
                               "can rewrite the cluster's state (--redis-password-file)", url)
        self.store = Store(url)
        self.metrics.watch_redis(self.store.health.stats)
        config = await self.store.config() or RuntimeConfig()
        if self.settings.config is not None:
            config = config.model_copy(update=self.settings.config.model_dump(exclude_none=True))
        await self.store.put_config(config)
        self.events = EventHub(self.store)
        self.declarations = DeclarationLog(self.store.redis, self.store.prefix)
        self.detector = FailureDetector(config.heartbeat_interval_ms / 1000.0,
                                        config.heartbeat_misses, host=self.settings.host,
                                        port=self.settings.heartbeat_port,
                                        advertise_host=self.settings.heartbeat_advertise)
        await self.detector.start()
        self.metrics.watch_detector(lambda: self.detector.stats)
        self.agents = AgentHub(self.detector, self._on_hello, self._on_triton_up,
                               self._on_revived)
        clock = SystemClock()
        self.executor = Executor(self.store, self.agents, self.events,
                                 self.metrics, self.artifacts, clock,
                                 on_serving_moved=lambda: self.warm.request())
        self.prefetcher = InterimPrefetcher(self.store, self.agents, self.artifacts,
                                            self.families, self.executor.spawn)
        self.orchestrator = Orchestrator(self.executor, self.store, self.families, config,
                                         clock, on_registered=self.prefetcher.request,
                                         held_variants=self.artifacts.variants)
        self.warm = WarmPlanner(self.executor, self.store, self.families,
                                lambda: self.orchestrator.config, self.orchestrator.policy,
                                self.metrics, clock)
        self.returns = ServerReturns(
            self.executor, self.store, self.agents, self.detector, self.families, self.metrics,
            failback=lambda: self.orchestrator.config.failback,
            place_unplaced=self.orchestrator.place_unplaced,
            server_joined=self.prefetcher.server_joined,
            request_warm_replan=self.warm.request, declarations=self.declarations)
        self.lifecycle = ServerLifecycle(
            self.executor, self.store, self.agents, self.detector, self.families,
            self.orchestrator.policy, self.metrics, clock, self.warm.replan_soon, self.returns,
            self.declarations)
        self.reconciler = Reconciler(self.executor, self.store, self.agents, self.families,
                                     self.metrics, busy=self.returns.reviving)
        self.protection = ProtectionKeeper(self.executor, self.store, self.families, clock)
        self.graphs = GraphManager(
            self.store, self.agents, self.settings.run_dir, host=self.settings.graph_host,
            controller_url=f"{self.settings.scheme}://{self.settings.graph_host}:"
                           f"{self.settings.port}")
        self.agents.on_replica_exited = self.graphs.on_replica_exited

        def fail_commands(server_id: str, *_: object) -> None:
            self.agents.fail_pending(server_id, "declared failed")

        # Graph replicas first: their recovery needs no agent command, only the signal.
        self.detector.listeners += [
            lambda server_id, *_: self.graphs.on_server_failed(server_id), fail_commands,
            self.lifecycle.on_failure]
        self.graphs.hosts.free_of = self._free_capacity
        await self.graphs.start()
        await self.lifecycle.startup_reconcile(self.settings.startup_grace_s)
        self._converge = asyncio.ensure_future(self.orchestrator.converge_forever())
        self._watchdog = asyncio.ensure_future(
            self.lifecycle.watchdog(lambda: self.orchestrator.config.failback))
        self._collector = asyncio.ensure_future(
            pace_collector(self.executor.no_urgent_loads))
        self._reconcile = asyncio.ensure_future(self.reconciler.run_forever())
        self._protect = asyncio.ensure_future(self.protection.run_forever())
        self.ready = True
        logger.info("controller ready (redis %s, policy %s, T=%g ms, k=%d)", redact_url(url),
                    config.policy, config.heartbeat_interval_ms, config.heartbeat_misses)

    def redis_password(self) -> str | None:
        """The external Redis's password: the file's, else the environment's, else none."""
        if self.settings.redis_password_file is not None:
            return read_secret_file(self.settings.redis_password_file)
        if self.settings.redis_password is not None:
            return self.settings.redis_password.get_secret_value()
        return None

    async def _free_capacity(self) -> dict[str, dict[str, float]]:
        """Each live server's capacity left after its app placements (graph replicas' room)."""
        snapshot, _, _ = await self.orchestrator.snapshot()
        return {server: dict(free) for server, free in snapshot.free.items()}

    async def _on_hello(self, hello: Any) -> None:
        self.graphs.on_hello(hello)
        await self.returns.on_hello(hello)

    async def _on_revived(self, server_id: str) -> None:
        await self.returns.revive(server_id)

    async def _on_triton_up(self, server_id: str, message: Any) -> None:
        await self.returns.on_triton_up(server_id, message)

    def shutting_down(self) -> None:
        """A stop signal came: no longer ready, and no server declared failed from now on.

        Called from the server's signal handler (``understudy controller``), before the server
        closes the agents' connections; :meth:`stop` comes after that.
        """
        self.ready = False
        if hasattr(self, "detector"):
            self.detector.shutting_down()

    async def stop(self) -> None:
        """Close connections and stop the embedded Redis."""
        self.shutting_down()
        if self.store is not None:
            self.store.stop_waiting()  # in a Redis outage, what waits for it fails: no hang
        if hasattr(self, "_converge"):
            await cancel_and_wait([self._converge, self._watchdog, self._collector,
                                   self._reconcile, self._protect])
        if hasattr(self, "graphs"):
            await self.graphs.close()
        if hasattr(self, "detector"):
            await self.detector.stop()
            self.events.close_all()
            await self.agents.close_all()
        if self.store is not None:
            await self.store.close()
        if self.redis_server is not None:
            await asyncio.to_thread(self.redis_server.stop)

    async def update_config(self, patch: ConfigPatch) -> RuntimeConfig:
        """Apply a config patch: persist, push heartbeat settings, re-plan if it matters."""
        assert self.store is not None  # noqa: S101 - started
        o = self.orchestrator
        changes = patch.model_dump(exclude_none=True)
        config = o.config.model_copy(update=changes)
        RuntimeConfig.model_validate(config.model_dump())
        await self.store.put_config(config)
        o.config = config
        if {"heartbeat_interval_ms", "heartbeat_misses"} & changes.keys():
            self.detector.configure(config.heartbeat_interval_ms / 1000.0,
                                    config.heartbeat_misses)
            await self.agents.configure(config.heartbeat_interval_ms)
        if {"alpha", "solver", "time_limit_s", "mip_rel_gap", "site_independent",
                "warm_replicas", "policy", "warm_method"} & changes.keys():
            self.warm.request()
        return config

    async def refresh_gauges(self) -> None:
        """Set the apps-by-status and servers-by-state gauges from the records."""
        assert self.store is not None  # noqa: S101
        view = await self.store.view()
        if view.revision == self._gauges_at:
            return  # the records have not changed since the last scrape
        self._gauges_at = view.revision
        statuses = Counter(a.status for a in view.apps.values())
        for status in AppStatus:
            self.metrics.apps.labels(status.value).set(statuses[status])
        states = Counter(s.state for s in view.servers.values())
        for state in ServerState:
            self.metrics.servers.labels(state.value).set(states[state])
