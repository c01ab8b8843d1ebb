"""Set-up run in the agent's child processes (Triton, the torch runtime, replicas) before exec."""

from __future__ import annotations

import os
from collections.abc import Callable

from understudy.wire.lifetime import die_with_parent


def child_setup(nice: int) -> Callable[[], None]:
    """A ``preexec_fn``: die with the agent, and run at niceness ``nice`` (0: inherit)."""
    def setup() -> None:
        die_with_parent()
        if nice:
            # Absolute, not relative: an agent running at a raised priority must not lift its
            # children with it.
            os.setpriority(os.PRIO_PROCESS, 0, nice)

    return setup
