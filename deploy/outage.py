"""Client-observed outage: what a failure cost the clients, from their own request stamps.

Every load-generating client stamps each request it sends (``deploy.loadgen``,
``deploy.gateway_load``): when it was sent and answered, its outcome (``ok``; ``error``, an
answer that says why it failed; ``lost``, neither an answer nor an error: a timeout, a reset,
a refused connection), which server and variant answered, and which client sent it (``via``:
``gateway`` or ``sdk``, at ``rate`` requests/s). From those stamps alone, per failure, affected
app and client present at the failure:

- **outage**: from the failure instant to that client's first successful response from a
  server that did not fail (an answer the dying server wrote just before the kill is not a
  recovery); None when none came before the failure's window ended;
- **longest gap**: the longest time between two successive successful responses, from the
  client's last success before the failure to the end of the window (a failover that answers
  once and then stalls again shows here, not in the outage);
- the requests the client sent in the window, and how many of them were errors or lost.

A client is present at a failure when it sent a request in the ``lookback_s`` before it. A
failure's window ends ``window_s`` after it, at the next failure, or at the end its caller gives
(a bench ends it where it starts reviving the server, so that the fail-back is not counted).

Pure functions of the records: the testbed report, the bench and the unit tests share them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

OK, ERROR, LOST = "ok", "error", "lost"
LOOKBACK_S = 2.0
WINDOW_S = 10.0


@dataclass(frozen=True)
class ClientOutage:
    """What one client of one affected app saw of one failure."""

    failure: int
    app_id: str
    via: str
    """``gateway`` or ``sdk`` (``unknown`` for records that do not say)."""
    rate: float
    """Requests/s the client sends."""
    outage_ms: float | None
    """Failure -> first successful response from a server that did not fail."""
    longest_gap_ms: float
    """Longest time between successive successes around the failure (a lower bound while the
    client had none after it)."""
    requests: int
    errors: int
    lost: int
    answered_by: str | None = None
    """``server/variant`` of the first successful response after the failure."""

    @property
    def client(self) -> str:
        """``via@rate``, e.g. ``gateway@50``."""
        return client_name(self.via, self.rate)

    @property
    def recovered(self) -> bool:
        """Whether the client was served again within the window."""
        return self.outage_ms is not None


def client_name(via: str, rate: float) -> str:
    """``via@rate``: ``gateway@5``, ``sdk@50``."""
    return f"{via}@{rate:g}"


def outcome_of(record: Mapping[str, Any]) -> str:
    """``ok``, ``error`` or ``lost``; records that predate the outcome field count as errors."""
    outcome = record.get("outcome")
    if outcome in (OK, ERROR, LOST):
        return str(outcome)
    return OK if record.get("ok") else ERROR


def client_key(record: Mapping[str, Any]) -> tuple[str, str, float]:
    """(app, via, rate) of the client that sent ``record``."""
    return (str(record["app_id"]), str(record.get("via") or "unknown"),
            float(record.get("rate") or 0.0))


def affected_apps(failure: Mapping[str, Any], requests: Iterable[Mapping[str, Any]],
                  lookback_s: float = LOOKBACK_S) -> list[str]:
    """The apps a failure hit: recorded (``serving_before``), else answered by its servers.

    Without the record, an app counts when a client of it was answered by a failed server in
    the ``lookback_s`` before the failure.
    """
    if "serving_before" in failure:
        return sorted(failure["serving_before"])
    at, servers = failure["at"], set(failure["servers"])
    return sorted({r["app_id"] for r in requests if outcome_of(r) == OK
                   and r.get("server_id") in servers and at - lookback_s <= r["done_at"] <= at})


def client_outages(failures: Sequence[Mapping[str, Any]],
                   requests: Iterable[Mapping[str, Any]], *,
                   ends: Sequence[float | None] | None = None, lookback_s: float = LOOKBACK_S,
                   window_s: float = WINDOW_S) -> list[ClientOutage]:
    """Per failure, affected app and client present at it: see the module doc."""
    by_client: dict[tuple[str, str, float], list[Mapping[str, Any]]] = defaultdict(list)
    every = list(requests)
    for record in every:
        by_client[client_key(record)].append(record)
    for records in by_client.values():
        records.sort(key=lambda r: r["sent_at"])
    found = []
    for index, failure in enumerate(failures):
        at = float(failure["at"])
        end = at + window_s
        if index + 1 < len(failures):
            end = min(end, float(failures[index + 1]["at"]))
        if ends is not None and index < len(ends) and ends[index] is not None:
            end = min(end, float(ends[index]))  # type: ignore[arg-type]
        failed = set(failure["servers"])
        apps = set(affected_apps(failure, every, lookback_s))
        for key in sorted(k for k in by_client if k[0] in apps):
            outage = _client_outage(index, key, by_client[key], at, end, failed, lookback_s)
            if outage is not None:
                found.append(outage)
    return found


def _client_outage(index: int, key: tuple[str, str, float],
                   records: Sequence[Mapping[str, Any]], at: float, end: float,
                   failed: Collection[str], lookback_s: float) -> ClientOutage | None:
    if not any(at - lookback_s <= r["sent_at"] <= at for r in records):
        return None  # not running at the failure
    successes = sorted(r["done_at"] for r in records if outcome_of(r) == OK
                       and at - lookback_s <= r["done_at"] <= end)
    before = [t for t in successes if t <= at]
    after = [t for t in successes if t > at]
    first = next((r for r in sorted(records, key=lambda r: r["done_at"])
                  if outcome_of(r) == OK and at < r["done_at"] <= end
                  and r.get("server_id") not in failed), None)
    marks = [before[-1] if before else at, *after]
    gaps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    waiting = any(marks[-1] < r["sent_at"] < end and (outcome_of(r) != OK or r["done_at"] > end)
                  for r in records)
    if first is None or waiting:
        gaps.append(end - marks[-1])  # still waiting for an answer when the window closed
    window = [r for r in records if at <= r["sent_at"] < end
              or (r["sent_at"] < at < r["done_at"])]
    outcomes = [outcome_of(r) for r in window]
    return ClientOutage(
        failure=index, app_id=key[0], via=key[1], rate=key[2],
        outage_ms=_ms(first["done_at"] - at) if first is not None else None,
        longest_gap_ms=_ms(max(gaps, default=0.0)),
        requests=len(window), errors=outcomes.count(ERROR), lost=outcomes.count(LOST),
        answered_by=(f"{first.get('server_id')}/{first.get('variant')}"
                     if first is not None else None))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def request_counts(requests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Every request a client sent: how many, answered, errors returned, lost; per client kind."""
    totals = {"requests": 0, "ok": 0, "errors_returned": 0, "lost_requests": 0}
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "errors": 0,
                                                          "lost": 0})
    fields = {OK: "ok", ERROR: "errors_returned", LOST: "lost_requests"}
    for record in requests:
        outcome = outcome_of(record)
        totals["requests"] += 1
        totals[fields[outcome]] += 1
        mine = per[client_name(*client_key(record)[1:])]
        mine["requests"] += 1
        mine["errors"] += outcome == ERROR
        mine["lost"] += outcome == LOST
    return {**totals, "by_client": dict(sorted(per.items()))}


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank percentile ``q`` (0-100) of ``values``; None when empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def outage_figures(outages: Iterable[ClientOutage], how: Mapping[tuple[int, str], str],
                   ) -> dict[str, dict[str, Any]]:
    """Percentiles of outage and longest gap per ``how/client``, e.g. ``warm/gateway@50``.

    ``how`` maps (failure, app) to warm, progressive or unrecoverable (``unknown`` if absent).
    """
    groups: dict[str, list[ClientOutage]] = defaultdict(list)
    for outage in outages:
        kind = how.get((outage.failure, outage.app_id), "unknown")
        groups[f"{kind}/{outage.client}"].append(outage)
    figures = {}
    for name, members in sorted(groups.items()):
        served = [o.outage_ms for o in members if o.outage_ms is not None]
        gaps = [o.longest_gap_ms for o in members]
        figures[name] = {
            "samples": len(members), "not_recovered": len(members) - len(served),
            "outage_p50_ms": percentile(served, 50), "outage_p99_ms": percentile(served, 99),
            "outage_max_ms": max(served, default=None),
            "longest_gap_p50_ms": percentile(gaps, 50),
            "longest_gap_max_ms": max(gaps, default=None)}
    return figures


