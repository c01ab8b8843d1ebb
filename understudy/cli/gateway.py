"""``understudy gateway``: the inference gateway (KServe v2 endpoints per app) in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from understudy.cli.pauses import CollectorPauses, freeze_start_up_heap

logger = logging.getLogger(__name__)

ENV_PREFIX = "UNDERSTUDY_GATEWAY_"
"""Every gateway setting may come from ``UNDERSTUDY_GATEWAY_<FIELD>`` (JSON for ``hedge_ms``;
see ``understudy.wire.settings`` for the precedence)."""
GIL_SWITCH_S = 0.001
"""How long the event loop's thread waits for the GIL while another thread computes (Python's
default: 5 ms). Orloj's profile refreshes are built on a worker thread; without this, each
time the loop wakes during one it could wait up to 5 ms, a fair share of a tight objective."""


def parse_hedge(text: str) -> tuple[str, float]:
    """``APP=MS`` -> ``(app, ms)``."""
    app_id, sep, value = text.partition("=")
    if not sep or not app_id.strip():
        raise argparse.ArgumentTypeError(f"hedge {text!r} is not APP=MS")
    try:
        delay = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"hedge delay {value!r} is not a number") from exc
    return app_id.strip(), delay


def parse_app_setting(kind: Callable[[str], object]) -> Callable[[str], tuple[str, object]]:
    """A parser of ``APP=VALUE`` with ``VALUE`` read by ``kind``."""

    def parse(text: str) -> tuple[str, object]:
        app_id, sep, value = text.partition("=")
        if not sep or not app_id.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is not APP=VALUE")
        try:
            return app_id.strip(), kind(value.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from exc

    return parse


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``gateway`` options to its command parser."""
    parser.add_argument("--controller-url", default=None,
                        help="controller base URL, e.g. http://127.0.0.1:8000 (required)")
    parser.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="HTTP port of the KServe v2 endpoint (default 8100; 0: any free)")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="gRPC port of the KServe v2 endpoint (default: none)")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the gateway credential for the controller (default "
                             "$UNDERSTUDY_TOKEN_FILE, else $UNDERSTUDY_TOKEN)")
    parser.add_argument("--ca-file", type=Path, default=None,
                        help="CA that verifies an https:// controller (default "
                             "$UNDERSTUDY_CA_FILE)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where the routing table is kept across restarts "
                             "(default runs/gateway)")
    parser.add_argument("--hedge-ms", type=parse_hedge, action="append", default=None,
                        metavar="APP=MS",
                        help="after MS ms without an answer, also send APP's request to its "
                             "warm backup (repeatable)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="how long a request may wait across failovers when it names no "
                             "deadline (default 30)")
    parser.add_argument("--cut-through-kib", type=int, default=None,
                        help="a request body at least this large goes on to Triton while it "
                             "arrives (default 128; 0: read every body whole first)")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="per app: requests sent to Triton at once (default 64)")
    parser.add_argument("--protect", type=parse_app_setting(str), action="append",
                        default=None, metavar="APP=MODE",
                        help="how APP's requests are protected: auto (default), parity, "
                             "equal-resources, default-response, approximate-backup, none "
                             "(repeatable)")
    parser.add_argument("--straggler-ms", type=parse_app_setting(float), action="append",
                        default=None, metavar="APP=MS",
                        help="a prediction of APP not back MS ms after it was sent is "
                             "unavailable (default 0 for parity and approximate backups: as "
                             "soon as the stand-in is ready; 100 for the default response)")
    parser.add_argument("--default-class", type=parse_app_setting(int), action="append",
                        default=None, metavar="APP=CLASS",
                        help="the class APP's default response answers (default 0)")
    parser.add_argument("--scheduler", type=parse_app_setting(str), action="append",
                        default=None, metavar="APP=NAME",
                        help="how APP's requests are batched and ordered: none (default), "
                             "orloj, orloj_paper (the paper's rules only), clipper, nexus, "
                             "clockwork, triton (repeatable)")
    parser.add_argument("--slo-ms", type=parse_app_setting(float), action="append",
                        default=None, metavar="APP=MS",
                        help="the latency objective APP's scheduler plans for (default: the "
                             "app's registered latency_slo_ms)")
    parser.add_argument("--model-queue", type=parse_app_setting(str), action="append",
                        default=None, metavar="APP=QUEUE",
                        help="apps given the same QUEUE share one batch queue and scheduler: "
                             "their requests are batched together (they must be served by the "
                             "same model and have the same --scheduler; repeatable)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="rows in one batch a scheduler sends (default 8)")
    parser.add_argument("--exec-output", default=None,
                        help="output through which a dynamic model reports each row's "
                             "execution time in microseconds (default exec_us)")
    parser.add_argument("--group-timeout-ms", type=float, default=None,
                        help="a coding group not filled this long is closed unprotected "
                             "(default 50)")
    parser.add_argument("--group-fill-ms", type=float, default=None,
                        help="a parity-coded query not answered this long fills its open group "
                             "with queries answered before, to be rebuilt at once (default: "
                             "twice the median of the app's latest answers; not below "
                             "--group-timeout-ms: never)")


def run(options: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM."""
    from gateway.config import GatewayConfig
    from gateway.service import Gateway
    from understudy.wire.credentials import CA_FILE_ENV, CredentialFileError, load_token
    from understudy.wire.settings import resolve

    try:
        token = load_token(options.token_file)
    except CredentialFileError as exc:
        logger.error("%s", exc)
        return 2
    try:
        config = resolve(GatewayConfig, {
            "controller_url": options.controller_url, "host": options.host,
            "port": options.port, "grpc_port": options.grpc_port, "token": token,
            "ca_file": options.ca_file,
            "run_dir": options.run_dir,
            "hedge_ms": dict(options.hedge_ms) if options.hedge_ms else None,
            "default_deadline_s": options.deadline_s,
            "max_in_flight": options.max_in_flight,
            "cut_through_kib": options.cut_through_kib,
            "protect": dict(options.protect) if options.protect else None,
            "straggler_ms": dict(options.straggler_ms) if options.straggler_ms else None,
            "default_class": dict(options.default_class) if options.default_class else None,
            "group_timeout_ms": options.group_timeout_ms,
            "group_fill_ms": options.group_fill_ms,
            "scheduler": dict(options.scheduler) if options.scheduler else None,
            "slo_ms": dict(options.slo_ms) if options.slo_ms else None,
            "model_queue": dict(options.model_queue) if options.model_queue else None,
            "max_batch": options.max_batch, "exec_output": options.exec_output},
            ENV_PREFIX, env_names={"token": "UNDERSTUDY_TOKEN", "ca_file": CA_FILE_ENV})
    except ValidationError as exc:
        logger.error("invalid gateway settings: %s", exc)
        return 2
    gateway = Gateway(config)
    pauses = CollectorPauses(gateway.metrics.collector_paused)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, gateway.stop)
        freeze_start_up_heap()  # before listening: its own pass keeps no request waiting
        pauses.install()
        await gateway.run()

    sys.setswitchinterval(GIL_SWITCH_S)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop: uvloop's where it is installed, else the standard one.

    The gateway's request path is system calls and loop turns, which uvloop runs in C.
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
