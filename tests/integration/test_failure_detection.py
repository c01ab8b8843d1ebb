"""The detector with its real monitor process and real heartbeating processes over UDP.

Each "server" here is a small process driving the agent's own heartbeat child process (which
beats and answers probes), in a process group of its own: SIGSTOP of the group freezes both like
a stopped box, SIGKILL kills both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from controller.detector import FailureDetector
from controller.suspicion import MAX_SUSPECT_T

T = 0.02
BOUND_S = MAX_SUSPECT_T * T + 2 * T + 0.02
"""Suspicion cap + confirmation (2 T) + sweeps: the longest silence before a declaration."""
SLACK_S = 0.1
"""A loaded 2-core CI machine may run the monitor late by this much."""

_SENDER = f"""
import sys, time
from understudy.wire.heartbeat_process import HeartbeatProcess, TICK_S
port, slot, nonce, tcp = (int(a) for a in sys.argv[1:5])
beats = HeartbeatProcess().start()
beats.triton(True)
beats.channel("127.0.0.1", port, slot, nonce, {T}, tcp)
print("ready", beats.process.pid, flush=True)
while True:
    beats.tick()
    time.sleep(TICK_S)
"""


class Declared:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, float, float]] = []
        self.alive: list[str] = []

    def __call__(self, server: str, reason: str, at: float, last_seen: float) -> None:
        self.items.append((server, reason, at, last_seen))


@asynccontextmanager
async def _detector() -> AsyncIterator[tuple[FailureDetector, Declared]]:
    declared = Declared()
    detector = FailureDetector(T, 2, declared)
    detector.alive_listeners.append(declared.alive.append)
    await detector.start()
    try:
        yield detector, declared
    finally:
        await detector.stop()


@contextmanager
def _sender(detector: FailureDetector, server: str) -> Iterator[subprocess.Popen[str]]:
    channel = detector.admit(server, None)
    process = subprocess.Popen(
        [sys.executable, "-c", _SENDER, str(channel.port), str(channel.slot),
         str(channel.nonce), str(channel.tcp_port)], stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert process.stdout is not None
        word, child = process.stdout.readline().split()
        assert word == "ready"
        process.heartbeat_pid = int(child)  # type: ignore[attr-defined]
        yield process
    finally:
        _signal(process, signal.SIGCONT)
        _signal(process, signal.SIGKILL)
        process.wait()


def _signal(process: subprocess.Popen[str], sig: int) -> None:
    """Signal the server's whole process group (the driver and its heartbeat child)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


