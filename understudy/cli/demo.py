"""`understudy demo`: plan a generated edge cluster and show what a server failure would do.

Until the live testbed lands, the demo runs the real policies on a generated snapshot:
primaries by worst-fit, warm backups by the ILP, then the two-step failover plan for one
failed server, next to the FailLite baselines on the same failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from model_repo.profiles import load_families
from policies.actions import FailoverPlan, WarmPlan
from policies.baselines import FullSizeCold, FullSizeWarm, FullSizeWarmK
from policies.config import WarmPlanConfig
from policies.failover import UnderstudyPolicy
from policies.model import ClusterSnapshot, accuracy_reduction
from policies.policy import FailoverPolicy
from policies.resources import COMPUTE, MEMORY_MB
from sim.generator import generate_cluster

PAPER_TESTBED_FAMILIES = ("mobilenet_v3", "shufflenet_v2", "convnext", "efficientnet",
                          "regnet_y")
"""The five families of FailLite's real-testbed experiments (§5.1)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    families = load_families()
    snapshot = generate_cluster(
        families, servers=args.servers, sites=args.sites, apps=args.apps,
        headroom=args.headroom, critical_fraction=args.critical, seed=args.seed,
        family_names=args.families or PAPER_TESTBED_FAMILIES)
    warm_config = WarmPlanConfig(alpha=args.alpha, solver=args.solver,
                                 site_independent=args.site_independent)
    policy = UnderstudyPolicy(warm=warm_config)

    _title(f"Edge cluster: {args.servers} servers in {args.sites} sites, {args.apps} apps "
           f"({sum(a.critical for a in snapshot.apps)} critical), headroom {args.headroom:.0%}, "
           f"alpha {args.alpha}")
    _print_servers(snapshot)

    warm = policy.plan_warm(snapshot)
    with_warm = snapshot.with_placements(snapshot.placements + warm.placements())
    _title("Step 1 - proactive: warm backups for the critical apps (ILP)")
    _print_warm(snapshot, warm)

    failed = args.fail or _busiest_server(snapshot)
    plan = policy.plan_failover(with_warm, [failed])
    _title(f"Step 2 - server {failed} fails: the failover plan")
    _print_failover(with_warm, plan)

    _title("Same failure under the FailLite baselines (full-size models only)")
    _print_comparison(snapshot, failed, [policy, FullSizeWarmK(warm=warm_config),
                                         FullSizeWarm(warm=warm_config), FullSizeCold()],
                      known={policy.name: warm})
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="understudy demo", description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--apps", type=int, default=24)
    parser.add_argument("--headroom", type=float, default=0.2)
    parser.add_argument("--critical", type=float, default=0.5, help="share of apps in K")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--solver", choices=["highs", "cbc", "gurobi"], default="highs")
    parser.add_argument("--site-independent", action="store_true")
    parser.add_argument("--families", nargs="*", help="profile families to draw apps from")
    parser.add_argument("--fail", metavar="SERVER", help="server to fail (default: busiest)")
    return parser.parse_args(argv)


def _title(text: str) -> None:
    print(f"\n{text}\n{'-' * len(text)}")


def _busiest_server(snapshot: ClusterSnapshot) -> str:
    counts: dict[str, int] = {}
    for p in snapshot.placements:
        counts[p.server_id] = counts.get(p.server_id, 0) + 1
    return max(sorted(counts), key=lambda s: counts[s])


def _print_servers(snapshot: ClusterSnapshot) -> None:
    print(f"{'server':<9}{'site':<9}{'memory MB used/total':>22}{'compute used/total':>21}"
          f"{'primaries':>11}")
    for server in snapshot.servers:
        used = snapshot.used[server.server_id]
        count = sum(p.server_id == server.server_id for p in snapshot.placements)
        print(f"{server.server_id:<9}{server.site_id:<9}"
              f"{used[MEMORY_MB]:>11.0f}/{server.capacity[MEMORY_MB]:<10.0f}"
              f"{used[COMPUTE]:>10.1f}/{server.capacity[COMPUTE]:<10.1f}{count:>11}")


