"""The testbed's processes by pid: who is still alive, signalling them safely, running unpreempted.

A pid is trusted only together with the time its process started (``/proc/PID/stat``), so a
pid the kernel has handed to another process since is never signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass
class ProcessInfo:
    """One testbed process."""

    name: str
    pid: int
    log: str
    args: list[str]
    started: int | None = None
    """When the process started, in clock ticks since boot (``/proc/PID/stat``); a pid whose
    process started at another time is a reused one, never signalled. None in a record from
    before this field (the pid alone is trusted)."""


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 of proc(5); fields[0] is field 3, the state
    except (IndexError, ValueError):
        return None


def reused(pid: int, started: int | None) -> bool:
    """Whether ``pid`` now names another process than the one that started at ``started``."""
    if started is None:
        return False
    now = start_ticks(pid)
    return now is not None and now != started


def alive(pid: int, started: int | None = None) -> bool:
    """Whether the process is running (not a zombie) and is the one started at ``started``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if reused(pid, started):
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.split(") ", 1)[1].startswith("Z"):
            return False
    return True


def signal_group(info: ProcessInfo, sig: int) -> bool:
    """Signal the process group ``info`` leads; False when it is gone or its pid was reused.

    A group outlives its leader while members remain, and the kernel does not hand out a pid
    that still names a group, so a leader that is gone (no ``/proc`` entry) still names our
    group: only a live process of that pid that started at another time is someone else's.
    """
    if reused(info.pid, info.started):
        logger.warning("%s: pid %d is another process now; not signalled", info.name, info.pid)
        return False
    try:
        os.killpg(info.pid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_process(pid: int, started: int | None, sig: int, what: str = "") -> bool:
    """Signal one process; False when it is gone or ``pid`` names another process now."""
    if started is not None and start_ticks(pid) != started:
        logger.warning("%s: pid %d is gone or another process now; not signalled",
                       what or "process", pid)
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def unpreempted() -> Iterator[None]:
    """Run the block in the real-time class where permitted, so that nothing preempts it.

    Killing a site's servers one after the other from a normal process on a loaded box could
    be preempted between two kills for tens of milliseconds: a site that does not fail at
    once, and a detection time that counts the injector's wait.
    """
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(2))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, *before)
