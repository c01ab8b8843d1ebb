"""Warm backups of a server over capacity are still known to the re-plan (controller.snapshot)."""

from __future__ import annotations

from controller.records import (
    AppRecord,
    AppSpec,
    Replica,
    ServerRecord,
)
from controller.snapshot import build_snapshot, warm_backups
from model_repo.profiles import load_families
from policies.model import Role
from understudy.wire.protocol import ModelState

FAMILIES = load_families()
LARGE = FAMILIES["convnext"].most_accurate


def _app(app_id: str, *replicas: Replica, serving: tuple[str, str] | None = None) -> AppRecord:
    return AppRecord(spec=AppSpec(app_id=app_id, family="convnext", max_rate_rps=1.0),
                     replicas=list(replicas), serving=serving)


def test_a_backup_that_overfills_its_server_is_demoted_in_the_snapshot_but_still_listed():
    # s1 has room for one largest convnext: a taken-back primary and a warm backup placed
    # there meanwhile overfill it, which the snapshot can only show by not counting the backup.
    capacity = {"memory_mb": LARGE.memory_mb * 1.5, "compute": 100.0}
    servers = {s: ServerRecord(server_id=s, site_id=f"site-{s}", capacity=capacity)
               for s in ("s1", "s2")}
    ready = ModelState.READY
    apps = {
        "a": _app("a", Replica(server_id="s1", variant=LARGE.name, role=Role.PRIMARY,
                               state=ready), serving=("s1", LARGE.name)),
        "b": _app("b", Replica(server_id="s2", variant=LARGE.name, role=Role.PRIMARY,
                               state=ready),
                  Replica(server_id="s1", variant=LARGE.name, role=Role.WARM,
                          state=ready), serving=("s2", LARGE.name)),
        # A warm backup that serves its app (after a switch) is no longer a backup.
        "c": _app("c", Replica(server_id="s2", variant=FAMILIES["convnext"].smallest.name,
                               role=Role.WARM, state=ready),
                  serving=("s2", FAMILIES["convnext"].smallest.name)),
    }
    snapshot = build_snapshot(FAMILIES, servers, apps)
    roles = {(p.app_id, p.server_id): p.role for p in snapshot.placements}
    assert roles[("b", "s1")] is Role.COLD  # demoted: the snapshot does not see it as warm
    assert warm_backups(apps, servers) == {("b", "s1", LARGE.name)}
    assert warm_backups(apps, ["s2"]) == set()
