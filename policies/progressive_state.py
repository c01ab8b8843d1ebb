"""The working state of one ``plan_progressive`` call: the apps it places and the servers' room.

Kept apart from the planner so that ``progressive_reasons`` reads the finished state without
importing the planner that uses it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from policies.model import Application, Server

EPSILON = 1e-9
"""Slack of every capacity comparison, as in ``Resources.fits_within``."""

Vec = tuple[float, ...]
Entry = tuple[float, int]  # (-free memory after reserve, server index): worst-fit sorts first


@dataclass(slots=True)
class PlanApp:
    """One affected app's numbers for this call, and where it ends up."""

    app: Application
    dem: list[Vec]          # demand per variant (size order) at the app's max rate
    mem: list[float]
    acc: list[float]
    top: int                # index of the primary variant (δ is relative to it)
    ok: list[list[bool]]    # per latency class, per variant: allowed and meets the SLO
    interim: list[int]      # per latency class: smallest variant that is ok, or -1
    restricted: bool        # has an exclusion list
    excluded: frozenset[str]  # servers it may not use (its sites are left out of its pools)
    match: int = 0
    pos: int = 0
    server: int = -1
    variant: int = -1
    interim_index: int = -1
    base: Vec = ()
    trans: Vec = ()


@dataclass(slots=True)
class PlanCluster:
    """Mutable working copy of the live servers' free capacity (local to one call)."""

    servers: list[Server]
    ids: list[str]
    free: list[Vec]
    klass: list[int]
    used: list[list[float]]         # per server: Σ steady demand of the plan's apps
    reserve: list[list[float]]      # per server: max transient demand (see module docstring)
    residents: list[list[PlanApp]]
    entry: list[Entry]              # per server: its current entry in its sorted lists
    orders: list[list[Entry]]       # one sorted list per latency class
    site_orders: list[dict[str, list[Entry]]]  # per latency class and site: same entries

    def head(self, k: int) -> float:
        """Free memory of server ``k`` once its targets and its reserve are counted."""
        return self.free[k][0] - self.used[k][0] - self.reserve[k][0]

    def touch(self, k: int) -> None:
        """Server ``k`` changed: move its entry to its new place in its sorted lists."""
        old, new, c = self.entry[k], (-self.head(k), k), self.klass[k]
        for order in (self.orders[c], self.site_orders[c][self.servers[k].site_id]):
            del order[bisect_left(order, old)]
            insort(order, new)
        self.entry[k] = new

    def resort(self) -> None:
        """Move every server whose free memory changed unnoticed (upgrades) to its place."""
        for k, entry in enumerate(self.entry):
            if entry != (-self.head(k), k):
                self.touch(k)

    def pools(self, c: int, app: Application) -> list[list[Entry]]:
        """Lists to search in class ``c``: one per allowed site if the app lists sites."""
        # Else an app allowed in one site of ten walks the other nine once its site is full.
        allowed, excluded = app.allowed_backup_sites, app.excluded_sites
        if allowed is None and not excluded:
            return [self.orders[c]]
        return [order for site, order in self.site_orders[c].items()
                if site not in excluded and (allowed is None or site in allowed)]
