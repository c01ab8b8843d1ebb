"""``understudy agent``: run one server's agent (and its Triton) in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from understudy.cli.pauses import freeze_start_up_heap
from understudy.wire.bounds import MAX_CAPACITY, MAX_RESOURCES, check_name

logger = logging.getLogger(__name__)

ENV_PREFIX = "UNDERSTUDY_AGENT_"
"""Every agent setting may come from ``UNDERSTUDY_AGENT_<FIELD>`` (JSON for the capacity; see
``understudy.wire.settings`` for the precedence); the ones without a default are required
from a flag or the environment."""


def parse_capacity(text: str) -> dict[str, float]:
    """``memory_mb=8000,compute=100`` -> ``{"memory_mb": 8000.0, "compute": 100.0}``.

    Within the wire's bounds (``understudy.wire.bounds``), which the controller checks in the
    agent's hello: resource names are ids, amounts finite numbers from 0 to
    :data:`MAX_CAPACITY`, at most :data:`MAX_RESOURCES` of them. A capacity it would refuse
    fails here, at start, naming the entry.
    """
    capacity: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"capacity entry {part!r} is not NAME=NUMBER")
        capacity[_resource_name(key)] = _amount(key, value)
    if len(capacity) > MAX_RESOURCES:
        raise argparse.ArgumentTypeError(f"capacity names {len(capacity)} resources; at most "
                                         f"{MAX_RESOURCES}")
    if "memory_mb" not in capacity:
        raise argparse.ArgumentTypeError("capacity needs at least memory_mb=...")
    return capacity


def _resource_name(key: str) -> str:
    try:
        return check_name(key, "capacity resource")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _amount(key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"capacity {key}={value!r} is not a number") from exc
    if not math.isfinite(number) or not 0 <= number <= MAX_CAPACITY:
        raise argparse.ArgumentTypeError(f"capacity {key}={value.strip()} must be a finite "
                                         f"number from 0 to {MAX_CAPACITY:g}")
    return number


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``agent`` options and actions to its command parser."""
    parser.add_argument("--server-id", default=None, help="server id (required)")
    parser.add_argument("--site", default=None, dest="site_id", help="site id (required)")
    parser.add_argument("--controller-url", default=None,
                        help="controller base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--capacity", default=None, type=parse_capacity,
                        help="resources, e.g. memory_mb=8000,compute=100 (default on a server "
                             "with a GPU: its memory and compute, discovered with NVML)")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                        help="where models run: auto (GPU 0 when NVML finds one that torch "
                             "can use, else the CPU; the default), cpu, or gpu")
    parser.add_argument("--artifacts", default=None,
                        help="artifact store directory or HTTP base URL")
    parser.add_argument("--artifacts-mirror", type=Path, default=None,
                        help="local copy of the HTTP store (same host or shared file system): "
                        "weights matching the served sha256 are linked, not downloaded")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where Triton's repository, logs and caches live")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding this server's agent credential (default "
                             "$UNDERSTUDY_TOKEN_FILE, else $UNDERSTUDY_TOKEN)")
    parser.add_argument("--ca-file", type=Path, default=None,
                        help="CA that verifies an https:// controller (default "
                             "$UNDERSTUDY_CA_FILE)")
    parser.add_argument("--heartbeat-ms", type=float, default=None)
    parser.add_argument("--triton-restart", choices=["always", "never"], default=None)
    parser.add_argument("--max-restarts", type=int, default=None)
    parser.add_argument("--http-port", type=int, default=None)
    parser.add_argument("--grpc-port", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--model-load-threads", type=int, default=None,
                        help="Triton load threads and runtime spare workers (urgent loads, "
                             "the ones that end an outage, may use all)")
    parser.add_argument("--routine-load-slots", type=int, default=None,
                        help="load threads warm-backup, target and fail-back loads may use")
    parser.add_argument("--server-type", default=None)
    parser.add_argument("--triton-address", "--triton-host", dest="triton_host", default=None,
                        help="address (or host name) of the private interface Triton listens "
                             "on (default 127.0.0.1: this machine only)")
    parser.add_argument("--advertise-host", default=None,
                        help="host name clients use to reach this Triton (default: bind host)")
    parser.add_argument("--triton-nice", type=int, default=None,
                        help="niceness of Triton and its runtime (0-19; >0 favours heartbeats)")


def _discovered_capacity(device: str | None) -> dict[str, float] | None:
    """The GPU's capacity where models go on one and none was given (else None)."""
    if device == "cpu" or os.environ.get(f"{ENV_PREFIX}CAPACITY"):
        return None
    from agent.gpu import capacity, discover

    gpus = discover()
    if not gpus:
        return None
    logger.info("capacity from NVML: GPU 0 %s, %s", gpus[0].name, capacity(gpus[0]))
    return capacity(gpus[0])


def run(options: argparse.Namespace) -> int:
    """Run the agent until SIGINT/SIGTERM."""
    from agent.config import AgentConfig
    from agent.daemon import Agent
    from understudy.wire.credentials import CA_FILE_ENV, CredentialFileError, load_token
    from understudy.wire.settings import resolve

    try:
        token = load_token(options.token_file)
    except CredentialFileError as exc:
        logger.error("%s", exc)
        return 2
    try:
        config = resolve(AgentConfig, {
            "server_id": options.server_id, "site_id": options.site_id,
            "controller_url": options.controller_url,
            "capacity": options.capacity or _discovered_capacity(options.device),
            "device": options.device,
            "artifacts": options.artifacts, "artifacts_mirror": options.artifacts_mirror,
            "run_dir": options.run_dir, "token": token, "ca_file": options.ca_file,
            "heartbeat_interval_ms": options.heartbeat_ms,
            "triton_restart": options.triton_restart, "max_restarts": options.max_restarts,
            "http_port": options.http_port, "grpc_port": options.grpc_port,
            "metrics_port": options.metrics_port,
            "model_load_threads": options.model_load_threads,
            "routine_load_slots": options.routine_load_slots,
            "server_type": options.server_type, "triton_nice": options.triton_nice,
            "triton_host": options.triton_host, "advertise_host": options.advertise_host},
            ENV_PREFIX, env_names={"token": "UNDERSTUDY_TOKEN", "ca_file": CA_FILE_ENV})
    except ValidationError as exc:
        logger.error("invalid agent settings: %s", exc)
        return 2
    agent = Agent(config)
    # A load's steps run in worker threads (the model directory, Triton's load call) and
    # hand their result back to the event loop; with CPython's default 5 ms switch interval
    # each hand-off can wait that long for the GIL while the loop or another load's thread
    # runs Python, and on an interim load that is outage time. As in the controller: 1 ms.
    sys.setswitchinterval(0.001)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, agent.stop)
        freeze_start_up_heap()  # short collector passes on the load path (cli.pauses)
        await agent.run()

    asyncio.run(main())
    return 0
