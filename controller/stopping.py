"""Ending background tasks at shutdown even when a library loses their cancellation.

Why: redis-py has lost a ``CancelledError`` raised during a read (the command's connection
handling catches it and carries on), and a task whose cancellation was lost runs on: the event
stream's senders did, and held a stopping controller until its graceful bound. Cancelling
again at the task's next await point ends it; a task that outlives every try is named in the
log instead of being left to run behind the shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

RECANCEL_S = 0.05
"""How often a task still running is cancelled again."""


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], timeout_s: float = 2.0,
                          recancel_s: float = RECANCEL_S) -> list[asyncio.Future[Any]]:
    """Cancel ``tasks`` and wait until they end, cancelling again every ``recancel_s``.

    Returns (and logs) those still running after ``timeout_s``. The tasks' own exceptions are
    consumed here: they are stopping, and what they were doing is over.
    """
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(recancel_s, remaining))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
    for task in pending:
        logger.warning("task %s did not end within %.1f s of its cancellation", task,
                       timeout_s)
    return sorted(pending, key=id)
