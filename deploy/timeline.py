"""Where one client's outage went: a failure's timeline, from the records of a run.

For one failure, app and client (a :class:`deploy.outage.ClientOutage`), in milliseconds from
the failure: the controller's detection and notification (its events), the gateway's route
change (its log), the client's requests from the last one sent before the failure to its first
success (sent, answered, outcome, attempts, which server answered), and the replica loads that
finished on the app's new server around then (a load on the same Triton competes with the
app's first requests there). Pure functions of the records, as ``deploy.outage``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deploy.outage import ClientOutage, client_key

LOAD_KINDS = ("backup_loaded", "backup_ready", "instance_ready", "parity_ready", "upgraded",
              "interim_serving", "serving")
"""Events that name a replica loaded for them (with its ``load_s``)."""
HORIZON_S = 2.0
"""Events and loads this long after the failure are shown."""


def _ms(value: float | None, origin: float) -> float | None:
    return None if value is None else round((value - origin) * 1000.0, 1)


def timeline(outage: ClientOutage, failure: Mapping[str, Any],
             events: Sequence[Mapping[str, Any]], requests: Iterable[Mapping[str, Any]],
             moves: Sequence[tuple[float, str, str]] = ()) -> dict[str, Any]:
    """The timeline of one client's outage (see the module doc)."""
    at = float(failure["at"])
    failed = set(failure["servers"])
    app_id = outage.app_id
    mine = [e for e in events if e.get("app_id") == app_id and at <= e["time"] <= at + HORIZON_S]
    caused = [e for e in mine if e.get("failed_server") in failed]
    detected = min((e["failure_at"] for e in caused if e.get("failure_at")), default=None)
    first = next((e for e in caused if e["kind"] in ("warm_switch", "interim_serving")), None)
    moved = min((when for when, app, left in moves
                 if app == app_id and left in failed and when >= at - 0.001), default=None)
    key = (app_id, outage.via, outage.rate)
    records = sorted((r for r in requests if client_key(r) == key), key=lambda r: r["sent_at"])
    before = [r for r in records if r["sent_at"] <= at]
    end = at + (outage.outage_ms or 0.0) / 1000.0
    shown = before[-1:] + [r for r in records if at < r["sent_at"] <= end + 1e-6]
    new_server = first.get("server_id") if first is not None else None
    loads = [{"app_id": e["app_id"], "kind": e["kind"], "server_id": e.get("server_id"),
              "started_ms": _ms(e["time"] - float(e["load_s"]), at),
              "done_ms": _ms(e["time"], at)}
             for e in events
             if new_server is not None and e.get("server_id") == new_server
             and e["kind"] in LOAD_KINDS and e.get("load_s")
             and at - 1.0 <= e["time"] <= at + HORIZON_S and e is not first]
    return {
        "failure": outage.failure, "app_id": app_id, "client": outage.client,
        "outage_ms": outage.outage_ms, "servers": sorted(failed),
        "detected_ms": _ms(detected, at),
        "notified_ms": _ms(first["time"], at) if first is not None else None,
        "how": first["kind"] if first is not None else None, "to_server": new_server,
        "gateway_moved_ms": _ms(moved, at),
        "requests": [{"sent_ms": _ms(r["sent_at"], at), "done_ms": _ms(r["done_at"], at),
                      "outcome": r.get("outcome", "ok" if r.get("ok") else "error"),
                      "attempts": r.get("attempts", 1), "server_id": r.get("server_id"),
                      "error": str(r.get("error") or "")[:120]} for r in shown],
        "loads_on_new_server": loads}


def format_timeline(line: Mapping[str, Any]) -> str:
    """A person-readable rendering of :func:`timeline`'s result."""
    parts = [f"failure {line['failure']} ({','.join(line['servers'])}) {line['app_id']} "
             f"{line['client']}: outage {line['outage_ms']} ms; detected "
             f"{line['detected_ms']}, {line['how']} to {line['to_server']} notified "
             f"{line['notified_ms']}, gateway moved {line['gateway_moved_ms']}"]
    for r in line["requests"]:
        parts.append(f"  request sent {r['sent_ms']} answered {r['done_ms']} {r['outcome']} "
                     f"attempts {r['attempts']} by {r['server_id']} {r['error']}".rstrip())
    for load in line["loads_on_new_server"]:
        parts.append(f"  load on {load['server_id']}: {load['app_id']} ({load['kind']}) "
                     f"{load['started_ms']} -> {load['done_ms']}")
    return "\n".join(parts)
