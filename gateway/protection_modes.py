"""How an app's requests are protected: the modes, their settings and the events they report.

The policy that applies them is ``gateway.protection``'s; this module is what the gateway's
service, its metrics and tests need to know of them without the request machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.config import ProtectMode
from gateway.routes import AppRoute
from parity.coding import EncoderKind
from parity.naming import parse_parity_name

FILL_OF_MEDIAN = 2.0
"""Without a fill time of its own, a parity-coded query fills its group once it has waited this
many times the median of the app's latest answers (a query that late is likely held up)."""
FILL_BEFORE_ANSWERS_MS = 5.0
"""The fill time until an app has answers enough to take their median."""
DEFAULT_RESPONSE_STRAGGLER_MS = 100.0
"""Without a straggler time of its own, a default-response app waits this long (an eager
default would answer every query with it)."""


@dataclass(frozen=True)
class Protection:
    """How one app's requests are protected (the gateway's settings for it)."""

    mode: ProtectMode = "auto"
    straggler_ms: float | None = None
    """None: 0 (eager) for parity and approximate backups, 100 ms for the default response."""
    group_timeout_ms: float = 50.0
    group_fill_ms: float | None = None
    """A query not answered this long after its send (and not before it is unavailable) fills
    its open group with stand-ins (``gateway.coding``); not below ``group_timeout_ms``: never.
    None: twice the median time of the app's latest model answers (``FILL_OF_MEDIAN``)."""
    default_class: int = 0

    def straggler_s(self, mode: str) -> float:
        """When a prediction not back yet counts as unavailable, in seconds after its send."""
        if self.straggler_ms is not None:
            return self.straggler_ms / 1000.0
        return DEFAULT_RESPONSE_STRAGGLER_MS / 1000.0 if mode == "default-response" else 0.0


class ProtectionEvents(Protocol):
    """What protected requests report (the metrics)."""

    def substituted(self, app_id: str, source: str, cause: str) -> None: ...

    def group_closed(self, app_id: str, outcome: str) -> None: ...

    def parity_sent(self, app_id: str, outcome: str) -> None: ...


class NoEvents:
    """Reports nothing (no metrics)."""

    def substituted(self, app_id: str, source: str, cause: str) -> None:
        return None

    def group_closed(self, app_id: str, outcome: str) -> None:
        return None

    def parity_sent(self, app_id: str, outcome: str) -> None:
        return None


def parity_coding(route: AppRoute) -> tuple[int, EncoderKind] | None:
    """(k, encoder) of the app's parity models, from their names; None without any."""
    for location in route.parity.values():
        parsed = parse_parity_name(location.variant)
        if parsed is not None:
            return parsed[1], parsed[2]
    return None


def effective_mode(protection: Protection, route: AppRoute) -> str:
    """The mode a request of the app is handled in now (``auto`` resolved)."""
    mode = protection.mode
    if mode == "auto":
        return "parity" if parity_coding(route) is not None else "equal-resources"
    return mode
