"""A request body still arriving from its client, forwarded while it arrives (cut-through).

Why: an image-sized body (hundreds of KB) takes as long to copy into Triton's socket as to read
from the client's; sending each part on as the kernel delivers it overlaps the two, where a
store-and-forward gateway adds the whole second copy to every request's latency. The gateway
still holds the whole body (the buffer is the body's final one), so a request can be resent
to another replica on a failover, and a policy that reads the tensors (parity coding, batch
scheduling) first waits for :meth:`ArrivingBody.wait`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Listener = Callable[[int, int], None]
"""Called with ``(start, end)``: bytes ``buffer[start:end]`` have just arrived."""


class BodyLostError(ConnectionError):
    """The client went away before its body was all in."""


class ArrivingBody:
    """The body's final buffer, how much of it is in, and who forwards it as it comes."""

    __slots__ = ("buffer", "received", "_listeners", "_done", "_lost")

    def __init__(self, buffer: bytearray, received: int) -> None:
        self.buffer = buffer
        self.received = received
        self._listeners: list[Listener] = []
        self._done: asyncio.Future[None] | None = None
        self._lost = False

    @property
    def complete(self) -> bool:
        """Whether every byte is in."""
        return self.received == len(self.buffer)

    def listen(self, listener: Listener) -> None:
        """Be told of every part that arrives from now on."""
        self._listeners.append(listener)

    def unlisten(self, listener: Listener) -> None:
        """Stop being told (nothing happens if it was not listening)."""
        try:
            self._listeners.remove(listener)
        except ValueError:
            pass

    def grew(self, received: int) -> None:
        """The protocol's call: the buffer now holds ``received`` bytes."""
        start, self.received = self.received, received
        for listener in tuple(self._listeners):
            listener(start, received)
        if self.complete:
            self._listeners.clear()
            if self._done is not None and not self._done.done():
                self._done.set_result(None)

    def lose(self) -> None:
        """The protocol's call when the connection closes before the body is all in."""
        if self.complete:
            return
        self._lost = True
        self._listeners.clear()
        if self._done is not None and not self._done.done():
            self._done.set_exception(BodyLostError("the client closed before its body was in"))

    async def wait(self) -> None:
        """Return once the whole body is in (BodyLostError if its client went away)."""
        if self.complete:
            return
        if self._lost:
            raise BodyLostError("the client closed before its body was in")
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._done)
