"""The retransmitting links the simulator puts under the cores: once, in order, per pair."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stateful.link import Frame, Links


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 40),
       drop=st.sampled_from([0.0, 0.2, 0.5]))
def test_lossy_reordering_channel_delivers_once_in_order(seed: int, count: int,
                                                          drop: float) -> None:
    rng = random.Random(seed)
    sender, receiver = Links(), Links()
    wire: list[tuple[str, Frame]] = []  # (direction, frame), shuffled on every step
    for i in range(count):
        wire.append(("ab", sender.send("b", i)))
    delivered: list[object] = []
    for _ in range(10_000):
        if not wire:
            if not sender.pending():
                break
            wire += [("ab", f) for f in sender.pending()["b"]]  # retransmission timer
        rng.shuffle(wire)
        direction, frame = wire.pop()
        if rng.random() < drop:
            continue
        if direction == "ab":
            msgs, ack = receiver.receive("a", frame)
            delivered += msgs
            if ack is not None:
                wire.append(("ba", ack))
        else:
            sender.receive("b", frame)
    assert delivered == list(range(count))
    assert not sender.pending()


def test_forget_stops_retransmission_but_keeps_dedup() -> None:
    a, b = Links(), Links()
    frame = a.send("b", "x")
    assert b.receive("a", frame)[0] == ["x"]
    b.forget("a")
    assert b.receive("a", frame)[0] == []  # a late duplicate from a dead sender
    a.forget("b")
    assert a.pending() == {}
