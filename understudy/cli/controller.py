"""``understudy controller``: the control plane's REST API, detector and orchestrator."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from understudy.cli.pauses import freeze_start_up_heap

logger = logging.getLogger(__name__)

REDIS_PASSWORD_ENV = "UNDERSTUDY_REDIS_PASSWORD"
ENV_PREFIX = "UNDERSTUDY_CONTROLLER_"
"""Every controller setting may come from ``UNDERSTUDY_CONTROLLER_<FIELD>`` (see
``understudy.wire.settings`` for the precedence)."""


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``controller`` options and actions to its command parser."""
    parser.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default 8000)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="run directory (default runs/controller)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis (default: start a private redis-server with a "
                             "generated password); no password in it: see --redis-password-file")
    parser.add_argument("--redis-password-file", type=Path, default=None,
                        help=f"file (mode 0600) with the password of --redis-url's Redis "
                             f"(default ${REDIS_PASSWORD_ENV})")
    parser.add_argument("--credentials-dir", type=Path, default=None,
                        help="credential store (default RUN_DIR/credentials, created with a "
                             "credential per role on first start; see docs/security.md)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="authentication off: anyone who reaches the controller may do "
                             "anything (a warning at every start)")
    parser.add_argument("--tls-cert", type=Path, default=None,
                        help="serve HTTPS/WSS with this certificate (PEM; with --tls-key)")
    parser.add_argument("--tls-key", type=Path, default=None,
                        help="the certificate's private key (PEM)")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="artifact store served to agents at /v1/artifacts")
    parser.add_argument("--heartbeat-ms", type=float, default=None)
    parser.add_argument("--heartbeat-misses", type=int, default=None)
    parser.add_argument("--alpha", type=float, default=None)
    parser.add_argument("--solver", choices=["highs", "cbc", "gurobi"], default=None)
    parser.add_argument("--policy", choices=["understudy", "full-size-warm-k"], default=None)
    parser.add_argument("--startup-grace-s", type=float, default=None,
                        help="how long known servers have to reconnect after a restart "
                             "(default 3)")
    parser.add_argument("--graph-host", default=None,
                        help="address service-graph frontends listen on (replicas on the "
                             "servers must reach it; default 127.0.0.1)")
    parser.add_argument("--heartbeat-port", type=int, default=None,
                        help="UDP port agents send heartbeats to (default: a free one, "
                             "told to each agent after its hello)")
    parser.add_argument("--heartbeat-advertise", default=None,
                        help="host agents send heartbeats to (default: the host they "
                             "connected to)")


def run(options: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM."""
    from controller.api import create_app
    from controller.records import ConfigPatch
    from controller.service import Controller, ControllerSettings
    from understudy.wire.secret_files import SecretFileError, read_secret_file, url_has_password
    from understudy.wire.settings import resolve

    if options.redis_url is not None and url_has_password(options.redis_url):
        # Any local user reads a command line (/proc/PID/cmdline); the URL is not echoed.
        logger.error("--redis-url carries a password: put it in --redis-password-file or "
                     "$%s instead", REDIS_PASSWORD_ENV)
        return 2
    overrides = {"heartbeat_interval_ms": options.heartbeat_ms,
                 "heartbeat_misses": options.heartbeat_misses, "alpha": options.alpha,
                 "solver": options.solver, "policy": options.policy}
    try:
        patch = (ConfigPatch(**{k: v for k, v in overrides.items() if v is not None})
                 if any(v is not None for v in overrides.values()) else None)
        settings = resolve(ControllerSettings, {
            "host": options.host, "port": options.port, "run_dir": options.run_dir,
            "redis_url": options.redis_url, "credentials_dir": options.credentials_dir,
            "insecure": options.insecure, "tls_cert": options.tls_cert,
            "tls_key": options.tls_key,
            "redis_password_file": options.redis_password_file,
            "artifacts": options.artifacts, "startup_grace_s": options.startup_grace_s,
            "config": patch, "graph_host": options.graph_host,
            "heartbeat_port": options.heartbeat_port,
            "heartbeat_advertise": options.heartbeat_advertise},
            ENV_PREFIX, env_names={"redis_password": REDIS_PASSWORD_ENV})
        if settings.redis_password_file is not None:
            read_secret_file(settings.redis_password_file)  # refused now, not after start-up
    except (ValidationError, SecretFileError) as exc:
        logger.error("invalid controller settings: %s", exc)
        return 2
    controller = Controller(settings)
    app = create_app(controller)
    # The event loop (agent replies, client pushes) shares the GIL with the
    # planning threads (Algorithm 1, the warm ILP's model building). With CPython's default
    # 5 ms switch interval a CPU-bound planning thread makes each waiting loop turn, and
    # the loop makes the planner, wait up to 5 ms per hand-off: on the failover path that
    # is time between detection and the interim loads. 1 ms keeps both within a millisecond.
    sys.setswitchinterval(0.001)
    freeze_start_up_heap()  # short collector passes on the failover path (cli.pauses)
    tls = ({"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)}
           if settings.tls_cert is not None else {})
    serve(app, controller.shutting_down, host=settings.host, port=settings.port,
          **server_options(), **tls)
    return 0


def serve(app: Any, on_exit: Callable[[], None], **options: Any) -> None:
    """Run uvicorn with ``options`` until SIGINT/SIGTERM, calling ``on_exit`` on the signal.

    ``on_exit`` runs before uvicorn closes any connection (its lifespan shutdown comes only
    after them): the controller must know that its agents' connections close because it
    stops, not because their servers failed.
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, **options)).run()


GRACEFUL_SHUTDOWN_S = 3.0
"""How long a stopping controller waits for its connections to close before it cancels them."""


def server_options() -> dict[str, Any]:
    """The options the controller's uvicorn server runs with (besides the address).

    ``ws_max_size``: a websocket message larger than the wire protocol's frame limit is refused
    by the server as it arrives (close 1009), before it is buffered and handed to the app; with
    uvicorn's default (16 MiB) such a frame was read whole and only then refused.
    ``timeout_graceful_shutdown``: a stop waits at most this long for open connections and
    tasks; uvicorn's default waits forever. After the frame fuzzing a controller told to stop
    never did: event-stream handlers whose sender's cancellation was lost in a Redis read
    waited for ever (fixed in ``controller.events.Subscription``); the bound stays, so that no
    handler can hold a stop again.
    """
    from understudy.wire.protocol import MAX_FRAME_BYTES

    return {"log_level": "warning", "ws": "websockets-sansio", "ws_ping_interval": None,
            "ws_max_size": MAX_FRAME_BYTES, "lifespan": "on",
            "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S}
