"""Which variant, and where, an app's replicas other than its primary may use.

Every policy that places a warm backup or a failover replica (interim, target, warm switch)
asks these questions, and the independent checker (``policies/warm_check.py``) asks them
again, so the rules live in one place:

* **Never above the user's choice.** A backup or failover replica is never a variant larger
  (GPU memory) or more accurate than the app's primary variant
  (``ClusterSnapshot.primary_variant``), unless the app sets ``allow_larger_backups``. A
  larger model is slower than the latency budget the user registered, and serving with it
  after a failover reports the app "degraded" on a model nobody chose.
* **Pins.** ``pinned_site`` keeps every replica of the app in that site. ``pinned_server``
  keeps the primary on that server and every other replica in that server's site (a backup
  cannot share its primary's server anyway, and a failover replica replaces a failed one).
  Where the site has no room, the app is reported uncovered or unrecoverable, never placed
  elsewhere.
* **Site independence.** With it, an app's backups avoid its primary's site and each other's
  sites. ``WarmPlanConfig.site_independent`` left unset means "on when two or more sites have
  a live server": one site failure then cannot take an app's primary and backup together. A
  pinned app cannot leave its site, so site independence is waived for it (its backups still
  avoid the primary's server): the user's pin is the more specific wish, and the alternative
  would leave every pinned app without a backup.

Pure functions of the snapshot; no state.
"""

from __future__ import annotations

from dataclasses import replace

from policies.model import Application, ClusterSnapshot, Server, Variant

_SLACK = 1e-9
"""Memory and accuracy are floats read from profiles: equal means within this."""


def within_choice(primary: Variant, variant: Variant) -> bool:
    """True when ``variant`` is neither larger nor more accurate than ``primary``."""
    return (variant.memory_mb <= primary.memory_mb + _SLACK
            and variant.accuracy <= primary.accuracy + _SLACK)


def may_use_variant(snapshot: ClusterSnapshot, app: Application, variant: Variant) -> bool:
    """True when a backup or failover replica of ``app`` may be ``variant``."""
    return app.allow_larger_backups or within_choice(snapshot.primary_variant(app), variant)


def allowed_variants(snapshot: ClusterSnapshot, app: Application) -> tuple[Variant, ...]:
    """The family's variants a backup or failover replica of ``app`` may use, in size order."""
    family = snapshot.family_of(app)
    if app.allow_larger_backups:
        return family.variants
    primary = snapshot.primary_variant(app)
    return tuple(v for v in family.variants if within_choice(primary, v))


def pinned_site(snapshot: ClusterSnapshot, app: Application) -> str | None:
    """The one site the app's replicas may use: its pinned site, or its pinned server's."""
    if app.pinned_site is not None:
        return app.pinned_site
    if app.pinned_server is not None:
        return snapshot.server_by_id[app.pinned_server].site_id
    return None


def scoped(snapshot: ClusterSnapshot, app: Application) -> Application:
    """``app`` with its pin folded into ``allowed_backup_sites``.

    Code that honours the exclusion list (``Application.may_back_up_on``) then honours the
    pin too. The app itself when it is not pinned (no copy on the hot path).
    """
    site = pinned_site(snapshot, app)
    if site is None:
        return app
    allowed = app.allowed_backup_sites
    scope = frozenset({site}) if allowed is None else allowed & {site}
    return app if scope == allowed else replace(app, allowed_backup_sites=scope)


def may_hold_replica(snapshot: ClusterSnapshot, app: Application, server: Server) -> bool:
    """True when the pin and the exclusion list allow a backup or failover replica there."""
    site = pinned_site(snapshot, app)
    return (site is None or server.site_id == site) and app.may_back_up_on(server)


def live_sites(snapshot: ClusterSnapshot) -> frozenset[str]:
    """Sites with at least one live server."""
    return frozenset(snapshot.server_by_id[s].site_id for s in snapshot.free)


def resolve_site_independent(snapshot: ClusterSnapshot, setting: bool | None) -> bool:
    """``setting`` when given; else on when two or more sites have a live server."""
    if setting is not None:
        return setting
    return len(live_sites(snapshot)) >= 2


def spreads_sites(app: Application, site_independent: bool) -> bool:
    """Whether ``app``'s backups must avoid its primary's site and each other's."""
    return site_independent and app.pinned_site is None and app.pinned_server is None
