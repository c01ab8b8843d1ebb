"""Child processes that never outlive the process that started them.

Triton, the torch runtime and stateful replicas are started by an agent (or, for a local graph,
by the runtime in the caller's process). If that parent is SIGKILLed, nothing else would stop
them: they would hold ports, memory and files of a run that is over.
"""

from __future__ import annotations

import contextlib
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL the calling process when the thread that forked it dies."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def orphaned(expected_parent: int | None = None) -> bool:
    """Whether our parent is already gone (we were re-parented before ``die_with_parent``).

    Call it right after ``die_with_parent``: a parent that died before the request never
    sends the signal. Without ``expected_parent``, being adopted by init counts as orphaned.
    """
    parent = os.getppid()
    return parent != expected_parent if expected_parent is not None else parent == 1
