"""Every failure declaration of a run, matched against the failures the run injected.

A report that counts only the failures it injected hides the controller's false alarms: a
healthy server declared failed costs its apps' clients an outage and some accuracy for nothing.
Here each declaration (``GET /v1/declarations``) is judged against the run's injections:

* it is **true** when its server was failed by an injection (killed, stopped, in a failed
  site, or its agent or its Triton killed) at or before the declaration and not yet revived
  at the declaration time (the revival of a server is complete when the controller sees it up
  and connected again; until then a late declaration still belongs to the failure);
* it is **false** otherwise: a server the run never touched, or one declared again after its
  revival completed.

An injected server with no true declaration is a **missed detection**. Pure functions of the
records: no clock, no HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.declarations import Declaration

KILL = "kill"
"""SIGKILL of one server's process group (agent, Triton, runtime)."""
STOP = "stop"
"""SIGSTOP of one server's process group, SIGCONT a few seconds later: silent, not dead."""
SITE = "site"
"""SIGKILL of every server of a site at one instant."""
AGENT = "agent"
"""SIGKILL of one server's agent process alone; what it started dies with it or is left over."""
TRITON = "triton"
"""SIGKILL of one server's Triton process alone; its agent restarts it."""
KINDS = (KILL, STOP, SITE)
"""The kinds ``bench/false_alarms.py`` injects, in its rounds."""
ALL_KINDS = (KILL, TRITON, AGENT, STOP, SITE)
"""Every kind ``deploy.inject`` can inject (``bench/convergence.py`` takes them all)."""
CRASHES = (KILL, SITE, AGENT, TRITON)
"""Injections whose detection is a crash's (a closed connection, Triton's reported death), not
a silence's."""


@dataclass(frozen=True)
class Injection:
    """One injected failure: which servers, how, when, and when each was back."""

    kind: str
    servers: tuple[str, ...]
    at: float
    """Wall time of the signal (recorded just before it is sent)."""
    revived: Mapping[str, float] = field(default_factory=dict)
    """Server -> wall time its revival completed; a server absent here was not revived."""
    site: str = ""
    signalled: Mapping[str, float] = field(default_factory=dict)
    """Server -> wall time its own signal was sent, where recorded (a site's servers are
    signalled one after the other, microseconds apart unless the injector was preempted)."""

    def signalled_at(self, server_id: str) -> float:
        """When ``server_id`` was signalled (the injection's instant where not recorded)."""
        return self.signalled.get(server_id, self.at)

    def failed(self, server_id: str, at: float) -> bool:
        """Whether this injection had ``server_id`` failed at wall time ``at``."""
        return (server_id in self.servers and self.at <= at
                and at < self.revived.get(server_id, math.inf))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Injection:
        """From a testbed's recorded failure (``testbed.json``); old records were kills."""
        return cls(kind=record.get("kind", KILL), servers=tuple(record["servers"]),
                   at=float(record["at"]), revived=dict(record.get("revived", {})),
                   site=record.get("site", ""),
                   signalled={k: float(v) for k, v in record.get("signalled", {}).items()})


@dataclass(frozen=True)
class Verdict:
    """One declaration and the injection it belongs to (None: a false declaration)."""

    declaration: Declaration
    injection: int | None
    """Index of the matched injection in the list given to :func:`classify`."""

    @property
    def false(self) -> bool:
        """The server was not failed by the run at the declaration time."""
        return self.injection is None


def parse(raw: Iterable[Mapping[str, Any]]) -> list[Declaration]:
    """Declarations from ``GET /v1/declarations`` JSON, oldest first."""
    return sorted((Declaration.model_validate(item) for item in raw), key=lambda d: d.seq)


