"""Judging a fault-injection run from samples of the controller's records: did every app converge?

``bench/convergence.py`` polls ``GET /v1/apps`` and ``GET /v1/servers`` every half second for
the whole run and keeps each poll as a :class:`Sample`. These pure functions (no clock, no
HTTP) judge the samples against the run's injections (``deploy.declarations.Injection``):

* **Windows.** After injection *i* the *last change* is the later of its instant and the
  completion of its servers' revivals (``Injection.revived``). Its judging window holds the
  sampling instants later than last change + ``settle_s`` and not later than the next
  injection (or the end of the run). A failure declaration inside it (a false alarm: the
  controller moved apps on its own) is a change too: the ``settle_s`` after it are left out.
  The bench counts the false declarations apart.
* **Below best** (:func:`below_best`). With every server revived (they are, in a window), an
  app's best possible placement is its home: the app is below its best when nothing serves it,
  when it has no home, when its home variant is not the variant it registered, or when its home
  server is up and connected and clients are not sent to the home (server, variant). When the
  home server itself is not up and connected in a sample (a revival that did not complete) the
  sample is counted apart, as ``home down``, not as degraded.
* **Degraded app-seconds** (:func:`degraded_episodes`): each sample in a window where an app is
  below its best counts the time to the next sample (capped at ``max_gap_s``, so a stalled
  poll does not count for more than it saw), summed over apps. Consecutive such samples of one
  app and one reason form an :class:`Episode`, for a person to read.
* **Backups above the primary** (:func:`backups_above_primary`): every distinct (app, server,
  variant) replica other than the app's home seen with a variant more accurate than the variant
  the app registered, for apps that do not set ``allow_larger_backups``
  (``policies.replica_rules``: never above the user's choice).
* **Pinned violations** (:func:`pinned_violations`): every distinct (app, server) where a
  replica of a pinned app sat outside its pin. The pins as the policies define them
  (``policies.replica_rules``): ``pinned_site`` keeps every replica in that site;
  ``pinned_server`` keeps the app's home on that server and every other replica in that
  server's site (a failover replica replaces the failed one there).
* **Recovery** (:func:`recovered`, :func:`recoverable`): an app served from a failed server
  just before an injection is recovered when a sample before the bench stopped waiting shows it
  served (status serving or degraded) from a server that is up and connected in that sample and
  not failed by the injection at that instant. An app whose pin allows no server outside the
  injection's victims is left out of the affected apps when its servers do not come back by
  themselves (kill, site, agent); a stopped server or a restarted Triton returns on its own and
  may recover its own apps.
* **Strays** (:func:`strays`, :func:`missing`): a model a server's Triton holds READY that no
  replica of the records names (model names are ``<app>__<variant>``; other names are not the
  controller's and are skipped), and the reverse: a READY replica of the records whose server's
  Triton does not hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deploy.declarations import STOP, TRITON, Injection
from understudy.wire.protocol import model_name, split_model_name

SELF_RETURNING = (STOP, TRITON)
"""Injection kinds whose servers come back without the bench restarting an agent."""
SERVED = ("serving", "degraded")
"""App statuses in which clients are sent somewhere that answers."""
_EPS = 1e-9
"""Accuracies are floats read from profiles: equal means within this."""


@dataclass(frozen=True, slots=True)
class ReplicaObs:
    """One replica of an app as a sample saw it."""

    server_id: str
    variant: str
    role: str
    state: str
    accuracy: float


@dataclass(frozen=True, slots=True)
class AppObs:
    """One app as a sample saw it (``GET /v1/apps``)."""

    app_id: str
    status: str
    serving: tuple[str, str] | None
    """(server, variant) clients are sent to."""
    home: tuple[str, str] | None
    replicas: tuple[ReplicaObs, ...] = ()

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> AppObs:
        """From one ``GET /v1/apps`` item."""
        serving = view.get("serving")
        home = view.get("home")
        return cls(app_id=view["app_id"], status=view["status"],
                   serving=(serving["server_id"], serving["variant"]) if serving else None,
                   home=(home[0], home[1]) if home else None,
                   replicas=tuple(ReplicaObs(r["server_id"], r["variant"], r["role"],
                                             r["state"], float(r.get("accuracy") or 0.0))
                                  for r in view.get("replicas", ())))


@dataclass(frozen=True, slots=True)
class ServerObs:
    """One server as a sample saw it (``GET /v1/servers``)."""

    server_id: str
    site_id: str
    up: bool
    """State ``up`` and connected."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One poll of the records: when, every app, every server."""

    at: float
    apps: Mapping[str, AppObs]
    servers: Mapping[str, ServerObs]

    @classmethod
    def from_views(cls, at: float, apps: Iterable[Mapping[str, Any]],
                   servers: Iterable[Mapping[str, Any]]) -> Sample:
        """From the bodies of ``GET /v1/apps`` and ``GET /v1/servers`` polled at ``at``."""
        return cls(at=at, apps={a["app_id"]: AppObs.from_view(a) for a in apps},
                   servers={s["server_id"]: ServerObs(s["server_id"], s["site_id"],
                                                      s["state"] == "up" and bool(s["connected"]))
                            for s in servers})

    def server_up(self, server_id: str) -> bool:
        """Whether the server is up and connected in this sample."""
        server = self.servers.get(server_id)
        return server is not None and server.up


