"""The gateway's settings (flags, then ``UNDERSTUDY_GATEWAY_*``, then these defaults)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

APP_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
"""What the controller accepts as an app id (``controller/records.py``'s ``ID_PATTERN``, without
``__``, which separates app and variant in Triton model names). Kept here because the gateway
must not import the controller."""


ProtectMode = Literal["auto", "parity", "equal-resources", "default-response",
                      "approximate-backup", "none"]
"""How an app's requests are protected (``gateway.protection``)."""

SchedulerName = Literal["none", "orloj", "orloj_paper", "clipper", "nexus", "clockwork",
                        "triton"]
"""How an app's requests are batched and ordered (``gateway.batching``; ``none``: one by one,
in arrival order)."""


def valid_app_id(app_id: str) -> bool:
    """Whether ``app_id`` could name a registered app."""
    return APP_ID_PATTERN.match(app_id) is not None and "__" not in app_id


class GatewayConfig(BaseModel):
    """Start-up settings of one gateway process."""

    model_config = ConfigDict(extra="forbid")

    controller_url: str = Field(pattern=r"^https?://")
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, lt=65536)
    """HTTP port of the KServe v2 endpoint (0: a free one)."""
    grpc_port: int | None = Field(None, ge=0, lt=65536)
    """gRPC port of the KServe v2 endpoint; None: no gRPC endpoint."""
    token: str | None = None
    """The gateway credential for the controller (``understudy.wire.credentials``: from a
    file or the environment, never a flag)."""
    ca_file: Path | None = None
    """CA that verifies an ``https://`` controller (None: the system's CAs)."""
    run_dir: Path = Path("runs/gateway")
    """Where the routing table is persisted (``routes.json``)."""
    hedge_ms: dict[str, float] = Field(default_factory=dict)
    """Per app: after this many milliseconds without an answer, also ask its warm backup."""
    default_deadline_s: float = Field(30.0, gt=0)
    """How long a request may wait across failovers when it names no deadline."""
    max_deadline_s: float = Field(300.0, gt=0)
    max_body_mb: float = Field(64.0, gt=0)
    """Largest request body accepted (413 above)."""
    cut_through_kib: int = Field(128, ge=0, le=1024 * 1024)
    """A body at least this large is forwarded to Triton while it arrives (0: every body is
    read whole first, store-and-forward)."""
    max_in_flight: int = Field(64, ge=1)
    """Per app: requests sent to Triton at once; the others wait in the app's queue."""
    max_waiting: int = Field(1024, ge=0)
    """Per app: requests waiting in the queue before new ones are refused (503)."""
    connect_timeout_s: float = Field(1.0, gt=0)
    retry_min_s: float = Field(0.05, gt=0)
    """After a failed attempt with no move announced, the first retry's delay (doubles)."""
    retry_max_s: float = Field(1.0, gt=0)
    stop_grace_s: float = Field(0.8, gt=0)
    """On SIGTERM: how long requests in flight may finish before they are failed."""
    protect: dict[str, ProtectMode] = Field(default_factory=dict)
    """Per app: how requests are protected (``gateway.protection``; default ``auto``)."""
    straggler_ms: dict[str, float] = Field(default_factory=dict)
    """Per app: a prediction not back this long after it was sent is unavailable (default: 0
    for parity models and approximate backups, 100 for the default response)."""
    default_class: dict[str, int] = Field(default_factory=dict)
    """Per app: the class the default response answers (default 0)."""
    group_timeout_ms: float = Field(50.0, gt=0, le=60_000)
    """A coding group not filled this long after its first query is closed unprotected."""
    group_fill_ms: float | None = Field(None, ge=0, le=60_000)
    """A query of a parity-coded app not answered this long after its send fills its open group
    with stand-ins (queries answered before) so that it can be rebuilt at once; not below
    ``group_timeout_ms``: never. None: twice the median of the app's latest answer times."""
    scheduler: dict[str, SchedulerName] = Field(default_factory=dict)
    """Per app: the batch scheduler of its queue (``gateway.batching``; default ``none``)."""
    slo_ms: dict[str, float] = Field(default_factory=dict)
    """Per app: the latency objective its scheduler plans for (default: the app's registered
    ``latency_slo_ms``, else each request's own timeout)."""
    model_queue: dict[str, str] = Field(default_factory=dict)
    """Per app: a queue name; apps given the same name share one batch queue, one scheduler and
    one batch in flight (the per-model queue: their requests are batched together, so they must
    be served by the same model). Default: each app its own queue."""
    max_batch: int = Field(8, ge=1, le=1024)
    """Rows in one batch a scheduler sends (at most the model's ``max_batch_size``)."""
    exec_output: str = Field("exec_us", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Output through which a dynamic model reports each row's execution time (µs); without
    it, the batch's measured time stands in."""

    @field_validator("hedge_ms", "straggler_ms")
    @classmethod
    def _delays(cls, value: dict[str, float]) -> dict[str, float]:
        for app_id, delay in value.items():
            if not valid_app_id(app_id):
                raise ValueError(f"{app_id!r}: not an app id")
            if not math.isfinite(delay) or delay < 0:
                raise ValueError(f"{app_id!r}: delay must be >= 0 ms")
        return value

    @field_validator("slo_ms")
    @classmethod
    def _slos(cls, value: dict[str, float]) -> dict[str, float]:
        for app_id, slo in value.items():
            if not valid_app_id(app_id):
                raise ValueError(f"{app_id!r}: not an app id")
            if not math.isfinite(slo) or not 0 < slo <= 3_600_000:
                raise ValueError(f"{app_id!r}: SLO must be > 0 ms and at most an hour")
        return value

    @field_validator("protect", "default_class", "scheduler")
    @classmethod
    def _apps(cls, value: dict[str, object]) -> dict[str, object]:
        for app_id, setting in value.items():
            if not valid_app_id(app_id):
                raise ValueError(f"{app_id!r}: not an app id")
            if isinstance(setting, int) and setting < 0:
                raise ValueError(f"default class for {app_id!r} must be >= 0")
        return value

    @field_validator("model_queue")
    @classmethod
    def _queue_names(cls, value: dict[str, str]) -> dict[str, str]:
        for app_id, name in value.items():
            if not valid_app_id(app_id):
                raise ValueError(f"{app_id!r}: not an app id")
            if not valid_app_id(name):
                raise ValueError(f"{name!r}: not a queue name (letters, digits, '_', '.', "
                                 f"'-'; at most 63)")
        return value

    @model_validator(mode="after")
    def _shared_queues_schedule_alike(self) -> GatewayConfig:
        for name, apps in self.shared_queues().items():
            schedulers = {self.scheduler.get(app, "none") for app in apps}
            if len(schedulers) != 1 or "none" in schedulers:
                raise ValueError(f"queue {name!r}: its apps ({', '.join(apps)}) must all have "
                                 f"the same batch scheduler (--scheduler), not "
                                 f"{', '.join(sorted(schedulers))}")
        return self

    def shared_queues(self) -> dict[str, list[str]]:
        """Queue name -> its apps (sorted), for every name ``model_queue`` gives."""
        found: dict[str, list[str]] = {}
        for app_id, name in sorted(self.model_queue.items()):
            found.setdefault(name, []).append(app_id)
        return found

    @property
    def cut_through_bytes(self) -> int:
        """``cut_through_kib`` in bytes; 0 (off) as a size no body reaches."""
        return self.cut_through_kib * 1024 if self.cut_through_kib else 1 << 62

    @property
    def max_body_bytes(self) -> int:
        """``max_body_mb`` in bytes."""
        return int(self.max_body_mb * 1024 * 1024)
