"""Scheduling priority for the two small processes that time failures.

The agent's heartbeat process and the controller's heartbeat monitor decide how fast a crash is
seen: a SIGKILLed server is detected when its heartbeat process has finished dying (its liveness
stream closes) and the monitor has read that close. On a loaded box both wait for a core behind
Triton, the clients and the controller's own loop, and a niceness of -10 still leaves them
queued for a time slice now and then. A real-time class (``SCHED_RR``, lowest real-time
priority) runs them as soon as they are runnable, as cluster membership daemons such as
corosync do. Both spend nearly all their time blocked in ``select``, so they take no core away
from anyone; the kernel's real-time throttling (``sched_rt_runtime_us``) bounds a runaway.

Where real-time scheduling is not permitted (no CAP_SYS_NICE, a container without it) they fall
back to a raised niceness, and to nothing where even that is refused. Standard library only:
the heartbeat process must start in milliseconds.
"""

from __future__ import annotations

import os

REALTIME_PRIORITY = 1
"""The lowest real-time priority: above every normal process, below the kernel's threads."""
REALTIME_ENV = "UNDERSTUDY_REALTIME"
"""Set to ``0`` to keep these processes in the normal scheduling class."""


def raise_priority(nice: int) -> str:
    """Make this process real-time where permitted, else ``nice``; says which it got.

    Returns ``"realtime"``, ``"nice"`` or ``"normal"``.
    """
    if os.environ.get(REALTIME_ENV, "1") != "0" and hasattr(os, "sched_setscheduler"):
        try:
            # Reset on fork: nothing these processes might start inherits the class.
            policy = os.SCHED_RR | getattr(os, "SCHED_RESET_ON_FORK", 0)
            os.sched_setscheduler(0, policy, os.sched_param(REALTIME_PRIORITY))
            return "realtime"
        except (OSError, PermissionError):
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        return "nice"
    except OSError:
        return "normal"
