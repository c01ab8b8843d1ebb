"""Python's cycle collector kept off the failover path.

At 10,000 apps the controller holds about a million objects that live as long as it does
(records, their parsed copies, the snapshot's shares). A full collection of the oldest
generation walks all of them, about half a second on a small machine, and it runs when
allocation peaks, which is exactly when a site fails and hundreds of switches are decided:
every event then waits for it. So the long-lived objects are frozen (``gc.freeze``: moved to
a generation the collector skips) every little while, and the collector only ever walks what
was created since. Frozen objects that become garbage are still freed by reference counting;
only cycles among them would wait, so now and then, when no failover or urgent load is under
way, everything is unfrozen and collected once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

logger = logging.getLogger(__name__)

FREEZE_EVERY_S = 30.0
"""How often what survived since the last freeze is frozen too."""

FULL_COLLECTION_EVERY_S = 600.0
"""How often, at a quiet moment, everything is unfrozen and collected once."""


async def pace_collector(quiet: asyncio.Event, freeze_every_s: float = FREEZE_EVERY_S,
                         full_every_s: float = FULL_COLLECTION_EVERY_S) -> None:
    """Freeze the long-lived objects periodically; collect everything when ``quiet`` is set."""
    gc.freeze()
    last_full = time.monotonic()
    while True:
        await asyncio.sleep(freeze_every_s)
        if time.monotonic() - last_full >= full_every_s and quiet.is_set():
            gc.unfreeze()
            started = time.perf_counter()
            found = gc.collect()
            logger.info("full garbage collection at a quiet moment: %d objects freed in "
                        "%.0f ms", found, (time.perf_counter() - started) * 1000)
            last_full = time.monotonic()
        gc.freeze()