def outages_json(outages: Iterable[ClientOutage]) -> list[dict[str, Any]]:
    """Outages as plain dicts, with the client's name."""
    return [{**asdict(o), "client": o.client, "recovered": o.recovered} for o in outages]


def print_outages(outages: Sequence[ClientOutage], how: Mapping[tuple[int, str], str],
                  write: Any) -> None:
    """A person-readable table, one row per failure, affected app and client."""
    header = (f"{'#':>2} {'app':10} {'how':13} {'client':12} {'outage':>8} {'gap':>8} "
              f"{'sent':>5} {'err':>4} {'lost':>4}  first answer from")
    write(header + "\n" + "-" * len(header) + "\n")
    for o in outages:
        outage = f"{o.outage_ms:.0f}" if o.outage_ms is not None else "none"
        write(f"{o.failure:>2} {o.app_id:10} {how.get((o.failure, o.app_id), '-'):13} "
              f"{o.client:12} {outage:>8} {o.longest_gap_ms:>8.0f} {o.requests:>5} "
              f"{o.errors:>4} {o.lost:>4}  {o.answered_by or '-'}\n")
    write("(client-observed, ms: outage = failure -> the client's first successful response "
          "from a surviving server; gap = longest time between two successes around the "
          "failure; sent/err/lost = requests the client sent in the failure's window, errors "
          "returned, and lost: no answer and no error)\n")
