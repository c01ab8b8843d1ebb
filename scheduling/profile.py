"""Per-app execution-time tracking (Orloj §3.2) and the batch latencies derived from it (§4.2).

:class:`Profiler` accumulates what the servers report, off the scheduler's critical path: solo
execution times of sampled requests per app (the asynchronous profiler re-runs finished
requests alone), arrivals per app (the weights of the model's mixture), measured batch
latencies per batch size, and each batch's overhead beside the model's own time where the
model reports that time. It keeps a sliding window of each (the paper resets its memory "every
once a while"; a window forgets gradually instead of all at once). :meth:`Profiler.snapshot`
freezes the windows into a :class:`ModelProfile`, which the scheduler uses until the next one;
:meth:`Profiler.windows` copies them (:class:`ProfilerWindows`) so that the profile can be
built elsewhere, on another thread, while measurements keep coming in.

:class:`ModelProfile` answers "what is the latency distribution of a batch of ``n``":

* the paper's estimate (§4.3): all ``n`` requests drawn from the mixture of the model's apps,
  since the batch's other members are not known when priorities are computed;
* ``app=...``: the request's own app for one member and the mixture for the other ``n - 1`` —
  the request is known to be in the batch, so its own distribution is used for it;
* once ``min_batch_observations`` batches of size ``n`` were measured, the measured latencies of
  that size instead of the estimate (the paper's mixture case only; those batches mix apps);
* for a static model (``per_batch``), one draw scaled by the law: its solo times vary with the
  machine, not with the request, so a batch's members do not each draw their own;
* the overhead beside the model's time (transfer, the server, the caller) is the law's
  constant until live batches measured it; then their distribution, added to the model's
  time as an independent draw: it varies with the machine's load by about as much as an
  early-exit model's time varies with the input.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from scheduling.distribution import MAX_KNOTS, Distribution, max_of, mixture
from scheduling.types import BatchLaw

MIN_OVERHEAD_SAMPLES = 32
"""Live overheads a snapshot needs before it uses their distribution (else the law's)."""


@dataclass(frozen=True, eq=False)
class ModelProfile:
    """A frozen view of one model's execution times (seconds)."""

    apps: Mapping[str, Distribution]
    """Solo execution time per app."""
    weights: Mapping[str, float]
    """Share of the model's requests per app (missing apps weigh 1)."""
    law: BatchLaw = field(default_factory=BatchLaw)
    measured: Mapping[int, Distribution] = field(default_factory=dict)
    """Measured batch latency per batch size (only sizes with enough measurements)."""
    per_batch: bool = False
    """True for a static model: its execution time does not depend on the request, so the
    spread of its solo times is the machine's, one draw per batch; a batch of ``n`` then takes
    one draw scaled by the law, not the longest of ``n`` independent draws (which would
    count the machine's tail ``n`` times over)."""
    overhead: Distribution | None = None
    """The overhead beside the model's own time per batch (transfer, the server, the caller),
    as measured on live batches; None: the law's constant ``overhead_s``."""

    def __post_init__(self) -> None:
        if not self.apps:
            raise ValueError("a profile needs at least one app's distribution")

    @classmethod
    def single(cls, solo: Distribution, law: BatchLaw | None = None,
               app: str = "default") -> ModelProfile:
        """One app (or all apps alike) with execution times ``solo``."""
        return cls({app: solo}, {app: 1.0}, law or BatchLaw())

    @cached_property
    def mix(self) -> Distribution:
        """The model's execution time over all its apps (§4.3)."""
        names = sorted(self.apps)
        return mixture([self.apps[a] for a in names],
                       [max(self.weights.get(a, 1.0), 1e-9) for a in names])

    def solo(self, app: str | None) -> Distribution:
        """An app's solo distribution; the model's mixture for an unknown app or None."""
        if app is None:
            return self.mix
        return self.apps.get(app, self.mix)

    def batch_latency(self, n: int, app: str | None = None) -> Distribution:
        """The latency of a batch of ``n``; with ``app``, one member is known to be from it."""
        if app is None and n in self.measured:
            return self.measured[n]
        if self.per_batch:
            return self._latency(self.solo(app), n)
        if app is None or n == 1:
            return self._latency(max_of([self.solo(app)], [n], max_knots=self._max_knots), n)
        return self._latency(max_of([self.solo(app), self.mix], [1, n - 1],
                                    max_knots=self._max_knots), n)

    def composition_latency(self, counts: Mapping[str, int]) -> Distribution:
        """The latency of a batch whose members are ``counts[app]`` requests of each app.

        Eq. 7-8 on a known composition: the longest of the members' own solo times, scaled
        by the law for the batch's size, plus the overhead (the live distribution, or the
        law's constant). A static model (``per_batch``): one draw of the mixture.
        """
        n = sum(counts.values())
        if n < 1:
            raise ValueError("a batch has at least one request")
        if self.per_batch:
            return self._latency(self.mix, n)
        names = sorted(a for a, c in counts.items() if c > 0)
        return self._latency(max_of([self.solo(a) for a in names], [counts[a] for a in names],
                                    max_knots=self._max_knots), n)

    @property
    def _max_knots(self) -> int | None:
        """Knots a batch's maximum keeps (None: all).

        All where the overhead's sum resamples it anyway: coarsening first costs more.
        """
        return MAX_KNOTS if self.overhead is None else None

    def _latency(self, longest: Distribution, n: int) -> Distribution:
        """A batch of ``n`` whose longest member takes ``longest`` alone: scaled, overhead added."""
        if self.overhead is None:
            return longest.affine(self.law.scale(n), self.law.overhead_s)
        return longest.affine(self.law.scale(n), 0.0).plus(self.overhead)


class Profiler:
    """Sliding windows of what the workers report (feed it from the batches' completions)."""

    def __init__(self, window: int = 4096, bins: int = 64, min_batch_observations: int = 0,
                 law: BatchLaw | None = None) -> None:
        if window < 2 or bins < 1 or min_batch_observations < 0:
            raise ValueError("window >= 2, bins >= 1, min_batch_observations >= 0")
        self.window, self.bins = window, bins
        self.min_batch_observations = min_batch_observations
        self.law = law or BatchLaw()
        self._solo: dict[str, deque[float]] = {}
        self._arrivals: deque[str] = deque(maxlen=window)
        self._batches: dict[int, deque[float]] = {}
        self._overhead: deque[float] = deque(maxlen=window)
        self.observations = 0
        """Solo and batch measurements taken so far (to decide when to refresh)."""

    def arrival(self, app: str) -> None:
        self._arrivals.append(app)

    def solo(self, app: str, seconds: float) -> None:
        self._solo.setdefault(app, deque(maxlen=self.window)).append(seconds)
        self.observations += 1

    def overhead(self, seconds: float) -> None:
        """A live batch's overhead beside its model's own time (``BatchDone.overhead_s``)."""
        self._overhead.append(max(0.0, seconds))

    def batch(self, size: int, seconds: float) -> None:
        if self.min_batch_observations:
            self._batches.setdefault(size, deque(maxlen=self.window)).append(seconds)
            self.observations += 1

    def snapshot(self, fallback: ModelProfile | None = None) -> ModelProfile | None:
        """The windows as a profile (apps without solo measurements keep ``fallback``'s)."""
        return self.windows().profile(fallback)

    def windows(self) -> ProfilerWindows:
        """A copy of the windows as they are now, to build a profile from anywhere.

        Copying is cheap; building the distributions is not, and can run on another thread
        while this profiler keeps taking measurements.
        """
        batches = ({n: tuple(times) for n, times in self._batches.items()
                    if len(times) >= self.min_batch_observations}
                   if self.min_batch_observations else {})
        return ProfilerWindows({app: tuple(times) for app, times in self._solo.items()},
                               tuple(self._arrivals), batches, tuple(self._overhead),
                               self.bins, self.law)


@dataclass(frozen=True, eq=False)
class ProfilerWindows:
    """What a :class:`Profiler` held at one moment (seconds), frozen."""

    solo: Mapping[str, tuple[float, ...]]
    arrivals: tuple[str, ...]
    batches: Mapping[int, tuple[float, ...]]
    """Measured batch latencies per size, only sizes with enough measurements."""
    overhead: tuple[float, ...]
    bins: int
    law: BatchLaw

    def profile(self, fallback: ModelProfile | None = None) -> ModelProfile | None:
        """The windows as a profile (apps without solo measurements keep ``fallback``'s)."""
        apps = dict(fallback.apps) if fallback is not None else {}
        for app, times in self.solo.items():
            if len(times) >= 2:
                apps[app] = Distribution.from_samples(list(times), self.bins)
        if not apps:
            return None
        counts = Counter(self.arrivals)
        weights = ({a: float(counts.get(a, 0)) + 1.0 for a in apps} if counts
                   else dict(fallback.weights) if fallback is not None else {})
        measured = {n: Distribution.from_samples(list(times), self.bins)
                    for n, times in self.batches.items()}
        overhead = (Distribution.from_samples(list(self.overhead), self.bins)
                    if len(self.overhead) >= MIN_OVERHEAD_SAMPLES
                    else fallback.overhead if fallback is not None else None)
        return ModelProfile(apps, weights, self.law, measured,
                            per_batch=fallback.per_batch if fallback is not None else False,
                            overhead=overhead)
