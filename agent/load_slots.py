"""Load slots of one agent: urgent loads (the ones that end an outage) never queue behind others.

Triton loads at most ``model_load_threads`` models at once and queues the rest in arrival
order, so an interim variant sent during a failover used to wait behind warm-backup, target and
fail-back loads already in flight (7 s in the live demo). The agent therefore admits loads
itself: routine loads may use at most ``routine_slots`` of the slots (by default every slot but
one), the rest is kept for urgent loads, which also go first whenever a slot frees. The agent's
default is three load threads, two for routine loads. More threads let more of a failover's
interims load at once, which helps where loads wait on I/O, not where they are CPU-bound: on the
2-core testbed, six threads (routine still capped at two) had four interims of one failure load
together and serve 72-104 ms after their quiet load time (median, four runs) against 55 and
67 ms with three at a time and the rest queued (a run with four interims, one with five). Set
it to what a server's loads can overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class LoadSlots:
    """An admission gate for model loads with one slot reserved for urgent ones."""

    def __init__(self, slots: int, routine_slots: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if routine_slots is not None and not 1 <= routine_slots <= slots:
            raise ValueError(f"routine_slots must be in 1..{slots}, got {routine_slots}")
        self.slots = slots
        self.routine_slots = routine_slots if routine_slots is not None else max(1, slots - 1)
        self.running = 0
        self.running_routine = 0
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._routine: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> tuple[int, int]:
        """(urgent, routine) loads waiting for a slot."""
        return len(self._urgent), len(self._routine)

    @asynccontextmanager
    async def slot(self, urgent: bool) -> AsyncIterator[None]:
        """Hold a load slot for the body of the ``async with``."""
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release(urgent)

    def _can_start(self, urgent: bool) -> bool:
        if self.running >= self.slots:
            return False
        if urgent:
            return True
        return self.running_routine < self.routine_slots and not self._urgent

    async def _acquire(self, urgent: bool) -> None:
        queue = self._urgent if urgent else self._routine
        if not queue and self._can_start(urgent):
            self._take(urgent)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(urgent)  # granted just as it was cancelled: hand it on
            else:
                with contextlib.suppress(ValueError):  # _wake may have dropped it already
                    queue.remove(waiter)
            raise

    def _take(self, urgent: bool) -> None:
        self.running += 1
        if not urgent:
            self.running_routine += 1

    def _release(self, urgent: bool) -> None:
        self.running -= 1
        if not urgent:
            self.running_routine -= 1
        self._wake()

    def _wake(self) -> None:
        for urgent, queue in ((True, self._urgent), (False, self._routine)):
            while queue and self._can_start(urgent):
                waiter = queue.popleft()
                if waiter.done():
                    continue
                self._take(urgent)
                waiter.set_result(None)