@dataclass(frozen=True, slots=True)
class AppSpecObs:
    """What an app registered that the judging needs (``spec`` of ``GET /v1/apps``)."""

    app_id: str
    family: str
    variant: str | None
    pinned_server: str | None = None
    pinned_site: str | None = None
    allow_larger_backups: bool = False

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> AppSpecObs:
        """From one ``GET /v1/apps`` item."""
        spec = view["spec"]
        return cls(app_id=spec["app_id"], family=spec["family"], variant=spec.get("variant"),
                   pinned_server=spec.get("pinned_server"), pinned_site=spec.get("pinned_site"),
                   allow_larger_backups=bool(spec.get("allow_larger_backups", False)))

    def pin_site(self, site_of: Mapping[str, str]) -> str | None:
        """The one site the app's replicas may use (its pinned site, or its pinned server's)."""
        if self.pinned_site is not None:
            return self.pinned_site
        if self.pinned_server is not None:
            return site_of.get(self.pinned_server)
        return None


@dataclass(frozen=True, slots=True)
class Window:
    """The sampling instants judged after one injection: ``start`` < at <= ``end``."""

    injection: int
    last_change: float
    start: float
    end: float

    def holds(self, at: float) -> bool:
        """Whether a sample taken at ``at`` is judged in this window."""
        return self.start < at <= self.end


@dataclass(frozen=True, slots=True)
class Episode:
    """Consecutive judged samples in which one app was below its best, for one reason."""

    app_id: str
    window: int
    """Index of the injection whose window it fell in."""
    start: float
    end: float
    seconds: float
    reason: str
    home_down: bool = False
    """The home server was not up and connected: counted apart, not as degraded."""


@dataclass(frozen=True, slots=True)
class Offence:
    """A replica seen where the rules say it must not be: first and last seen."""

    app_id: str
    server_id: str
    variant: str
    role: str
    first_seen: float
    last_seen: float
    detail: str


# --- windows and degraded time ---------------------------------------------------------------


def last_change(injection: Injection) -> float:
    """The later of the injection's instant and its servers' revival completions."""
    return max([injection.at, *injection.revived.values()])


def windows(injections: Sequence[Injection], settle_s: float, end: float,
            changes: Iterable[float] = ()) -> list[Window]:
    """The judging windows after each injection (see the module docstring).

    ``changes``: other instants at which the controller changed placements on its own (its
    failure declarations, true or false). Each is a change too: the ``settle_s`` after it are
    not judged, so an injection's window may come in pieces.
    """
    instants = sorted(changes)
    found = []
    for index, injection in enumerate(injections):
        changed = last_change(injection)
        stop = injections[index + 1].at if index + 1 < len(injections) else end
        start = changed + settle_s
        for change in (c for c in instants if changed < c <= stop):
            if change > start:
                found.append(Window(index, changed, start, change))
            changed = change
            start = max(start, change + settle_s)
        if start < stop:
            found.append(Window(index, changed, start, stop))
    return found


def below_best(app: AppObs, spec: AppSpecObs | None, sample: Sample) -> tuple[str, bool] | None:
    """(why the app is below its best placement, whether its home server is down); None if not."""
    if app.serving is None:
        return f"nothing serves it ({app.status})", False
    served = f"served by {app.serving[1]} on {app.serving[0]} ({app.status})"
    if app.home is None:
        return f"no home; {served}", False
    if spec is not None and spec.variant is not None and app.home[1] != spec.variant:
        return f"home variant {app.home[1]} is not the registered {spec.variant}; {served}", False
    if app.serving == app.home:
        return None
    home = f"home {app.home[1]} on {app.home[0]}"
    if not sample.server_up(app.home[0]):
        return f"{served}; {home} is down", True
    return f"{served}; {home}", False


