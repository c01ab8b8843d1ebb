"""Set-up run in the agent's child processes (Triton, the torch runtime, replicas) before exec."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL the calling process when the thread that forked it dies."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_setup(nice: int) -> Callable[[], None]:
    """A ``preexec_fn``: die with the agent, and run at niceness ``nice`` (0: inherit)."""
    def setup() -> None:
        die_with_parent()
        if nice:
            # Absolute, not relative: an agent running at a raised priority must not lift its
            # children with it.
            os.setpriority(os.PRIO_PROCESS, 0, nice)

    return setup
