"""What Orloj plans with for one profile, and its refresh as a job that can run off the caller.

:class:`Planning` holds a :class:`~scheduling.profile.ModelProfile` with the distributions and
curves Orloj derives from it: eq. 2's curve per (app, batch size), the latency of a batch of
``n`` drawn from the mixture, the latency of a batch of known composition and its (mean, p99).
Each is built on first use and cached for the profile's life. Building them is most of what a
profile refresh costs: a composition's latency alone takes a fraction of a millisecond, and a
queue uses a few dozen.

:class:`RefreshJob` is a refresh as a value (§3.2: the profiler updates the distributions
asynchronously, off the scheduler's critical path): the profiler's windows as they were, the
profile in use and the entries in use, all frozen. Calling it builds the new profile and, when
it moved (``refresh_tolerance``), a :class:`Planning` with the same entries built ahead, so the
decisions after the refresh find them ready. It shares nothing mutable with the scheduler: the
gateway runs it on a worker thread and hands the result back to ``Orloj.install``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.distribution import Distribution
from scheduling.orloj_config import OrlojConfig
from scheduling.priority import Curve
from scheduling.profile import ModelProfile, ProfilerWindows

Composition = tuple[tuple[str, int], ...]
"""Requests per app in a batch, sorted by app, zero counts left out."""
CACHE_LIMIT = 4096
"""Entries a cache keeps before it starts afresh (a queue uses a few dozen)."""


@dataclass(frozen=True)
class PlanningKeys:
    """The entries a :class:`Planning` had built: the ones worth building ahead."""

    curves: tuple[tuple[str | None, int], ...] = ()
    mixes: tuple[int, ...] = ()
    compositions: tuple[Composition, ...] = ()
    moments: tuple[Composition, ...] = ()


class Planning:
    """One profile's batch latencies and eq.-2 curves, as Orloj uses them, built on demand."""

    def __init__(self, profile: ModelProfile, config: OrlojConfig) -> None:
        self.profile = profile
        self.config = config
        delay = config.delay_s or config.delay_p99 * profile.mix.quantile(0.99)
        self.delay_s = delay if delay > 0 else 1e-3
        """The anticipated delay ``a`` (a model whose requests take no time: any scale)."""
        self._curves: dict[tuple[str | None, int], Curve] = {}
        self._mixes: dict[int, Distribution] = {}
        self._compositions: dict[Composition, Distribution] = {}
        self._moments: dict[Composition, tuple[float, float]] = {}

    def curve(self, app: str | None, n: int) -> Curve:
        """Eq. 2's curve for a batch of ``n`` (per app when request-aware)."""
        key = (app if self.config.request_aware else None, n)
        curve = self._curves.get(key)
        if curve is None:
            cfg = self.config
            curve = self._curves[key] = Curve.build(
                self.profile.batch_latency(n, key[0]), self.delay_s, penalty=cfg.penalty,
                bins=cfg.bins, min_probability=cfg.min_probability)
        return curve

    def mix_latency(self, n: int) -> Distribution:
        """Latency of a batch of ``n`` drawn from the model's mixture (§4.3)."""
        latency = self._mixes.get(n)
        if latency is None:
            latency = self._mixes[n] = self.profile.batch_latency(n)
        return latency

    def composition(self, counts: Composition) -> Distribution:
        """The latency of a batch with ``counts`` requests per app."""
        latency = self._compositions.get(counts)
        if latency is None:
            latency = self.profile.composition_latency(dict(counts))
            if len(self._compositions) >= CACHE_LIMIT:
                self._compositions.clear()
            self._compositions[counts] = latency
        return latency

    def moments(self, counts: Composition) -> tuple[float, float]:
        """(mean, p99) latency of a batch with ``counts`` requests per app."""
        found = self._moments.get(counts)
        if found is None:
            latency = self.composition(counts)
            if len(self._moments) >= CACHE_LIMIT:
                self._moments.clear()
            found = self._moments[counts] = (latency.mean(), latency.quantile(0.99))
        return found

    def keys(self) -> PlanningKeys:
        """The entries built so far (on the thread that uses this planning)."""
        return PlanningKeys(tuple(self._curves), tuple(self._mixes), tuple(self._compositions),
                            tuple(self._moments))

    def build(self, keys: PlanningKeys) -> None:
        """Build ``keys``' entries now rather than on first use."""
        for app, n in keys.curves:
            self.curve(app, n)
        for n in keys.mixes:
            self.mix_latency(n)
        for counts in keys.compositions:
            self.composition(counts)
        for counts in keys.moments:
            self.moments(counts)


def moved(new: ModelProfile, old: ModelProfile, tolerance: float) -> bool:
    """Whether ``new`` is further than ``tolerance`` from ``old`` (0: always moved).

    Every app's distribution, the mixture, the measured batch latencies and the overhead's,
    by their largest CDF gap; a change of apps, or of whether there is a measured overhead,
    is a move.
    """
    if not tolerance or set(new.apps) != set(old.apps) or \
            (new.overhead is None) != (old.overhead is None) or \
            new.measured.keys() != old.measured.keys():
        return True
    pairs = [(new.apps[a], old.apps[a]) for a in new.apps]
    pairs.append((new.mix, old.mix))
    pairs += [(new.measured[n], old.measured[n]) for n in new.measured]
    if new.overhead is not None and old.overhead is not None:
        pairs.append((new.overhead, old.overhead))
    return any(fresh.distance(current) > tolerance for fresh, current in pairs)


@dataclass(frozen=True, eq=False)
class RefreshJob:
    """A profile refresh, frozen: call it anywhere; ``Orloj.install`` takes its result."""

    windows: ProfilerWindows
    current: ModelProfile
    """The profile in use when the job was made (apps not measured since keep theirs)."""
    config: OrlojConfig
    keys: PlanningKeys
    """The entries in use, built ahead in the new planning."""

    def __call__(self) -> Planning | None:
        """The new planning, its entries built; None when the profile has not moved."""
        profile = self.windows.profile(self.current)
        if profile is None or not moved(profile, self.current, self.config.refresh_tolerance):
            return None
        planning = Planning(profile, self.config)
        planning.build(self.keys)
        return planning