def degraded_episodes(samples: Sequence[Sample], judged: Sequence[Window],
                      specs: Mapping[str, AppSpecObs], max_gap_s: float = 2.0
                      ) -> list[Episode]:
    """Every stretch of judged samples in which an app was below its best, in time order.

    A sample counts the time to the next sample of the run (to the window's end for the last
    sample of a window), at most ``max_gap_s``.
    """
    ordered = sorted(samples, key=lambda s: s.at)
    open_: dict[str, Episode] = {}
    done: list[Episode] = []
    for position, sample in enumerate(ordered):
        window = next((w for w in judged if w.holds(sample.at)), None)
        if window is None:
            done += open_.values()
            open_.clear()
            continue
        following = ordered[position + 1].at if position + 1 < len(ordered) else window.end
        step = min(max(0.0, min(following, window.end) - sample.at), max_gap_s)
        for app_id, app in sample.apps.items():
            verdict = below_best(app, specs.get(app_id), sample)
            current = open_.get(app_id)
            if verdict is None or (current is not None and (
                    current.reason != verdict[0] or current.window != window.injection)):
                if current is not None:
                    done.append(current)
                    del open_[app_id]
                current = None
            if verdict is None:
                continue
            if current is None:
                current = Episode(app_id, window.injection, sample.at, sample.at, 0.0,
                                  verdict[0], verdict[1])
            open_[app_id] = Episode(app_id, current.window, current.start, sample.at + step,
                                    current.seconds + step, current.reason, current.home_down)
        for app_id in [a for a in open_ if a not in sample.apps]:
            done.append(open_.pop(app_id))
    done += open_.values()
    return sorted(done, key=lambda e: (e.start, e.app_id))


def degraded_seconds(episodes: Iterable[Episode], home_down: bool = False) -> float:
    """App-seconds below best (``home_down``: the stretches whose home server was down)."""
    return sum(e.seconds for e in episodes if e.home_down == home_down)


# --- placement rules --------------------------------------------------------------------------


def registered_accuracy(spec: AppSpecObs, accuracy: Mapping[tuple[str, str], float]
                        ) -> float | None:
    """Accuracy of the variant the app registered (the family's best when it named none)."""
    if spec.variant is not None:
        return accuracy.get((spec.family, spec.variant))
    mine = [value for (family, _), value in accuracy.items() if family == spec.family]
    return max(mine) if mine else None


def _offences(found: dict[tuple[str, str, str], Offence], app_id: str, replica: ReplicaObs,
              at: float, detail: str) -> None:
    key = (app_id, replica.server_id, replica.variant)
    first = found[key].first_seen if key in found else at
    found[key] = Offence(app_id, replica.server_id, replica.variant, replica.role, first, at,
                         detail)


def backups_above_primary(samples: Iterable[Sample], specs: Mapping[str, AppSpecObs],
                          accuracy: Mapping[tuple[str, str], float]) -> list[Offence]:
    """Distinct (app, server, variant) non-home replicas more accurate than the registered one.

    ``accuracy`` maps (family, variant) to the profile's normalised accuracy; a variant missing
    there is judged by the accuracy its replica record carries.
    """
    found: dict[tuple[str, str, str], Offence] = {}
    for sample in samples:
        for app_id, app in sample.apps.items():
            spec = specs.get(app_id)
            if spec is None or spec.allow_larger_backups:
                continue
            ceiling = registered_accuracy(spec, accuracy)
            if ceiling is None:
                continue
            for replica in app.replicas:
                if app.home is not None and (replica.server_id, replica.variant) == app.home:
                    continue
                value = accuracy.get((spec.family, replica.variant), replica.accuracy)
                if value > ceiling + _EPS:
                    _offences(found, app_id, replica, sample.at,
                              f"{replica.variant} ({value:.4f}) above the registered "
                              f"{spec.variant} ({ceiling:.4f}) as {replica.role}")
    return sorted(found.values(), key=lambda o: (o.first_seen, o.app_id))


def pin_breach(spec: AppSpecObs, app: AppObs, replica: ReplicaObs,
               site_of: Mapping[str, str]) -> str | None:
    """Why ``replica`` breaks the app's pin; None when it keeps it (or the app is not pinned)."""
    site = spec.pin_site(site_of)
    if site is None:
        return None
    where = site_of.get(replica.server_id)
    if where != site:
        return f"{replica.role} on {replica.server_id} in {where}, pinned to {site}"
    is_home = app.home is not None and (replica.server_id, replica.variant) == app.home
    if spec.pinned_server is not None and is_home and replica.server_id != spec.pinned_server:
        return f"home on {replica.server_id}, pinned to server {spec.pinned_server}"
    return None


