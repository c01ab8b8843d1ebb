"""A server failed: the two decisions of a failover (FailLite §3).

First :func:`decide_server_failed`: the server is marked failed and every app with a live warm
backup is switched to it (no agent command is needed: the backup is loaded), with the intent
that lets a restarted controller resume. Then :func:`decide_cold_batch` applies the policy's
``FailoverPlan`` to the records: warm backups preempted so that more apps fit, interim and
target replicas of the apps recovered progressively, the apps no server has room for, the
failed server's replicas forgotten; its stages are the plan's own (``FailoverPlan.stages``)
but the warm switches, which the first decision applied.
The executor writes and announces the first before the plan is even made, so the critical
apps' clients hear first whatever the size of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from controller.decide.apps import BESIDE_ROLES
from controller.decide.decision import Decision, Recovery, accuracy_of, event_for, status_of
from controller.records import (
    AppRecord,
    AppStatus,
    Event,
    Replica,
    ServerRecord,
    ServerState,
)
from policies.actions import FailoverPlan, WarmSwitch
from policies.model import Family, Role
from policies.replica_rules import within_choice
from understudy.wire.protocol import ModelState

FAILOVER = "failover"
"""The intent kind of a failover (resumed after a controller restart)."""


def decide_server_failed(apps: Mapping[str, AppRecord], servers: Mapping[str, ServerRecord],
                         server_id: str, reason: str, detected_at: float, connected: bool,
                         switches: tuple[WarmSwitch, ...], now: float) -> Decision:
    """Mark ``server_id`` failed and switch the apps in ``switches`` to their warm backups."""
    server = servers[server_id]
    server.state, server.failed_at, server.failure_reason = (
        ServerState.FAILED, detected_at, reason)
    server.connected = connected
    switched: list[AppRecord] = []
    events: list[Event] = []
    recoveries: dict[str, Recovery] = {}
    for switch in switches:
        record = apps[switch.app_id]
        recovery = Recovery(detected_at, server_id, notified=True)
        event = _switch_to_backup(record, switch, recovery, servers, now)
        if event is None:
            continue
        recoveries[record.app_id] = recovery
        events.append(event)
        switched.append(record)
    return Decision(apps=tuple(switched), servers=(server,), events=tuple(events),
                    intent={"kind": FAILOVER, "server_id": server_id, "reason": reason},
                    recoveries=recoveries,
                    notes=(f"failover of {server_id}: {len(switched)} warm switches",))


def _switch_to_backup(record: AppRecord, switch: WarmSwitch, recovery: Recovery,
                      servers: Mapping[str, ServerRecord], now: float) -> Event | None:
    """Promote the app's warm backup named by ``switch``; its event (None: no such backup)."""
    replica = record.replica(switch.server_id, switch.variant)
    if replica is None:
        return None
    replica.role = Role.PRIMARY
    record.serving = replica.key
    record.status = (AppStatus.SERVING if record.home and replica.variant == record.home[1]
                     else AppStatus.DEGRADED)
    return event_for(record, "warm_switch", replica, f"server {recovery.failed_server} failed",
                     servers, recovery, now)


def decide_servers_failed(apps: Mapping[str, AppRecord], servers: Mapping[str, ServerRecord],
                          failed: list[tuple[str, str, float]], connected: Mapping[str, bool],
                          switches: Mapping[str, tuple[WarmSwitch, ...]],
                          now: float) -> Decision:
    """:func:`decide_server_failed` for servers declared together, as one decision.

    ``failed``: (server, reason, detection time) of each. One intent names them all.
    """
    parts = [decide_server_failed(apps, servers, server_id, reason, detected_at,
                                  connected.get(server_id, False),
                                  tuple(w for w in switches.get(server_id, ()) if w.app_id in apps),
                                  now)
             for server_id, reason, detected_at in failed]
    changed = {record.app_id: record for part in parts for record in part.apps}
    server_ids = [server_id for server_id, _, _ in failed]
    return Decision(
        apps=tuple(changed[a] for a in sorted(changed)),
        servers=tuple(server for part in parts for server in part.servers),
        events=tuple(event for part in parts for event in part.events),
        intent={"kind": FAILOVER, "server_id": server_ids[0], "server_ids": server_ids,
                "reason": failed[0][1]},
        recoveries={a: r for part in parts for a, r in part.recoveries.items()},
        notes=tuple(note for part in parts for note in part.notes))


