"""The priority of a runtime worker: loading, starting to serve, serving.

Loads that end an outage go first (FailLite's recovery time is the load time); a loaded worker
then yields to them. A worker that starts to serve after idling (most often a warm backup its
app has just switched to) is as urgent as those loads for a moment: its first answers end that
app's outage. Pure decisions over given times, and the one call that applies a niceness.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SERVING_NICE_STEP = 5
"""How much nicer a worker becomes once its model is loaded. During a failover, interim loads
compete for the CPU with the inference of every app still serving on the server; FailLite's
recovery time is the load time, so loads go first. Measured on this 2-core machine: three
concurrent loads next to two busy inference loops took 320-785 ms at equal priority and
235-378 ms with the loops 5 steps nicer (220-425 ms with the machine otherwise quiet)."""


LOADING_NICE_STEP = 5
"""How much less nice than the runtime a worker is while it loads (where the OS allows it:
root, or CAP_SYS_NICE). A failover's interims load while the dead server's processes are torn
down and the rest of the data plane runs at the runtime's niceness; on the 6-server testbed
(one 2-core machine) three interims loading together took 93 ms each against 45 ms on a
quiet machine. The recovery is the load, so it goes first."""


STARTING_IDLE_S = 1.0
"""A worker whose request comes after this long without one (or that never answered one) is
starting to serve: most often a warm backup its app has just switched to, whose first answers
end that app's outage; otherwise an app that sends rarely, or a replica taking over after an
upgrade or a fail-back."""
STARTING_BOOST_S = 1.0
"""How long a worker that starts to serve keeps the loads' priority (``LOADING_NICE_STEP``)
before it yields to loads again. A failover's warm switches and interim loads come together,
often on the same server: at the serving niceness the switched apps' first answers waited
for the interims' loads, 10 nice steps apart (FailLite: a warm switch is the fast path).
``UNDERSTUDY_STARTING_BOOST_S`` in the runtime's environment overrides it (0: never)."""
STARTING_BOOST_ENV = "UNDERSTUDY_STARTING_BOOST_S"
MAX_STARTING_BOOST_S = 60.0


def starting_boost_s(environ: Mapping[str, str]) -> float:
    """The boost's length from the environment (:data:`STARTING_BOOST_S` when unset).

    ValueError for anything but a finite number of seconds within [0, 60].
    """
    text = environ.get(STARTING_BOOST_ENV)
    if text is None:
        return STARTING_BOOST_S
    value = float(text)
    if not math.isfinite(value) or not 0.0 <= value <= MAX_STARTING_BOOST_S:
        raise ValueError(f"{STARTING_BOOST_ENV}={text!r}: seconds from 0 to "
                         f"{MAX_STARTING_BOOST_S:g}")
    return value


def loading_niceness(request: dict[str, Any], base_nice: int) -> int:
    """The niceness a worker loads its model at.

    A load that ends an outage (an interim, an app with nothing serving) outranks inference:
    the recovery is the load. A routine one (a warm backup, an upgrade, a fail-back: the
    config's ``load_priority`` is ``routine``) loads at the serving niceness, so that it does not
    slow the answers of apps that just switched to a warm backup next to it. A config without
    the parameter (written before it existed) loads as urgent.
    """
    parameters = request.get("config", {}).get("parameters", {})
    priority = parameters.get("load_priority", {}).get("string_value", "urgent")
    if priority == "routine":
        return serving_niceness(base_nice)
    return starting_niceness(base_nice)


def serving_niceness(base_nice: int) -> int:
    """A loaded worker's niceness: SERVING_NICE_STEP nicer than the runtime (loads go first)."""
    return min(19, base_nice + SERVING_NICE_STEP)


def starting_niceness(base_nice: int) -> int:
    """A worker that starts to serve: the niceness of a load that ends an outage."""
    return max(-20, base_nice - LOADING_NICE_STEP)


@dataclass
class ServingPace:
    """When a serving worker runs at the loads' priority (pure: times are given).

    A request after ``STARTING_IDLE_S`` without one, or the first ever, boosts the worker for
    ``boost_s`` (``STARTING_BOOST_S``, see there; 0 never boosts); the boost ends when that
    time passes, checked at each request and when the worker waits. The calls return the
    niceness to apply, or None.
    """

    base_nice: int
    boost_s: float = STARTING_BOOST_S
    boosted_until: float | None = None
    last_answer_at: float | None = None

    def request(self, now: float) -> int | None:
        starting = (self.last_answer_at is None or
                    now - self.last_answer_at >= STARTING_IDLE_S)
        if starting and self.boosted_until is None and self.boost_s > 0:
            self.boosted_until = now + self.boost_s
            return starting_niceness(self.base_nice)
        return self.idle(now)

    def idle(self, now: float) -> int | None:
        if self.boosted_until is not None and now >= self.boosted_until:
            self.boosted_until = None
            return serving_niceness(self.base_nice)
        return None

    def answered(self, now: float) -> None:
        self.last_answer_at = now


def apply_niceness(niceness: int | None) -> None:
    """Apply what a ServingPace call returned (None: no change)."""
    if niceness is not None:
        set_threads_niceness(niceness)


def set_threads_niceness(niceness: int) -> None:
    """Set every thread of this worker to ``niceness`` (where the OS allows it).

    Linux applies niceness per thread, and torch may have started pool threads during the
    warm-up (at the load's raised priority), so each thread of the process is set, not just the
    calling one. Raising priority again (a worker that starts to serve) needs root or
    CAP_SYS_NICE; without it the worker keeps its niceness.
    """
    for entry in os.scandir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError):
            os.setpriority(os.PRIO_PROCESS, int(entry.name), niceness)
