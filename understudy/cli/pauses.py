"""Short collector passes for the long-running servers (the gateway above all).

CPython's cyclic garbage collector now and then walks every container object the process
holds (a pass over its oldest generation), and the event loop waits meanwhile: every request
in flight or arriving. Many of those objects were made at start-up (modules, classes,
functions, the web framework's and the Triton client's) and live as long as the process.
:func:`freeze_start_up_heap` moves what is alive once the server is built into the permanent
generation that the collector skips (``gc.freeze``); later passes walk only what was made
since, which in a gateway with many apps is still a lot (each app's metric series, queue
and profile).

:class:`CollectorPauses` times every pass and hands each to an observer (the gateway's
``understudy_gateway_gc_pause_seconds``), so a long one is seen where it happens.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

LONG_PAUSE_S = 0.01
"""A collector pass at least this long is logged (a tight objective's worth)."""


def freeze_start_up_heap() -> int:
    """Collect once, then exempt every object alive now from later passes; how many.

    Call it once the server is built, before it listens (the collection it starts with is
    one such pass): what start-up made and did not free is what the process keeps (a cycle
    among those objects is never freed afterwards, a bounded cost paid once).
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%d start-up objects exempted from the garbage collector's passes", frozen)
    return frozen


class CollectorPauses:
    """Times each garbage-collector pass; ``observe(generation, seconds)`` gets each."""

    def __init__(self, observe: Callable[[int, float], None],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._observe = observe
        self._clock = clock
        self._started: float | None = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        seconds = self._clock() - self._started
        self._started = None
        generation = int(info.get("generation", -1))
        self._observe(generation, seconds)
        if seconds >= LONG_PAUSE_S:
            logger.warning("garbage collector pass over generation %d took %.1f ms",
                           generation, seconds * 1000)