def classify(declarations: Sequence[Declaration], injections: Sequence[Injection]
             ) -> list[Verdict]:
    """Judge each declaration: matched to the latest injection that had its server failed."""
    verdicts = []
    for declaration in declarations:
        matching = [index for index, injection in enumerate(injections)
                    if injection.failed(declaration.server_id, declaration.detected_at)]
        chosen = max(matching, key=lambda i: injections[i].at) if matching else None
        verdicts.append(Verdict(declaration, chosen))
    return verdicts


def missed(injections: Sequence[Injection], verdicts: Sequence[Verdict]
           ) -> list[tuple[int, str]]:
    """(injection index, server) of every injected server no declaration matched."""
    declared = {(v.injection, v.declaration.server_id) for v in verdicts if not v.false}
    return [(index, server) for index, injection in enumerate(injections)
            for server in injection.servers if (index, server) not in declared]


def detection_ms(verdict: Verdict, injections: Sequence[Injection]) -> float | None:
    """Declaration time minus the instant its server was signalled (None for a false one)."""
    if verdict.injection is None:
        return None
    injection = injections[verdict.injection]
    return (verdict.declaration.detected_at
            - injection.signalled_at(verdict.declaration.server_id)) * 1000.0


def silence_ms(declaration: Declaration) -> float:
    """How long the controller had not heard from the server when it declared it."""
    return (declaration.detected_at - declaration.last_seen) * 1000.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (the benches' definition), rounded to 0.1; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)


def _detections(verdicts: Sequence[Verdict], injections: Sequence[Injection],
                kinds: tuple[str, ...]) -> list[float]:
    """Detection times (ms) of the true declarations of injections of these kinds."""
    return [ms for v in verdicts if v.injection is not None
            and injections[v.injection].kind in kinds
            and (ms := detection_ms(v, injections)) is not None]


def tally(verdicts: Sequence[Verdict], injections: Sequence[Injection]) -> dict[str, Any]:
    """Counts of true and false declarations, the apps the false ones moved, detection times."""
    false = [v for v in verdicts if v.false]
    crash = _detections(verdicts, injections, CRASHES)
    silent = _detections(verdicts, injections, (STOP,))
    return {
        "injections": {kind: sum(i.kind == kind for i in injections)
                       for kind in (*KINDS, *sorted({i.kind for i in injections} - set(KINDS)))},
        "declarations": len(verdicts),
        "declarations_true": len(verdicts) - len(false),
        "false_declarations": len(false),
        "apps_moved_by_false_declarations": sum(len(v.declaration.apps_moved) for v in false),
        "missed_detections": len(missed(injections, verdicts)),
        "crash_detection_p50_ms": percentile(crash, 50),
        "crash_detection_p99_ms": percentile(crash, 99),
        "silent_detection_p50_ms": percentile(silent, 50),
        "silent_detection_p99_ms": percentile(silent, 99),
    }


def describe(verdict: Verdict, injections: Sequence[Injection], origin: float) -> str:
    """One line for a person: the declaration in full, its verdict, the apps it moved."""
    d = verdict.declaration
    if verdict.injection is None:
        judged = "FALSE (not failed by the run)"
    else:
        injection = injections[verdict.injection]
        judged = (f"true: {injection.kind} #{verdict.injection} at {injection.at - origin:+.3f} s, "
                  f"declared {detection_ms(verdict, injections):.0f} ms after")
    moved = ", ".join(d.apps_moved) or "none"
    extra = [text for flag, text in (
        (d.cancelled, "cancelled before the failover"),
        (d.alive_again is not None,
         f"alive again at {(d.alive_again or 0.0) - origin:+.3f} s"),
        (d.same_boot is True, "returned with the same agent boot"),
        (d.same_boot is False, "returned restarted")) if flag]
    return (f"#{d.seq} {d.server_id} ({d.site_id or '?'}) '{d.reason}' at "
            f"{d.detected_at - origin:+.3f} s, silent {silence_ms(d):.0f} ms, {judged}; "
            f"apps moved: {moved}" + (f"; {'; '.join(extra)}" if extra else ""))
