"""Testbed report: per injected failure and affected app, what clients and the controller saw.

Definitions (FailLite §5.1 and DESIGN.md): detection = failure declared - failure injected;
notification = first placement event with a serving location - failure injected; MTTR =
notification - detection (from detection to the client being told where to go, the paper's
definition); first response = first successful client response from the new location -
failure injected (end to end); accuracy reduction = 1 - accuracy(final variant) /
accuracy(variant before the failure). Recovery rate = affected apps that got a serving
location / affected apps, the affected apps counted from the records: every app served from a
failed server just before the failure (the injection records them: ``serving_before``, from
``GET /v1/apps``), whether or not an event named the failed server, plus any app an event names.
An app no event named counts as recovered when an event gave it a serving location on a server
that did not fail; ``recovery_rate_from_events`` is the old figure (only the apps an event
named), printed beside it when the two differ.

What the clients saw (``deploy.outage``): per affected app and client, the client-observed
outage (failure -> the client's first successful response) and the longest gap between its
successes, from the clients' own request stamps; and every request the clients sent, answered,
failed with a reason, or lost.

Every failure declaration the controller made is listed too, true or false, with the apps it
moved (``deploy.declarations`` judges each against the recorded injections), and the plot marks
the false ones: a report that counted only the injected failures would hide its false alarms.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.declarations import Injection, Verdict, describe, tally
from deploy.outage import (
    ClientOutage,
    client_key,
    client_name,
    client_outages,
    outage_figures,
    print_outages,
    request_counts,
)

SERVING_KINDS = ("warm_switch", "interim_serving", "serving", "upgraded", "failback")


@dataclass
class AppOutcome:
    """One affected app of one failure."""

    failure: int
    app_id: str
    how: str
    """warm, progressive or unrecoverable."""
    detection_ms: float | None
    notification_ms: float | None
    mttr_ms: float | None
    first_response_ms: float | None
    upgrade_done_ms: float | None
    variant_before: str | None
    variant_after: str | None
    accuracy_before: float | None
    accuracy_after: float | None
    named: bool = True
    """Whether an event named the failed server (False: affected by the records only)."""
    interim_load_ms: float | None = None
    """How long the first replica that served again took to load (progressive: the interim)."""

    @property
    def recovered(self) -> bool:
        """Whether clients were given a serving location."""
        return self.notification_ms is not None

    @property
    def accuracy_reduction_pct(self) -> float | None:
        """Relative accuracy lost, percent."""
        if not self.accuracy_before or self.accuracy_after is None:
            return None
        return 100.0 * (1.0 - self.accuracy_after / self.accuracy_before)


def load_requests(directory: Path) -> list[dict[str, Any]]:
    """Every client request record under ``directory``."""
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def serving_on(apps: Iterable[Mapping[str, Any]], servers: Collection[str]) -> list[str]:
    """The apps (``GET /v1/apps`` bodies) served from one of ``servers``, sorted."""
    return sorted(a["app_id"] for a in apps
                  if (a.get("serving") or {}).get("server_id") in servers)


def serving_elsewhere(app_ids: Iterable[str], apps: Iterable[Mapping[str, Any]],
                      servers: Collection[str]) -> list[str]:
    """Of ``app_ids``, those serving again (``GET /v1/apps``) from a server not in ``servers``."""
    by_id = {a["app_id"]: a for a in apps}
    again = []
    for app_id in app_ids:
        app = by_id.get(app_id)
        serving = (app or {}).get("serving") or {}
        if app is not None and serving.get("server_id") not in (None, *servers) and \
                app.get("status") in ("serving", "degraded"):
            again.append(app_id)
    return sorted(again)


def recovery_from_records(failures: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(apps served from a failed server just before it failed, those serving again elsewhere).

    Summed over the failures that recorded both (``serving_before``: :func:`serving_on` before
    the injection; ``recovered``: :func:`serving_elsewhere` once the run stopped waiting).
    """
    affected = recovered = 0
    for failure in failures:
        if "serving_before" in failure and "recovered" in failure:
            before = set(failure["serving_before"])
            affected += len(before)
            recovered += len(before & set(failure["recovered"]))
    return affected, recovered


def _before(events: list[dict[str, Any]], app_id: str, at: float) -> dict[str, Any] | None:
    earlier = [e for e in events if e["app_id"] == app_id and e["time"] < at
               and e["kind"] in SERVING_KINDS]
    return earlier[-1] if earlier else None