def _print_warm(snapshot: ClusterSnapshot, warm: WarmPlan) -> None:
    print(f"{'app':<10}{'family':<15}{'primary':<26}{'warm backup':<30}{'accuracy':>9}")
    for app in snapshot.apps:
        if not app.critical:
            continue
        primary = snapshot.primary_by_app[app.app_id]
        backups = warm.for_app(app.app_id)
        where = ", ".join(f"{b.variant}@{b.server_id}" for b in backups) or "none"
        accuracy = f"{backups[0].accuracy:.3f}" if backups else "-"
        print(f"{app.app_id:<10}{app.family:<15}{primary.variant + '@' + primary.server_id:<26}"
              f"{where:<30}{accuracy:>9}")
    for uncovered in warm.uncovered:
        print(f"  ! {uncovered.app_id}: {uncovered.placed}/{uncovered.wanted} warm backups "
              f"- {uncovered.reason}")
    stats = warm.stats
    gap = "n/a" if stats.gap is None else f"{stats.gap:.2e}"
    print(f"solver {stats.solver} ({stats.method}): {stats.status}, objective "
          f"{stats.objective:.3f}, gap {gap}, {stats.total_s * 1000:.0f} ms")


def _print_failover(snapshot: ClusterSnapshot, plan: FailoverPlan) -> None:
    for switch in plan.warm_switches:
        print(f"  warm switch  {switch.app_id:<10} -> {switch.variant}@{switch.server_id} "
              f"(serves at once)")
    for r in plan.recoveries:
        upgrade = (f", then upgrade to {r.target_variant}" if r.target_variant != r.interim_variant
                   else "")
        print(f"  progressive  {r.app_id:<10} -> load {r.interim_variant}@{r.server_id}"
              f"{upgrade}")
    for u in plan.unrecoverable:
        print(f"  NOT RECOVERED {u.app_id}: {u.reason}")
    affected = len(plan.affected_apps)
    recovered = len(plan.warm_switches) + len(plan.recoveries)
    print(f"affected {affected}, recovered {recovered} ({_rate(recovered, affected)}), "
          f"mean accuracy reduction {_accuracy_loss(snapshot, plan):.2%}")
    actions = plan.actions()
    print(f"{len(actions)} actions for the orchestrator, in order:")
    for action in actions[:12]:
        print(f"    {action}")
    if len(actions) > 12:
        print(f"    ... {len(actions) - 12} more")


def _print_comparison(snapshot: ClusterSnapshot, failed: str,
                      policies: Sequence[FailoverPolicy], known: dict[str, WarmPlan]) -> None:
    """One line per policy; ``known`` holds warm plans already computed, by policy name."""
    print(f"{'policy':<18}{'warm backups':>13}{'recovered':>11}{'warm':>6}{'cold':>6}"
          f"{'accuracy loss':>15}")
    for policy in policies:
        warm = known.get(policy.name) or policy.plan_warm(snapshot)
        state = snapshot.with_placements(snapshot.placements + warm.placements())
        plan = policy.plan_failover(state, [failed])
        recovered = len(plan.warm_switches) + len(plan.recoveries)
        print(f"{policy.name:<18}{len(warm.assignments):>13}"
              f"{_rate(recovered, len(plan.affected_apps)):>11}{len(plan.warm_switches):>6}"
              f"{len(plan.recoveries):>6}{_accuracy_loss(state, plan):>15.2%}")


def _rate(recovered: int, affected: int) -> str:
    return f"{recovered / affected:.0%}" if affected else "n/a"


def _accuracy_loss(snapshot: ClusterSnapshot, plan: FailoverPlan) -> float:
    """Mean relative accuracy lost over recovered apps (FailLite §5.1's definition)."""
    losses = []
    chosen = [(s.app_id, s.variant) for s in plan.warm_switches]
    chosen += [(r.app_id, r.target_variant) for r in plan.recoveries]
    for app_id, variant in chosen:
        app = snapshot.app_by_id[app_id]
        family = snapshot.family_of(app)
        losses.append(accuracy_reduction(snapshot.primary_variant(app), family.variant(variant)))
    return sum(losses) / len(losses) if losses else 0.0


if __name__ == "__main__":
    sys.exit(main())
