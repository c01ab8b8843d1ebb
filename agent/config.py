"""An agent's settings (``AgentConfig``) and what it does when its Triton dies (``RestartPolicy``).

Kept apart from :mod:`agent.daemon` so that the command line and tests build and validate a
configuration without importing the agent's loops.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from understudy.wire.bounds import MAX_DURATION_S, Capacities, HeartbeatIntervalMs, Id
from understudy.wire.protocol import AGENT_WS_PATH


class RestartPolicy(StrEnum):
    """What the agent does when its Triton dies."""

    NEVER = "never"
    ALWAYS = "always"


class AgentConfig(BaseModel):
    """Everything one agent needs; ports 0 mean "pick free ones".

    Identity, capacity and heartbeat interval keep the wire's bounds (``understudy.wire.bounds``),
    the ones the controller checks in the hello: a value it would refuse (a NaN or infinite
    capacity, an id with a ``/``, a 5e-324 ms heartbeat) fails here, at start, with pydantic's
    message naming the field, instead of as a closed connection retried forever.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    server_id: Id
    site_id: Id
    controller_url: str
    capacity: Capacities
    artifacts: str
    """Local artifact store directory or HTTP base URL."""
    artifacts_mirror: Path | None = None
    """A local copy of an HTTP source's store (same host or shared file system): verified
    weights are linked from it instead of downloaded (``agent.repository``)."""
    run_dir: Path
    token: str | None = None
    """This server's agent credential (``understudy credentials agent``); from a file or the
    environment (``understudy.wire.credentials``), never a flag."""
    ca_file: Path | None = None
    """CA that verifies an ``https://`` controller (None: the system's CAs)."""
    server_type: Id = "testbed"
    heartbeat_interval_ms: HeartbeatIntervalMs = 20.0
    triton_restart: RestartPolicy = RestartPolicy.ALWAYS
    max_restarts: int = Field(5, ge=0)
    restart_backoff_s: float = Field(0.5, ge=0, le=MAX_DURATION_S)
    reconnect_initial_s: float = Field(0.05, gt=0, le=MAX_DURATION_S)
    reconnect_max_s: float = Field(2.0, gt=0, le=MAX_DURATION_S)
    http_port: int = Field(0, ge=0, lt=65536)
    grpc_port: int = Field(0, ge=0, lt=65536)
    metrics_port: int = Field(0, ge=0, lt=65536)
    model_load_threads: int = Field(3, ge=1)
    """Triton's load threads (and the runtime's spare workers): urgent loads may use all.
    Loads are CPU-bound here: on the 2-core testbed six threads made a failover's four
    interims load all at once and finish later than three at a time (see agent/load_slots.py)."""
    routine_load_slots: int = Field(2, ge=1)
    """Load threads routine loads may use at once (at most model_load_threads - 1, so one is
    always free for an urgent load; agent/load_slots.py)."""
    use_runtime: bool = True
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """Where models run: ``auto`` places them on GPU 0 when NVML finds one that torch can use
    (``agent.gpu``), else on the CPU; ``cpu`` never looks; ``gpu`` insists."""
    triton_nice: int = Field(0, ge=0, le=19)
    triton_host: str = "127.0.0.1"
    advertise_host: str | None = None

    def websocket_url(self) -> str:
        """The controller's agent endpoint as a ws:// URL."""
        url = self.controller_url.rstrip("/")
        for http, ws in (("http://", "ws://"), ("https://", "wss://")):
            if url.startswith(http):
                url = ws + url[len(http):]
        if url.endswith(AGENT_WS_PATH):
            return url
        return url + AGENT_WS_PATH