async def _stop_for(process: subprocess.Popen[str], seconds: float) -> float:
    stopped = time.time()
    _signal(process, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        _signal(process, signal.SIGCONT)
    return stopped


@pytest.mark.timeout(60)
def test_a_short_stall_is_not_declared_and_a_long_one_is_within_the_bound() -> None:
    async def scenario() -> None:
        async with _detector() as (detector, declared):
            with _sender(detector, "s1") as s1, _sender(detector, "s2"):
                detector.watch("s1", grace_s=1.0)
                detector.watch("s2", grace_s=1.0)
                await asyncio.sleep(3.0)  # the monitor learns each server's gaps
                assert declared.items == []
                for _ in range(5):  # stalls shorter than suspicion + confirmation
                    await _stop_for(s1, 0.05)
                    await asyncio.sleep(0.5)
                assert declared.items == [], declared.items
                assert detector.stats.suspicions >= 0  # counted, whether or not suspected
                stopped = await _stop_for(s1, 1.0)  # a stopped box: silent, probes unanswered
                assert [d[:2] for d in declared.items] == [
                    ("s1", "missed heartbeats, probes unanswered")]
                _, _, at, last_seen = declared.items[0]
                print(f"declared {1000 * (at - stopped):.0f} ms after SIGSTOP, "
                      f"{1000 * (at - last_seen):.0f} ms after the last heartbeat")
                assert stopped - 2 * T <= last_seen <= stopped + 0.01
                assert at - stopped <= BOUND_S + SLACK_S
                await asyncio.sleep(0.5)  # resumed: its heartbeats say it is alive
                assert declared.alive == ["s1"]
                assert not detector.watching("s1") and detector.watching("s2")
                assert [d[0] for d in declared.items] == ["s1"]  # s2 never declared

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_killed_monitor_is_restarted_and_keeps_watching() -> None:
    async def scenario() -> None:
        async with _detector() as (detector, declared):
            with _sender(detector, "s1") as s1:
                detector.watch("s1", grace_s=1.0)
                await asyncio.sleep(1.0)
                process = detector._process
                assert process is not None
                process.kill()
                await asyncio.sleep(2.0)
                assert detector._process is not None and detector._process is not process
                assert detector.stats.restarts == 1
                assert declared.items == []  # beats reach the new monitor on the same port
                killed = time.time()
                _signal(s1, signal.SIGKILL)
                await asyncio.sleep(0.6)
                # The heartbeat process connected its liveness stream to the new monitor.
                assert [d[:2] for d in declared.items] == [("s1", "agent processes died")]
                print(f"kill declared in {1000 * (declared.items[0][2] - killed):.1f} ms")

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_forged_datagrams_do_not_keep_a_silent_server_alive() -> None:
    import socket

    from understudy.wire.heartbeat import Kind, encode

    async def scenario() -> None:
        async with _detector() as (detector, declared):
            channel = detector.admit("s1", None)
            detector.watch("s1", grace_s=0.2)
            forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                for seq in range(40):  # right slot, wrong nonce; then garbage
                    forger.sendto(encode(Kind.BEAT, channel.slot, channel.nonce ^ 1, seq,
                                         time.time(), 1), ("127.0.0.1", channel.port))
                    forger.sendto(b"x" * 7, ("127.0.0.1", channel.port))
                    await asyncio.sleep(T)
            finally:
                forger.close()
            assert [d[0] for d in declared.items] == ["s1"]
            await asyncio.sleep(1.1)  # the monitor reports its counters once a second
            assert detector.stats.rejected >= 40 and detector.stats.heartbeats >= 40

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_the_heartbeat_process_dies_with_its_agent() -> None:
    async def scenario() -> None:
        async with _detector() as (detector, declared):
            with _sender(detector, "s1") as s1:
                detector.watch("s1", grace_s=1.0)
                await asyncio.sleep(0.5)
                child = s1.heartbeat_pid  # type: ignore[attr-defined]
                os.kill(s1.pid, signal.SIGKILL)  # the agent only, not its group
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    try:
                        os.kill(child, 0)
                    except ProcessLookupError:
                        break
                    await asyncio.sleep(0.05)
                else:
                    pytest.fail("the heartbeat process outlived its agent")
                await asyncio.sleep(0.5)
                assert [d[:2] for d in declared.items] == [("s1", "agent processes died")]

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_beats_read_after_a_dead_agents_stream_closed_revive_nothing() -> None:
    """A killed agent's last heartbeats can reach the monitor after its stream's close (delayed
    on a network, or read late from the socket): they are beats from before the death, not a
    server alive again (which would cancel its failover as a false alarm while it stays dead)."""
    import socket

    from understudy.wire.heartbeat import FLAG_TRITON_ALIVE, Kind, encode

    servers = [f"s{i}" for i in range(8)]

    async def scenario() -> None:
        async with _detector() as (detector, declared):
            channels = {s: detector.admit(s, None) for s in servers}
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            streams = {}
            try:
                for server, channel in channels.items():
                    detector.watch(server, grace_s=1.0)
                    stream = socket.create_connection(("127.0.0.1", channel.tcp_port))
                    stream.sendall(f"hello {channel.slot} {channel.nonce}\n".encode())
                    streams[server] = stream

                def beat(server: str, seq: int) -> None:
                    channel = channels[server]
                    sender.sendto(encode(Kind.BEAT, channel.slot, channel.nonce, seq,
                                         time.time(), FLAG_TRITON_ALIVE),
                                  ("127.0.0.1", channel.port))

                for seq in range(50):
                    for server in servers:
                        beat(server, seq)
                    await asyncio.sleep(T)
                assert declared.items == []
                for server in servers:  # the processes die...
                    streams.pop(server).close()
                await asyncio.sleep(0.2)
                for server in servers:  # ...and their last beats arrive late (a network's delay)
                    for seq in range(50, 60):
                        beat(server, seq)
                await asyncio.sleep(1.5)
            finally:
                sender.close()
                for stream in streams.values():
                    stream.close()
            assert sorted(d[:2] for d in declared.items) == [
                (s, "agent processes died") for s in servers]
            assert declared.alive == []

    asyncio.run(scenario())
