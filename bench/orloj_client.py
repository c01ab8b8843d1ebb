"""The client of ``bench/orloj.py``: pre-encoded requests to the gateway, Poisson arrivals.

Open loop: each request is sent at its scheduled time whatever the others are doing, with the
time left to its SLO as its timeout, and its outcome counted against the SLO from that
scheduled time (:class:`Run`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from orloj_figures import add_counts

from gateway.upstream import HttpUpstream, UpstreamError

TIMEOUT_HEADER = "understudy-timeout-ms"
MIN_TIMEOUT_MS = 0.001
"""A request sent after its deadline still goes, with this timeout (the gateway fails it)."""

Request = tuple[bytes, tuple[tuple[str, str], ...]]
"""A pre-encoded request: its body and headers."""


@dataclass
class Run:
    """One scheduler's requests at one SLO: how many were sent and finished, their outcomes."""

    sent: int = 0
    finished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, dict[str, int]] = field(default_factory=dict)
    """The outcomes per class of requests (a workload of several classes only)."""
    send_lag_s: list[float] = field(default_factory=list)
    """Per request: how late the client started sending it after its scheduled time."""

    def add(self, other: Run) -> None:
        """Count ``other``'s requests in this run too."""
        self.sent += other.sent
        self.finished += other.finished
        self.send_lag_s += other.send_lag_s
        add_counts(self.outcomes, other.outcomes)
        for label, counts in other.by_class.items():
            add_counts(self.by_class.setdefault(label, {}), counts)


class Client:
    """Requests to the gateway on keep-alive connections."""

    def __init__(self, url: str) -> None:
        self.hostport = url.removeprefix("http://")
        self.http = HttpUpstream(5.0)

    async def infer(self, app: str, body: bytes, headers: tuple[tuple[str, str], ...],
                    timeout_ms: float) -> tuple[int, str]:
        """The status, and the error's text when it is not 200."""
        status, text = await self.ask(app, (body, headers), timeout_ms)
        return status, "" if status == 200 else text[:300]

    async def ask(self, app: str, request: Request, timeout_ms: float) -> tuple[int, str]:
        """The status and the reply's text (the error when it fails on the way)."""
        body, headers = request
        try:
            reply = await self.http.request(
                self.hostport, "POST", f"/v2/models/{app}/infer",
                (*headers, (TIMEOUT_HEADER, f"{timeout_ms:.3f}")), body)
        except UpstreamError as exc:
            return 0, str(exc)
        return reply.status, reply.body.decode("utf-8", "replace")

    async def sequential(self, app: str, requests: list[Request], count: int,
                         strict: bool = True) -> list[float]:
        """One at a time; with ``strict``, a refusal is an error (not in a warm-up, where the
        scheduler that takes over may drop what its SLO rules out)."""
        latencies = []
        for i in range(count):
            body, headers = requests[i % len(requests)]
            started = time.perf_counter()
            status, error = await self.infer(app, body, headers, 5000)
            if status != 200 and strict:
                raise RuntimeError(f"{app}: {status} {error}")
            latencies.append(time.perf_counter() - started)
        return latencies


_ERRORS_SEEN: set[int] = set()


def reason_of(status: int, error: str) -> str:
    """A failed request's outcome: a scheduler's drop reason, ``deadline`` (504), or
    ``error-<status>`` (0: the client's request failed on the way), the first of each status
    logged with its text."""
    for reason in ("deadline-unreachable", "action-window-missed", "expired"):
        if f"[{reason}]" in error:
            return reason
    if status == 504:
        return "deadline"
    if status not in _ERRORS_SEEN:
        _ERRORS_SEEN.add(status)
        logging.warning("first error of status %d: %s", status, error[:200])
    return f"error-{status}"


Stream = tuple[str, list[Request]]
"""An app and the requests it sends."""


async def poisson_run(client: Client, streams: list[Stream], rate: float, seconds: float,
                      slo_s: float, seed: int, labels: list[str] | None = None,
                      propagate: bool = True) -> Run:
    """Poisson arrivals for ``seconds``, each from a stream drawn at random; each request's
    outcome against the SLO (and per stream's label, with ``labels``).

    ``propagate``: each request's timeout is the time left to its SLO when it is sent (a
    client with a deadline); otherwise 10 x the SLO (the gateway's SLO alone bounds it).
    """
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    run = Run()
    tasks = []
    loose_ms = max(1000.0, 10 * slo_s * 1000)

    async def one(due: float, app: str, body: bytes, headers: Any, label: str | None) -> None:
        lag = loop.time() - due
        run.send_lag_s.append(lag)
        timeout_ms = max(MIN_TIMEOUT_MS, (slo_s - lag) * 1000) if propagate else loose_ms
        status, error = await client.infer(app, body, headers, timeout_ms)
        latency = loop.time() - due
        if status == 200:
            kind = "finished" if latency <= slo_s else "late"
        else:
            kind = reason_of(status, error)
        run.outcomes[kind] = run.outcomes.get(kind, 0) + 1
        if label is not None:
            add_counts(run.by_class.setdefault(label, {}), {kind: 1})
        run.finished += kind == "finished"

    start = loop.time() + 0.05
    due = start
    while True:
        due += rng.expovariate(rate)
        if due - start > seconds:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pick = rng.randrange(len(streams))
        app, requests = streams[pick]
        body, headers = requests[rng.randrange(len(requests))]
        label = labels[pick] if labels is not None else None
        tasks.append(asyncio.create_task(one(due, app, body, headers, label)))
        run.sent += 1
    await asyncio.gather(*tasks)
    return run


async def warm(client: Client, streams: list[Stream], count: int) -> None:
    """``count`` requests one at a time, from the streams in turn (refusals allowed)."""
    for i in range(count):
        app, requests = streams[i % len(streams)]
        await client.infer(app, *requests[(i // len(streams)) % len(requests)], 5000)