def choose_warm_switches(apps: Mapping[str, AppRecord], server_id: str, live: Collection[str],
                         families: Mapping[str, Family],
                         free_memory_mb: Callable[[str], float],
                         site_of: Mapping[str, str]) -> tuple[WarmSwitch, ...]:
    """The warm switches of the apps served from ``server_id``, from their records alone.

    The rule of ``policies.failover.split_affected``, without a snapshot of the whole cluster:
    an app served from the server switches to its best warm backup (loaded or loading) on a
    ``live`` server, the most accurate, then the one whose server has the most free memory
    (``free_memory_mb`` is asked only to break such ties), then the smallest server id. A
    backup the replica rules no longer allow (``policies.replica_rules``: outside the app's
    pinned site or its exclusion lists, above its primary variant) is not switched to;
    ``site_of`` (every server's site) is needed for the site rules.
    """
    switches = []
    for app_id in sorted(apps):
        record = apps[app_id]
        if record.serving is None or record.serving[0] != server_id:
            continue
        family = families.get(record.spec.family)
        if family is None:
            continue
        allowed = _allowed_variants(record, family)
        candidates = [r for r in record.replicas
                      if r.role is Role.WARM and r.state in (ModelState.LOADING, ModelState.READY)
                      and r.server_id in live and r.server_id != server_id
                      and r.variant in allowed and _may_hold(record, r.server_id, site_of)]
        if not candidates:
            continue
        best = max(allowed[r.variant] for r in candidates)
        top = [r for r in candidates if allowed[r.variant] == best]
        chosen = top[0] if len(top) == 1 else min(
            top, key=lambda r: (-free_memory_mb(r.server_id), r.server_id))
        switches.append(WarmSwitch(app_id, chosen.server_id, chosen.variant))
    return tuple(switches)


def _allowed_variants(record: AppRecord, family: Family) -> dict[str, float]:
    """The variants a backup of the app may be, with their accuracy (the replica rules)."""
    spec = record.spec
    primary = next((v for v in family.variants if v.name == spec.variant),
                   family.most_accurate)
    return {v.name: v.accuracy for v in family.variants
            if spec.allow_larger_backups or within_choice(primary, v)}


def _may_hold(record: AppRecord, server_id: str, site_of: Mapping[str, str]) -> bool:
    """The app's pin and exclusion lists allow a replica on the server."""
    spec = record.spec
    site = site_of.get(server_id)
    pinned = spec.pinned_site or (site_of.get(spec.pinned_server)
                                  if spec.pinned_server is not None else None)
    return (server_id not in spec.excluded_servers and site not in spec.excluded_sites
            and (pinned is None or site == pinned))


def decide_cold_batch(apps: Mapping[str, AppRecord], plan: FailoverPlan,
                      failures: Mapping[str, float], cause: Mapping[str, str],
                      families: Mapping[str, Family], now: float,
                      servers: Mapping[str, ServerRecord] | None = None) -> Decision:
    """The cold part of one plan for several failed servers, applied to the records.

    ``failures``: each failed server's detection time; ``cause``: the server whose failure
    affected each app (default: the first of ``failures``). ``apps`` must hold every app the
    plan names and every app with a replica on a failed server; ``servers`` gives the
    endpoints of late warm switches' events.

    A warm switch of the plan whose app is still served from a failed server is made here (a
    late switch): its backup was written after the switch read the app (a warm re-plan
    committing app by app), so the switch left the app where it was and the plan, seeing
    the backup, counted it switched. Without this the app would be dropped with the failed
    server's replicas.
    """
    first = next(iter(failures))

    def recovery_of(app_id: str) -> Recovery:
        server_id = cause.get(app_id, first)
        return Recovery(failures.get(server_id, failures[first]), server_id)

    changed: set[str] = set()
    recoveries: dict[str, Recovery] = {}
    events: list[Event] = []
    for switch in plan.warm_switches:
        record = apps.get(switch.app_id)
        if record is None or record.serving is None or record.serving[0] not in failures:
            continue  # switched already (the usual case), or deleted
        failed_server = record.serving[0]
        late = Recovery(failures[failed_server], failed_server, notified=True)
        event = _switch_to_backup(record, switch, late, servers or {}, now)
        if event is not None:
            recoveries[record.app_id] = late
            events.append(event)
            changed.add(record.app_id)
    late_switches = len(events)
    preempted = _preempt(plan, apps)
    changed |= preempted
    for app_id in _start_recoveries(plan, apps, families):
        recoveries[app_id] = recovery_of(app_id)
        changed.add(app_id)
    for unrecoverable in plan.unrecoverable:
        record = apps.get(unrecoverable.app_id)
        if record is None:
            continue
        record.serving = None
        record.status = AppStatus.UNAVAILABLE
        record.reason = unrecoverable.reason
        given_up = recoveries[record.app_id] = recovery_of(record.app_id)
        events.append(event_for(record, "unrecoverable", None, unrecoverable.reason, {},
                                given_up, now))
        changed.add(record.app_id)
    for server_id in failures:
        changed |= forget_replicas_on(server_id, apps)
    notes = (f"failover of {'+'.join(failures)}: {len(plan.recoveries)} progressive, "
             f"{len(plan.unrecoverable)} unrecoverable, {late_switches} late warm switches, "
             f"{len(preempted)} warm backups preempted ({len(plan.deferred_preemptions)} once "
             f"the interims serve)",) + plan.notes
    # The plan's "switch" stage was applied by decide_server_failed (or above), as records and
    # events (promoting a warm backup needs no agent); the rest is what remains to do.
    stages = tuple(stage for stage in plan.stages() if stage.name != "switch")
    return Decision(apps=tuple(apps[a] for a in sorted(changed)), events=tuple(events),
                    stages=stages, recoveries=recoveries, notes=notes)


