"""Reliable FIFO links over a lossy, reordering network (a small selective-repeat ARQ).

The protocol cores assume what TCP gives a live connection: per (source, destination) pair,
messages arrive once and in order. The simulator's network drops, delays and reorders frames, so
each simulated node sends through ``Links``: numbered frames, cumulative acks, retransmission of
everything unacknowledged every RTO, in-order delivery from a reorder buffer. Nodes never reuse
an id (a restarted replica is a new node), so there is no connection epoch to track.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int
    msg: object | None = None
    """None for a pure acknowledgement; ``seq`` is then the cumulative ack."""


@dataclass
class _Outgoing:
    next_seq: int = 1
    unacked: dict[int, Frame] = field(default_factory=dict)


@dataclass
class _Incoming:
    expected: int = 1
    buffer: dict[int, object] = field(default_factory=dict)


class Links:
    def __init__(self) -> None:
        self.outgoing: dict[str, _Outgoing] = {}
        self.incoming: dict[str, _Incoming] = {}

    def send(self, dst: str, msg: object) -> Frame:
        out = self.outgoing.setdefault(dst, _Outgoing())
        frame = Frame(out.next_seq, msg)
        out.unacked[frame.seq] = frame
        out.next_seq += 1
        return frame

    def receive(self, src: str, frame: Frame) -> tuple[list[object], Frame | None]:
        """Messages now deliverable in order, and the ack to send back (None for an ack)."""
        if frame.msg is None:
            out = self.outgoing.get(src)
            if out is not None:
                for seq in [s for s in out.unacked if s <= frame.seq]:
                    del out.unacked[seq]
            return [], None
        inc = self.incoming.setdefault(src, _Incoming())
        if frame.seq >= inc.expected:
            inc.buffer[frame.seq] = frame.msg
        delivered = []
        while inc.expected in inc.buffer:
            delivered.append(inc.buffer.pop(inc.expected))
            inc.expected += 1
        return delivered, Frame(inc.expected - 1)

    def pending(self) -> dict[str, list[Frame]]:
        """Unacknowledged frames per destination, for retransmission."""
        return {dst: [out.unacked[s] for s in sorted(out.unacked)]
                for dst, out in self.outgoing.items() if out.unacked}

    def forget(self, node: str) -> None:
        """Stop retransmitting to a node that is gone for good.

        The incoming side stays: frames the node sent before it died may still arrive, and
        they must still be delivered once and in order.
        """
        self.outgoing.pop(node, None)
