"""When a failover's loads and unloads run: the outage-ending interims as early as possible.

Algorithm 1 decides *what* loads where; this module decides the order, which is what the
clients of the affected apps wait on. A server loads a few models at a time (its load
threads), and on a small CPU those loads share the cores, so:

* **Interims load shortest first.** Every interim ends an outage, and shortest-job-first
  minimises the mean (and the median) time until the affected apps serve again: a 15 ms
  mobilenet queued behind a slower network waits for it, the reverse costs the slow one
  little. Critical apps still come before the others (they are the ones the operator said
  must not wait), then the variant's profiled load time, then its size, then the app id.
* **Preempted backups the interims do not need go later.** Preemption (``policies.preemption``)
  frees room for the plan's whole load, targets included. Where a server's interims fit beside
  its preempted backups, unloading those backups can wait until the interims serve: the
  unload (Triton's model teardown, a worker's exit) then does not run beside the interims.
  It still runs before any upgrade, which is what needs the room.

Pure functions over a snapshot, shared by the controller and the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.actions import ProgressiveRecovery
from policies.model import ClusterSnapshot, Placement, Variant
from policies.resources import MEMORY_MB, Resources


def _expected_load(variant: Variant, app_rate: float) -> tuple[int, float]:
    """A sort key for how long ``variant`` takes to load: profiled time, else its size."""
    if variant.load_time_s is not None:
        return 0, variant.load_time_s
    size = variant.size_mb if variant.size_mb is not None else \
        variant.demand(app_rate)[MEMORY_MB]
    return 1, size


def interims_shortest_first(snapshot: ClusterSnapshot,
                            recoveries: Sequence[ProgressiveRecovery],
                            ) -> tuple[ProgressiveRecovery, ...]:
    """``recoveries`` in the order their interims should load (see the module docstring)."""
    def key(r: ProgressiveRecovery) -> tuple[bool, tuple[int, float], str]:
        app = snapshot.app_by_id[r.app_id]
        variant = snapshot.family_of(app).variant(r.interim_variant)
        return not app.critical, _expected_load(variant, app.max_rate_rps), r.app_id

    return tuple(sorted(recoveries, key=key))


def deferrable_preemptions(after: ClusterSnapshot,
                           recoveries: Sequence[ProgressiveRecovery],
                           preempted: Sequence[Placement]) -> tuple[Placement, ...]:
    """The ``preempted`` backups whose unload can wait until the interims serve.

    ``after`` is the snapshot the plan was made on (failed servers marked, preempted backups
    still loaded). On each server, the interims' total demand must fit its free capacity with
    the backups still there; if it does not, all of that server's preempted backups go first.
    """
    interims: dict[str, Resources] = {}
    for r in recoveries:
        app = after.app_by_id[r.app_id]
        demand = after.family_of(app).variant(r.interim_variant).demand(app.max_rate_rps)
        interims[r.server_id] = interims.get(r.server_id, Resources()) + demand
    return tuple(p for p in preempted
                 if p.server_id in after.free
                 and interims.get(p.server_id, Resources()).fits_within(after.free[p.server_id]))