def analyse(failures: list[dict[str, Any]], events: list[dict[str, Any]],
            requests: list[dict[str, Any]]) -> list[AppOutcome]:
    """Outcomes per failure and affected app."""
    outcomes = []
    for index, failure in enumerate(failures):
        at = failure["at"]
        until = failures[index + 1]["at"] if index + 1 < len(failures) else float("inf")
        servers = set(failure["servers"])
        window = [e for e in events if at <= e["time"] < until]
        named = {e["app_id"] for e in window if e.get("failed_server") in servers}
        affected = sorted(named | set(failure.get("serving_before", ())))
        for app_id in affected:
            mine = [e for e in window if e["app_id"] == app_id]
            caused = [e for e in mine if e.get("failed_server") in servers]
            if app_id not in named:  # no event named the failure: a place elsewhere counts
                caused = [e for e in mine if e["kind"] in SERVING_KINDS
                          and e.get("server_id") not in servers]
            detected = min((e["failure_at"] for e in caused if e.get("failure_at")), default=None)
            serving = [e for e in caused if e["kind"] in SERVING_KINDS]
            first = serving[0] if serving else None
            final = serving[-1] if serving else None
            before = _before(events, app_id, at)
            upgraded = next((e for e in serving if e["kind"] in ("upgraded", "serving")), None)
            how = "unrecoverable" if first is None else (
                "warm" if first["kind"] == "warm_switch" else "progressive")
            ok_after = [r for r in requests if r["app_id"] == app_id and r["ok"]
                        and r["done_at"] > at and r["server_id"] not in servers
                        and r["done_at"] < until]
            outcomes.append(AppOutcome(
                failure=index, app_id=app_id, how=how,
                detection_ms=_ms(detected, at),
                notification_ms=_ms(first["time"] if first else None, at),
                mttr_ms=_ms(first["time"] if first else None, detected),
                first_response_ms=_ms(min((r["done_at"] for r in ok_after), default=None), at),
                upgrade_done_ms=_ms(upgraded["time"] if upgraded else None, at),
                variant_before=before["variant"] if before else None,
                variant_after=final["variant"] if final else None,
                accuracy_before=before["accuracy"] if before else None,
                accuracy_after=final["accuracy"] if final else None,
                named=app_id in named,
                interim_load_ms=(round(first["load_s"] * 1000.0, 1)
                                 if first is not None and first.get("load_s") is not None
                                 and how == "progressive" else None)))
    return outcomes


def _ms(value: float | None, origin: float | None) -> float | None:
    if value is None or origin is None:
        return None
    return round((value - origin) * 1000.0, 2)


def summary(outcomes: list[AppOutcome]) -> dict[str, Any]:
    """Aggregate figures over all outcomes."""
    def pct(values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]

    warm = [o.notification_ms for o in outcomes if o.how == "warm" and o.notification_ms]
    interim = [o.notification_ms for o in outcomes if o.how == "progressive"
               and o.notification_ms is not None]
    upgrades = [o.upgrade_done_ms for o in outcomes if o.how == "progressive"
                and o.upgrade_done_ms is not None]
    mttr = [o.mttr_ms for o in outcomes if o.mttr_ms is not None]
    reductions = [o.accuracy_reduction_pct for o in outcomes
                  if o.accuracy_reduction_pct is not None]
    named = [o for o in outcomes if o.named]
    return {
        "failures": len({o.failure for o in outcomes}),
        "affected": len(outcomes),
        "recovery_rate": (sum(o.recovered for o in outcomes) / len(outcomes)) if outcomes
        else None,
        "affected_named_by_events": len(named),
        "recovery_rate_from_events": (sum(o.recovered for o in named) / len(named)) if named
        else None,
        "warm_notify_p50_ms": pct(warm, 50), "warm_notify_p99_ms": pct(warm, 99),
        "interim_first_serving_p50_ms": pct(interim, 50),
        "upgrade_done_p50_ms": pct(upgrades, 50),
        "mttr_mean_ms": statistics.fmean(mttr) if mttr else None,
        "accuracy_reduction_pct": statistics.fmean(reductions) if reductions else None,
    }


