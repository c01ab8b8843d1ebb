"""The periodic reconciler's decisions: agents against records, and degraded apps.

Two questions, asked again and again (``controller.reconciler`` runs them):

* **Does each server hold what the records say?** :func:`find_discrepancies` compares an
  agent's inventory with the records of the apps on that server. A discrepancy is acted on
  only when it is *confirmed* (seen by two checks a few seconds apart, with nothing in flight
  for it in the executor): a load that was just committed and not yet sent, or an unload that
  is finishing, looks like a discrepancy for an instant and is none. :func:`decide_repairs`
  turns the confirmed ones, re-checked against records read again under the apps' locks, into
  one decision.
* **Is an app below the best placement it could have?** :func:`decide_upgrades`: an app
  degraded (served by a variant less accurate than its home) while its home server is down,
  nothing of it in flight, and a more accurate variant (never above the app's choice, pins
  honoured, SLO met) fits a live server's free room: that variant loads as its target. Apps
  whose home is up are brought home by fail-back (``controller.returns``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from controller.decide.decision import Decision, accuracy_of
from controller.decide.returns import better_variants, reload_of
from controller.records import AppRecord, AppStatus, Replica
from policies.actions import LoadVariant, RemoveStray, Stage, UnloadVariant
from policies.model import (
    ClusterSnapshot,
    Family,
    Role,
    Server,
    Variant,
)
from policies.resources import MEMORY_MB
from understudy.wire.protocol import InventoryItem, ModelState

_SLACK = 1e-9


class Discrepancy(StrEnum):
    """How a server's inventory and the records disagree about one model."""

    STRAY = "stray"
    """The agent holds a ready model that no record of the server accounts for."""
    MISSING = "missing"
    """The records hold a READY replica the agent does not have."""
    STALE_LOAD = "stale_load"
    """The records hold a LOADING replica that the agent is not loading and nothing sends."""
    FINISHED_UNLOAD = "finished_unload"
    """The records hold an UNLOADING replica the agent no longer has."""
    STUCK_UNLOAD = "stuck_unload"
    """The records hold an UNLOADING replica the agent still holds, and nothing unloads it."""


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """One discrepancy about one model on one server."""

    kind: Discrepancy
    server_id: str
    app_id: str
    variant: str

    def describe(self) -> str:
        """One line for the log."""
        model = f"{self.app_id}__{self.variant}"
        return {
            Discrepancy.STRAY: f"server {self.server_id} holds {model}, which no record "
                               "accounts for: unloading it",
            Discrepancy.MISSING: f"server {self.server_id} lacks {model}, recorded ready: "
                                 "loading it again",
            Discrepancy.STALE_LOAD: f"{model} on {self.server_id} is recorded loading but "
                                    "nothing loads it: sending the load again",
            Discrepancy.FINISHED_UNLOAD: f"{model} on {self.server_id} is unloaded but still "
                                         "recorded: forgetting it",
            Discrepancy.STUCK_UNLOAD: f"{model} on {self.server_id} is recorded unloading but "
                                      "still held: sending the unload again",
        }[self.kind]


def find_discrepancies(apps: Iterable[AppRecord], server_id: str,
                       inventory: Iterable[InventoryItem],
                       in_flight: Collection[tuple[str, str, str]] = ()) -> set[Finding]:
    """Every way ``inventory`` (the agent's) and the records of ``apps`` disagree on a server.

    ``in_flight``: (server, app, variant) of the executor's actions under way; nothing about
    them is a discrepancy. Models the agent is loading or unloading are in motion too.
    """
    held = {(i.app_id, i.variant): i.state for i in inventory}
    found: set[Finding] = set()
    recorded: set[tuple[str, str]] = set()
    for record in apps:
        for replica in record.replicas:
            if replica.server_id != server_id:
                continue
            key = (record.app_id, replica.variant)
            recorded.add(key)
            if (server_id, *key) in in_flight:
                continue
            state = held.get(key)
            kind = _disagreement(replica.state, state)
            if kind is not None:
                found.add(Finding(kind, server_id, *key))
    for key, state in held.items():
        if key not in recorded and state is ModelState.READY and \
                (server_id, *key) not in in_flight:
            found.add(Finding(Discrepancy.STRAY, server_id, *key))
    return found


def _disagreement(recorded: ModelState, held: ModelState | None) -> Discrepancy | None:
    if recorded is ModelState.READY and held in (None, ModelState.FAILED):
        return Discrepancy.MISSING
    if recorded is ModelState.LOADING and held in (None, ModelState.FAILED):
        return Discrepancy.STALE_LOAD
    if recorded is ModelState.UNLOADING and held in (None, ModelState.FAILED):
        return Discrepancy.FINISHED_UNLOAD
    if recorded is ModelState.UNLOADING and held is ModelState.READY:
        return Discrepancy.STUCK_UNLOAD
    return None


