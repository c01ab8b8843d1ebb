"""Background load for ``bench/parm_tail.py``: what makes some servers slow for a while.

Two kinds, each an *episode* after an exponential gap (mean ``gap_ms``), ``episodes`` of them
running side by side, each on one of the system's servers drawn at random (instances and the
parity model alike), for a time drawn from ``burst_ms``; seeded, so both systems get the same
schedule:

- ``stall`` (the default): the server's Triton is paused (SIGSTOP) for ``pause_ms`` and let run
  (SIGCONT) for ``run_ms``, again and again until the episode ends (by default 20 and 20: the
  server at half speed, a request on it held up to 20 ms; ``run_ms`` 0, ``stall:episode``:
  paused for the whole episode, a freeze rather than a slowdown). ParM §6.1 slows the servers
  that background network shuffles run between, and only them ("we do not introduce
  computational multitenancy"); on one machine, where every server shares the same cores, a
  pause is the way to slow one server without slowing the others. It costs no CPU.
- ``inference``: other tenants' inference on the same model instances (§6.2.4): batch-8
  requests straight to the server's Triton, ``concurrency`` at once. On one machine they also
  take the CPU the other servers (the parity model among them) need, so every server slows
  down, not just the chosen one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gateway.upstream import HttpUpstream, UpstreamError

BATCH = 8
KINDS = ("stall", "inference", "none")


@dataclass(frozen=True)
class BackgroundSettings:
    kind: str = "stall"
    episodes: int = 2
    gap_ms: float = 300.0
    burst_ms: tuple[float, float] = (100.0, 400.0)
    concurrency: int = 8
    pause_ms: float = 20.0
    run_ms: float = 20.0

    @property
    def name(self) -> str:
        if self.kind != "stall":
            return self.kind
        return f"stall:{self.pause_ms:g}/{self.run_ms:g}" if self.run_ms > 0 else "stall:episode"

    def parse(self, spec: str) -> BackgroundSettings:
        """These settings with the kind ``spec`` names.

        ``stall:PAUSE/RUN`` sets the stall's timing, ``stall:episode`` pauses for whole episodes.
        """
        kind, _, timing = spec.partition(":")
        if kind not in KINDS or (timing and kind != "stall"):
            raise ValueError(f"{spec!r}: kinds among {', '.join(KINDS)}, stall:PAUSE/RUN or "
                             "stall:episode")
        if not timing:
            return replace(self, kind=kind)
        if timing == "episode":
            return replace(self, kind=kind, run_ms=0.0)
        pause, _, run = timing.partition("/")
        pause_ms, run_ms = float(pause), float(run or 0)
        if not (0 < pause_ms < 10_000 and 0 <= run_ms < 10_000):
            raise ValueError(f"{spec!r}: PAUSE in (0, 10000) ms, RUN in [0, 10000) ms")
        return replace(self, kind=kind, pause_ms=pause_ms, run_ms=run_ms)

    def describe(self) -> dict[str, object]:
        common: dict[str, object] = {"kind": self.name, "episodes": self.episodes,
                                     "gap_ms": self.gap_ms, "burst_ms": list(self.burst_ms)}
        if self.kind == "stall":
            return {**common, "pause_ms": self.pause_ms, "run_ms": self.run_ms}
        if self.kind == "inference":
            return {**common, "concurrency": self.concurrency, "batch": BATCH}
        return {"kind": self.kind}


def binary_body(images: np.ndarray) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A request in the binary tensor extension (cheap to read: the background's)."""
    header = json.dumps({"inputs": [{"name": "image", "shape": list(images.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": images.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + images.tobytes(), (("Content-Type", "application/octet-stream"),
                                       ("Inference-Header-Content-Length", str(len(header))))


def triton_pid(hostport: str) -> int:
    """The pid of the ``tritonserver`` listening for HTTP on ``hostport``'s port."""
    port = hostport.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"tritonserver") and \
                f"--http-port={port}".encode() in args:
            return int(entry.name)
    raise RuntimeError(f"no tritonserver with --http-port={port}")


async def background(targets: list[tuple[str, str]], settings: BackgroundSettings,
                     seed: int, stop: asyncio.Event) -> int:
    """Run the background until ``stop``; the episodes started.

    ``targets``: (host:port, Triton model) of every server of the system.
    """
    if settings.kind == "none" or settings.episodes <= 0 or not targets:
        await stop.wait()
        return 0
    runner = _Background(targets, settings, seed, stop)
    try:
        await asyncio.gather(*(runner.worker() for _ in range(settings.episodes)))
    finally:
        await runner.close()
    return runner.episodes


class _Background:
    def __init__(self, targets: list[tuple[str, str]], settings: BackgroundSettings, seed: int,
                 stop: asyncio.Event) -> None:
        self.targets = targets
        self.settings = settings
        self.rng = random.Random(seed)
        self.stop = stop
        self.loop = asyncio.get_running_loop()
        self.episodes = 0
        self.client = HttpUpstream(connect_timeout_s=5.0)
        self.pids = {hostport: triton_pid(hostport) for hostport, _ in targets} \
            if settings.kind == "stall" else {}
        self.paused: dict[int, int] = {}
        """pid -> episodes pausing it now (they may overlap)."""
        self.body, self.headers = binary_body(np.random.default_rng(seed).random(
            (BATCH, 1, 8, 8), dtype=np.float32))

    async def worker(self) -> None:
        while not self.stop.is_set():
            if await _wait(self.stop, self.rng.expovariate(1000.0 / self.settings.gap_ms)):
                return
            hostport, model = self.rng.choice(self.targets)
            until = self.loop.time() + self.rng.uniform(*self.settings.burst_ms) / 1000.0
            self.episodes += 1
            if self.settings.kind == "stall":
                await self.stall(self.pids[hostport], until)
            else:
                await asyncio.gather(*(self.hammer(hostport, f"/v2/models/{model}/infer", until)
                                       for _ in range(self.settings.concurrency)))

    async def hammer(self, hostport: str, path: str, until: float) -> None:
        while self.loop.time() < until and not self.stop.is_set():
            try:
                await self.client.request(hostport, "POST", path, self.headers, self.body)
            except UpstreamError:
                await asyncio.sleep(0.01)

    async def stall(self, pid: int, until: float) -> None:
        pause_s, run_s = self.settings.pause_ms / 1000.0, self.settings.run_ms / 1000.0
        while self.loop.time() < until and not self.stop.is_set():
            self.paused[pid] = self.paused.get(pid, 0) + 1
            os.kill(pid, signal.SIGSTOP)
            try:
                left = until - self.loop.time()
                await _wait(self.stop, min(pause_s, left) if run_s > 0 else left)
            finally:
                self.paused[pid] -= 1
                if self.paused[pid] == 0:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            if run_s > 0:
                await _wait(self.stop, run_s)

    async def close(self) -> None:
        for pid in self.pids.values():  # never leave a server paused
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await self.client.close()


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; whether it was stopped."""
    try:
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    except TimeoutError:
        return False
    return True