def print_table(outcomes: list[AppOutcome], write: Any) -> None:
    """A person-readable table."""
    header = (f"{'#':>2} {'app':10} {'how':13} {'detect':>8} {'notify':>8} {'MTTR':>8} "
              f"{'1st resp':>9} {'upgrade':>9}  {'before -> after':42} {'acc -%':>7}")
    write(header + "\n" + "-" * len(header) + "\n")
    for o in outcomes:
        def f(v: float | None) -> str:
            return f"{v:.0f}" if v is not None else "-"
        change = f"{o.variant_before or '-'} -> {o.variant_after or '-'}"
        reduction = o.accuracy_reduction_pct
        lost = f"{reduction:7.2f}" if reduction is not None else f"{'-':>7}"
        write(f"{o.failure:>2} {o.app_id:10} {o.how:13} {f(o.detection_ms):>8} "
              f"{f(o.notification_ms):>8} {f(o.mttr_ms):>8} {f(o.first_response_ms):>9} "
              f"{f(o.upgrade_done_ms):>9}  {change:42} {lost}\n")
    write("(times in ms after the injected failure; MTTR from detection to notification)\n")


def window_ends(failures: list[dict[str, Any]]) -> list[float | None]:
    """Where each failure's client window ends: when its first server was revived.

    The fail-back that follows is not the failure's outage. None while none was revived.
    """
    return [min(f["revived"].values()) if f.get("revived") else None for f in failures]


def print_clients(failures: list[dict[str, Any]], outcomes: list[AppOutcome],
                  requests: list[dict[str, Any]], write: Any
                  ) -> tuple[list[ClientOutage], dict[str, Any]]:
    """The client-observed outages and request counts, printed; returns them and figures."""
    how = {(o.failure, o.app_id): o.how for o in outcomes}
    outages = client_outages(failures, requests, ends=window_ends(failures))
    counts = request_counts(requests)
    if outages:
        print_outages(outages, how, write)
    write(f"client requests: {counts['requests']} sent, {counts['ok']} answered, "
          f"{counts['errors_returned']} errors returned, {counts['lost_requests']} lost (no "
          "answer, no error)\n")
    return outages, {"client_outage": outage_figures(outages, how), "client_requests": counts}


def origin_of(injections: list[Injection], verdicts: list[Verdict],
              requests: list[dict[str, Any]]) -> float:
    """Where shown times start: the first injected failure, else the earliest record."""
    if injections:
        return injections[0].at
    instants = [v.declaration.detected_at for v in verdicts] + [r["sent_at"] for r in requests]
    return min(instants, default=0.0)


def print_declarations(verdicts: list[Verdict], injections: list[Injection], origin: float,
                       write: Any) -> dict[str, Any]:
    """Every declaration in full, then the counts; returns them (``deploy.declarations.tally``)."""
    counts = tally(verdicts, injections)
    write(f"failure declarations: {counts['declarations']} ({counts['declarations_true']} of "
          f"servers the run failed, {counts['false_declarations']} false, moving "
          f"{counts['apps_moved_by_false_declarations']} apps for nothing; "
          f"{counts['missed_detections']} injected failures never declared)\n")
    for verdict in verdicts:
        write(f"  {'!' if verdict.false else ' '} {describe(verdict, injections, origin)}\n")
    if verdicts:
        write("(times in s relative to the first injected failure; silent: since the "
              "controller last heard from the server)\n")
    return counts