def decide_repairs(apps: Mapping[str, AppRecord], server_id: str,
                   confirmed: Iterable[Finding], inventory: Iterable[InventoryItem],
                   in_flight: Collection[tuple[str, str, str]] = ()
                   ) -> tuple[Decision, list[Finding]]:
    """Repair the ``confirmed`` findings that still hold for the records ``apps``.

    ``apps``: the records of the apps on the server (and of any stray's app), read under
    their locks. Each finding is checked again against them (with the same ``inventory``,
    and ``in_flight`` as it is now): a record that changed since the finding is left to the
    next check. Returns the decision
    and the findings it repairs. A missing replica that served its app is reloaded urgently
    (an outage); the serving state machine moves clients off it meanwhile only if the agent
    really lost it, which the load's result tells.
    """
    still = find_discrepancies(apps.values(), server_id, inventory, in_flight)
    changed: dict[str, AppRecord] = {}
    urgent: list[LoadVariant] = []
    routine: list[LoadVariant] = []
    unloads: list[UnloadVariant] = []
    strays: list[RemoveStray] = []
    repaired: list[Finding] = []
    for finding in sorted(set(confirmed) & still):
        record = apps.get(finding.app_id)
        replica = record.replica(server_id, finding.variant) if record is not None else None
        if finding.kind is Discrepancy.STRAY:
            strays.append(RemoveStray(server_id, finding.app_id, finding.variant))
        elif record is None or replica is None:
            continue
        elif finding.kind in (Discrepancy.MISSING, Discrepancy.STALE_LOAD):
            replica.state = ModelState.LOADING
            changed[record.app_id] = record
            load, outage = reload_of(record, replica)
            (urgent if outage else routine).append(load)
        elif finding.kind is Discrepancy.FINISHED_UNLOAD:
            record.replicas.remove(replica)
            changed[record.app_id] = record
        else:
            unloads.append(UnloadVariant(server_id, finding.app_id, finding.variant))
        repaired.append(finding)
    decision = Decision(
        apps=tuple(changed[a] for a in sorted(changed)),
        stages=(Stage("strays", tuple(strays)), Stage("unload", tuple(unloads)),
                Stage("reload-urgent", tuple(urgent), urgent=True),
                Stage("reload", tuple(routine))),
        notes=tuple(f.describe() for f in repaired))
    return decision, repaired


# --- degraded apps ---------------------------------------------------------------------------


def upgrade_candidates(apps: Iterable[AppRecord], live: Collection[str],
                       families: Mapping[str, Family]) -> list[str]:
    """Apps :func:`decide_upgrades` may improve: a cheap look that builds no snapshot.

    Degraded, home server not live, every replica READY (nothing in flight: a recovery's own
    upgrade pass may still be loading), served below the home variant.
    """
    found = []
    for record in apps:
        if record.status is not AppStatus.DEGRADED or record.home is None or \
                record.home[0] in live:
            continue
        if any(r.state is not ModelState.READY for r in record.replicas):
            continue
        serving = record.serving_replica()
        if serving is None or serving.server_id not in live:
            continue
        home_accuracy = accuracy_of(families, record.spec.family, record.home[1])
        if serving.accuracy < home_accuracy - _SLACK:
            found.append(record.app_id)
    return found


def decide_upgrades(apps: Mapping[str, AppRecord], snapshot: ClusterSnapshot,
                    families: Mapping[str, Family]) -> Decision | None:
    """Targets for degraded apps whose home is down (see :func:`upgrade_candidates`).

    For each, in id order, the most accurate variant the replica rules allow (never above
    the app's choice, pins honoured), more accurate than what serves it, no more than its
    home variant, that meets its SLO and fits a live server's free room loads there as its
    target (``UPGRADE``); ties go to the server it is served from (its clients stay), then to
    the server with the most free memory. The serving state machine switches to the target
    once loaded and retires the smaller replica. None when no app gets a target.
    """
    free = dict(snapshot.free)
    live = set(free)
    changed: list[AppRecord] = []
    loads: list[LoadVariant] = []
    notes: list[str] = []
    for app_id in upgrade_candidates((apps[a] for a in sorted(apps)), live, families):
        record = apps[app_id]
        app = snapshot.app_by_id.get(app_id)
        serving = record.serving_replica()
        if app is None or serving is None or record.home is None:
            continue
        ceiling = accuracy_of(families, record.spec.family, record.home[1]) + _SLACK
        best: tuple[tuple[float, bool, float], Server, Variant] | None = None
        for server_id in sorted(live):
            server = snapshot.server_by_id[server_id]
            for variant in better_variants(snapshot, app, record, server, free[server_id],
                                            serving.accuracy, ceiling):
                rank = (variant.accuracy, server_id == serving.server_id,
                        free[server_id].get(MEMORY_MB, 0.0))
                if best is None or rank > best[0]:
                    best = (rank, server, variant)
        if best is None:
            continue
        _, server, target = best
        free[server.server_id] = free[server.server_id] - target.demand(app.max_rate_rps)
        record.put_replica(Replica(server_id=server.server_id, variant=target.name,
                                   role=Role.UPGRADE, accuracy=target.accuracy))
        changed.append(record)
        loads.append(LoadVariant(server.server_id, app_id, target.name, Role.UPGRADE))
        notes.append(f"{app_id}: degraded on {serving.variant} on {serving.server_id}, its "
                     f"home {record.home[0]} down; loading {target.name} on "
                     f"{server.server_id}")
    if not changed:
        return None
    return Decision(apps=tuple(changed), stages=(Stage("upgrade", tuple(loads)),),
                    notes=tuple(notes))