def pinned_violations(samples: Iterable[Sample], specs: Mapping[str, AppSpecObs],
                      site_of: Mapping[str, str]) -> list[Offence]:
    """Distinct (app, server) where a replica of a pinned app sat outside its pin."""
    found: dict[tuple[str, str, str], Offence] = {}
    for sample in samples:
        for app_id, app in sample.apps.items():
            spec = specs.get(app_id)
            if spec is None:
                continue
            for replica in app.replicas:
                breach = pin_breach(spec, app, replica, site_of)
                if breach is not None:
                    _offences(found, app_id, replica, sample.at, breach)
    by_pair: dict[tuple[str, str], Offence] = {}
    for offence in sorted(found.values(), key=lambda o: o.first_seen):
        by_pair.setdefault((offence.app_id, offence.server_id), offence)
    return sorted(by_pair.values(), key=lambda o: (o.first_seen, o.app_id))


# --- recovery ---------------------------------------------------------------------------------


def recoverable(affected: Iterable[str], specs: Mapping[str, AppSpecObs],
                site_of: Mapping[str, str], injection: Injection) -> list[str]:
    """Of ``affected``, the apps whose pin lets them recover from ``injection`` (sorted).

    A pinned app whose pin's site has no server outside the victims cannot be served
    elsewhere; it is left out unless the victims return by themselves (stop, triton).
    """
    if injection.kind in SELF_RETURNING:
        return sorted(affected)
    victims = set(injection.servers)
    kept = []
    for app_id in affected:
        spec = specs.get(app_id)
        site = spec.pin_site(site_of) if spec is not None else None
        if site is None or any(s not in victims for s, where in site_of.items() if where == site):
            kept.append(app_id)
    return sorted(kept)


def recovery_times(samples: Iterable[Sample], affected: Iterable[str], injection: Injection,
                   until: float) -> dict[str, float]:
    """App -> seconds from the injection until it was first seen served again, by ``until``.

    Served again: a sample taken after the injection instant and not after ``until`` shows the
    app in a serving status, sent to a server that is up and connected in that sample and not
    failed by the injection at that instant.
    """
    waiting = set(affected)
    again: dict[str, float] = {}
    for sample in sorted(samples, key=lambda s: s.at):
        if not injection.at < sample.at <= until:
            continue
        for app_id in waiting - again.keys():
            app = sample.apps.get(app_id)
            if app is None or app.serving is None or app.status not in SERVED:
                continue
            server = app.serving[0]
            if sample.server_up(server) and not injection.failed(server, sample.at):
                again[app_id] = sample.at - injection.at
    return dict(sorted(again.items()))


def recovered(samples: Iterable[Sample], affected: Iterable[str], injection: Injection,
              until: float) -> list[str]:
    """The apps of ``affected`` served again by ``until``, sorted (:func:`recovery_times`)."""
    return sorted(recovery_times(samples, affected, injection, until))


# --- what the Tritons hold --------------------------------------------------------------------


def _record_models(apps: Iterable[AppObs], ready_only: bool) -> set[tuple[str, str]]:
    return {(r.server_id, model_name(app.app_id, r.variant)) for app in apps
            for r in app.replicas if not ready_only or r.state == "ready"}


def controller_models(names: Iterable[str]) -> set[str]:
    """The names that are ``<app>__<variant>`` model names (the others are not ours)."""
    mine = set()
    for name in names:
        try:
            split_model_name(name)
        except ValueError:
            continue
        mine.add(name)
    return mine


def strays(loaded: Mapping[str, Iterable[str]], apps: Iterable[AppObs]) -> list[tuple[str, str]]:
    """(server, model) READY in a Triton that no replica of the records names, sorted."""
    known = _record_models(apps, ready_only=False)
    return sorted((server, name) for server, names in loaded.items()
                  for name in controller_models(names) if (server, name) not in known)


def missing(loaded: Mapping[str, Iterable[str]], apps: Iterable[AppObs]
            ) -> list[tuple[str, str]]:
    """(server, model) READY in the records that its server's Triton does not hold, sorted.

    Servers absent from ``loaded`` (their Triton did not answer) are not judged.
    """
    held = {(server, name) for server, names in loaded.items() for name in names}
    return sorted((server, name) for server, name in _record_models(apps, ready_only=True)
                  if server in loaded and (server, name) not in held)


def rate(part: int, whole: int) -> float | None:
    """``part / whole`` rounded to 4 places; None when ``whole`` is 0."""
    return round(part / whole, 4) if whole else None