def decide_outage_recovery(apps: Mapping[str, AppRecord], plan: FailoverPlan,
                           families: Mapping[str, Family], now: float) -> Decision | None:
    """The policy's plan for apps in an outage outside a failover (``plan_recovery``).

    ``apps`` holds the apps the plan names and those whose warm backups it preempts. The
    recovered apps get their interim and target replicas as in a failover's cold round; an
    app still without room is recorded unavailable with the reason, and told once: the
    convergence pass asks again on every change of the records, and an unchanged verdict
    writes nothing (None when nothing changes).
    """
    changed = _preempt(plan, apps) | _start_recoveries(plan, apps, families)
    events: list[Event] = []
    for unrecoverable in plan.unrecoverable:
        record = apps.get(unrecoverable.app_id)
        if record is None or (record.status is AppStatus.UNAVAILABLE
                              and record.reason == unrecoverable.reason):
            continue
        record.status, record.reason = AppStatus.UNAVAILABLE, unrecoverable.reason
        events.append(event_for(record, "unplaced", None, unrecoverable.reason, {}, None, now))
        changed.add(record.app_id)
    if not changed:
        return None
    notes = (f"outage recovery: {len(plan.recoveries)} progressive, "
             f"{len(plan.unrecoverable)} without room, {len(plan.preempted)} warm backups "
             f"preempted",) + plan.notes
    return Decision(apps=tuple(apps[a] for a in sorted(changed)), events=tuple(events),
                    stages=plan.stages(), notes=notes)


def _start_recoveries(plan: FailoverPlan, apps: Mapping[str, AppRecord],
                      families: Mapping[str, Family]) -> set[str]:
    """Put each recovery's interim (and target) replica on its record; returns the apps."""
    started = set()
    for recovery in plan.recoveries:
        record = apps.get(recovery.app_id)
        if record is None:  # deleted while the plan was made
            continue
        record.serving = None
        record.status = AppStatus.RECOVERING
        record.reason = ""
        family = record.spec.family
        interim = Replica(server_id=recovery.server_id, variant=recovery.interim_variant,
                          role=Role.INTERIM,
                          accuracy=accuracy_of(families, family, recovery.interim_variant))
        record.put_replica(interim)
        if recovery.target_variant != recovery.interim_variant:
            record.put_replica(Replica(
                server_id=recovery.server_id, variant=recovery.target_variant,
                role=Role.UPGRADE,
                accuracy=accuracy_of(families, family, recovery.target_variant)))
        else:
            interim.role = Role.UPGRADE  # one load that serves as the final target
        started.add(record.app_id)
    return started


def _preempt(plan: FailoverPlan, apps: Mapping[str, AppRecord]) -> set[str]:
    """Mark the warm backups the plan preempts as unloading; returns their apps."""
    changed = set()
    for placement in plan.preempted:
        record = apps.get(placement.app_id)
        replica = record.replica(placement.server_id, placement.variant) if record else None
        if record is None or replica is None or replica.role is not Role.WARM:
            continue
        replica.state = ModelState.UNLOADING
        changed.add(record.app_id)
    return changed


def forget_replicas_on(server_id: str, apps: Mapping[str, AppRecord]) -> set[str]:
    """Drop the replicas a failed server held (their home is kept for fail-back).

    Returns the apps that changed.
    """
    changed = set()
    for record in apps.values():
        before = len(record.replicas)
        record.replicas = [r for r in record.replicas if r.server_id != server_id]
        if record.serving and record.serving[0] == server_id:
            # Neither switched nor recovered by the plan (placed there while it was made):
            # the convergence pass places it; until then its record says so.
            record.serving = None
            record.status = status_of(record, None, loading=any(
                r.state is ModelState.LOADING and r.role not in BESIDE_ROLES
                for r in record.replicas))
            record.reason = f"server {server_id} failed"
            changed.add(record.app_id)
        if len(record.replicas) != before:
            changed.add(record.app_id)
    return changed