def plot(failures: list[dict[str, Any]], outcomes: list[AppOutcome],
         requests: list[dict[str, Any]], path: Path, window_s: tuple[float, float] = (-3, 12),
         verdicts: list[Verdict] | None = None,
         outages: list[ClientOutage] | None = None) -> Path | None:
    """Client response time around the last failure, one line per affected app and client (PNG).

    The legend gives each client's observed outage, and a dashed line of its colour marks its
    first successful response after the failure.

    Below it, the whole run: every request's response time, the injected failures, and every
    failure declaration, the false ones marked apart (they are drawn in the top panel too when
    they fall in its window).
    """
    verdicts = verdicts or []
    if not failures and not verdicts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, whole) = plt.subplots(2, 1, figsize=(9, 8), height_ratios=(3, 2))
    if failures:
        _plot_last_failure(ax, failures, outcomes, requests, window_s, verdicts, outages or [])
    else:
        ax.set_axis_off()
    origin = failures[0]["at"] if failures else min(
        v.declaration.detected_at for v in verdicts)
    _plot_run(whole, failures, requests, verdicts, origin)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_last_failure(ax: Any, failures: list[dict[str, Any]], outcomes: list[AppOutcome],
                       requests: list[dict[str, Any]], window_s: tuple[float, float],
                       verdicts: list[Verdict], outages: list[ClientOutage]) -> None:
    index = len(failures) - 1
    at = failures[index]["at"]
    seen = {(o.app_id, o.client): o for o in outages if o.failure == index}
    for outcome in (o for o in outcomes if o.failure == index):
        lines: dict[str, list[tuple[float, float]]] = {}
        for r in requests:
            if r["app_id"] == outcome.app_id and window_s[0] <= r["sent_at"] - at <= window_s[1]:
                lines.setdefault(client_name(*client_key(r)[1:]), []).append(
                    (r["sent_at"] - at, (r["done_at"] - r["sent_at"]) * 1000.0))
        for client, points in sorted(lines.items()):
            points.sort()
            seen_by = seen.get((outcome.app_id, client))
            observed = "" if seen_by is None else (
                f", outage {seen_by.outage_ms:.0f} ms" if seen_by.outage_ms is not None
                else ", not served again")
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                            linewidth=1,
                            label=f"{outcome.app_id} {client} ({outcome.how}{observed})")
            if seen_by is not None and seen_by.outage_ms is not None:
                ax.axvline(seen_by.outage_ms / 1000.0, color=line.get_color(), linestyle="--",
                           linewidth=0.8)
        if outcome.notification_ms is not None:
            ax.axvline(outcome.notification_ms / 1000.0, color="grey", linestyle=":",
                       linewidth=0.8)
    failed = ",".join(failures[index]["servers"])
    ax.axvline(0.0, color="red", linewidth=1.5, label=f"failure of {failed}")
    for verdict in verdicts:
        offset = verdict.declaration.detected_at - at
        if verdict.false and window_s[0] <= offset <= window_s[1]:
            ax.axvline(offset, color="darkorange", linestyle="--", linewidth=1.2,
                       label=f"FALSE declaration of {verdict.declaration.server_id}")
    ax.set_xlabel("request sent, seconds after the injected failure")
    ax.set_ylabel("response time (ms, retries included)")
    ax.set_yscale("log")
    ax.set_title("Client response time around a server failure (dotted: client notified; "
                 "dashed: the client's first answer)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def _plot_run(ax: Any, failures: list[dict[str, Any]], requests: list[dict[str, Any]],
              verdicts: list[Verdict], origin: float) -> None:
    """The whole run: requests, injections (red), true (green) and false (orange) declarations."""
    if requests:
        ax.scatter([r["sent_at"] - origin for r in requests],
                   [max(1e-1, (r["done_at"] - r["sent_at"]) * 1000.0) for r in requests],
                   s=2, color="lightgrey", label="client requests (every app)")
    for index, failure in enumerate(failures):
        ax.axvline(failure["at"] - origin, color="red", linewidth=1.2,
                   label="injected failure" if index == 0 else None)
    true = [v for v in verdicts if not v.false]
    false = [v for v in verdicts if v.false]
    ax.set_yscale("log")
    low, high = ax.get_ylim() if requests else (1.0, 1000.0)
    if true:
        ax.scatter([v.declaration.detected_at - origin for v in true], [high] * len(true),
                   marker="v", color="green", zorder=3, label=f"true declaration ({len(true)})")
    if false:
        ax.scatter([v.declaration.detected_at - origin for v in false], [high] * len(false),
                   marker="X", s=60, color="darkorange", zorder=4,
                   label=f"FALSE declaration ({len(false)})")
        for verdict in false:
            x = verdict.declaration.detected_at - origin
            ax.axvline(x, color="darkorange", linestyle="--", linewidth=0.8)
            ax.annotate(verdict.declaration.server_id, (x, high), fontsize=7,
                        color="darkorange", xytext=(2, -10), textcoords="offset points")
    ax.set_ylim(low, high * 2)
    ax.set_xlabel("seconds after the first injected failure" if failures
                  else "seconds after the first declaration")
    ax.set_ylabel("response time (ms)")
    ax.set_title(f"The whole run: {len(failures)} injected failures, {len(verdicts)} "
                 f"failure declarations, {len(false)} of them false")
    ax.legend(fontsize=7, loc="lower right")


def outcomes_json(outcomes: list[AppOutcome]) -> list[dict[str, Any]]:
    """Outcomes as plain dicts (with the derived fields)."""
    return [{**asdict(o), "recovered": o.recovered,
             "accuracy_reduction_pct": o.accuracy_reduction_pct} for o in outcomes]


def verdicts_json(verdicts: list[Verdict], injections: list[Injection]) -> list[dict[str, Any]]:
    """Each declaration with its verdict and the injection it matched."""
    return [{**v.declaration.model_dump(), "false": v.false, "injection": v.injection,
             "injection_kind": injections[v.injection].kind if v.injection is not None else None}
            for v in verdicts]
