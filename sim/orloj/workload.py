"""The workloads of Orloj's evaluation (§5.2): execution-time distributions and arrivals.

The paper's synthetic distributions come from a BART model whose execution time is controlled
through its input, grouped into short and long requests (or more groups) and mixed. The text
gives their shapes and the standard deviation of each mode but not the modes' positions, so
here (all documented choices, times in ms):

* a *k-modal* distribution has ``k`` normal modes evenly spaced over [10, 40] ms, one per app
  (more modes, §5.3: "to simulate the effect of multiple applications"), standard deviation
  1 ms unless the case says otherwise (Table 2's ``std-0.5``, ``std-1``, ``std-2``; the
  unequal-peak cases ``std-2/0.5`` and ``std-0.5/2`` give the short and the long mode each its
  own); the one-modal case is a single wider mode N(25, 5);
* the static models (§5.4) are constants with a batch law fitted to typical V100 figures
  (ResNet-50: 1.5 ms alone, Inception V3: 3 ms; see ``STATIC``);
* the real tasks of Fig. 7 are stand-ins shaped like Fig. 2's histograms (clusters for the
  early-exit CV models, a continuous skewed range for the NLP ones); their exact histograms are
  not in the paper's text.

Arrivals follow the paper's use of the Azure Functions trace in spirit: a Poisson process
whose rate changes every ``period_s`` by a log-normal factor (bursty, mean 1), scaled so that
the mean load is ``load`` times the worker's capacity at the largest batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduling.distribution import Distribution
from scheduling.types import BatchLaw

MS = 1e-3
DYNAMIC_LAW = BatchLaw(slope=0.1)
"""A padded batch of ``n`` takes (1 + 0.1 (n - 1)) times its longest member alone."""


@dataclass(frozen=True, slots=True)
class Mode:
    """One app's execution time: a normal mode (ms), truncated at ``floor_ms``."""

    mean_ms: float
    std_ms: float
    weight: float = 1.0
    floor_ms: float = 0.1

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.maximum(rng.normal(self.mean_ms, self.std_ms, size), self.floor_ms) * MS


@dataclass(frozen=True, slots=True)
class Clusters:
    """An app whose requests leave at one of a few exits (ms): point clusters with jitter."""

    centres_ms: tuple[float, ...]
    probabilities: tuple[float, ...]
    jitter_ms: float
    weight: float = 1.0

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        p = np.asarray(self.probabilities) / sum(self.probabilities)
        which = rng.choice(len(self.centres_ms), size=size, p=p)
        values = np.asarray(self.centres_ms)[which] + rng.normal(0.0, self.jitter_ms, size)
        return np.asarray(np.maximum(values, 0.1) * MS)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """An app with a continuous skewed range (sequence lengths), clipped to [lo, hi] ms."""

    median_ms: float
    sigma: float
    lo_ms: float
    hi_ms: float
    weight: float = 1.0

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        values = self.median_ms * np.exp(rng.normal(0.0, self.sigma, size))
        return np.asarray(np.clip(values, self.lo_ms, self.hi_ms) * MS)


App = Mode | Clusters | LogNormal


@dataclass(frozen=True, slots=True)
class Workload:
    """A model's apps (name -> execution-time shape), its batch law, and a label."""

    name: str
    apps: dict[str, App]
    law: BatchLaw = DYNAMIC_LAW
    static_ms: float | None = None
    """A static model: every request takes exactly this long alone."""

    def draw(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(app index, solo seconds) for ``size`` requests."""
        names = sorted(self.apps)
        weights = np.array([self.apps[a].weight for a in names], dtype=float)
        which = rng.choice(len(names), size=size, p=weights / weights.sum())
        solo = np.empty(size)
        for i, name in enumerate(names):
            mask = which == i
            if self.static_ms is not None:
                solo[mask] = self.static_ms * MS
            else:
                solo[mask] = self.apps[name].draw(rng, int(mask.sum()))
        return which, solo

    def scaled(self, factor: float) -> Workload:
        """Every execution time multiplied by ``factor`` (Fig. 12)."""
        apps: dict[str, App] = {}
        for name, app in self.apps.items():
            if isinstance(app, Mode):
                apps[name] = Mode(app.mean_ms * factor, app.std_ms * factor, app.weight,
                                  app.floor_ms * factor)
            elif isinstance(app, Clusters):
                apps[name] = Clusters(tuple(c * factor for c in app.centres_ms),
                                      app.probabilities, app.jitter_ms * factor, app.weight)
            else:
                apps[name] = LogNormal(app.median_ms * factor, app.sigma, app.lo_ms * factor,
                                       app.hi_ms * factor, app.weight)
        static = None if self.static_ms is None else self.static_ms * factor
        return Workload(f"{self.name}x{factor:g}", apps, self.law, static)


def modal(k: int, std_ms: float = 1.0, low_ms: float = 10.0, high_ms: float = 40.0,
          stds: tuple[float, ...] | None = None) -> Workload:
    """``k`` normal modes evenly spaced over [low, high] ms, one app each (k = 1: N(25, 5))."""
    if k == 1:
        return Workload("one-modal", {"app0": Mode((low_ms + high_ms) / 2, 5.0)})
    means = np.linspace(low_ms, high_ms, k)
    spreads = stds or (std_ms,) * k
    apps: dict[str, App] = {f"app{i}": Mode(float(m), s)
                            for i, (m, s) in enumerate(zip(means, spreads, strict=True))}
    label = f"{k}-modal" if stds is None else "std-" + "/".join(f"{s:g}" for s in stds)
    return Workload(label, apps)


def bimodal(std_ms: float) -> Workload:
    workload = modal(2, std_ms)
    return Workload(f"std-{std_ms:g}", workload.apps)


STATIC = {
    "resnet-imagenet": Workload("resnet-imagenet", {"app0": Mode(1.5, 0.0)},
                                BatchLaw(slope=0.29), static_ms=1.5),
    "inception-imagenet": Workload("inception-imagenet", {"app0": Mode(3.0, 0.0)},
                                   BatchLaw(slope=0.23), static_ms=3.0),
}
"""Static models: batch 1 / batch 16 of about 1.5 / 8 ms (ResNet-50) and 3 / 13 ms (Inception
V3) on a V100 with TensorRT, as a constant plus the batch law."""

REAL = {
    "rdinet-cifar": Workload("rdinet-cifar", {"app0": Clusters((2.0, 4.0, 6.0),
                                                               (0.5, 0.3, 0.2), 0.1)}),
    "skipnet-imagenet": Workload("skipnet-imagenet", {"app0": Clusters(
        (6.0, 9.0, 12.0, 15.0), (0.1, 0.3, 0.4, 0.2), 0.3)}),
    "gpt-cornell": Workload("gpt-cornell", {"app0": LogNormal(30.0, 0.6, 8.0, 150.0)}),
    "bart-cnn": Workload("bart-cnn", {"app0": LogNormal(90.0, 0.4, 40.0, 250.0)}),
}
"""Stand-ins for four of Table 5's real tasks, shaped after Fig. 2 (not their histograms)."""


def early_exit_queue(slope: float) -> Workload:
    """The live bench's shared early-exit queue (``bench/orloj.py``), with a batch ``slope``.

    Two apps of equal weight, shaped after what the gateway learnt on the early-exit digits:
    ``easy`` (the digits that leave at the first exit, about 1 ms alone) and ``hard`` (those
    that run to the last, about 4 ms), each batch paying a constant overhead (transfer, the
    server: about 1.5 ms) beside the model's time.
    """
    return Workload(f"early-exit queue, slope {slope:g}",
                    {"easy": LogNormal(1.05, 0.23, 0.5, 4.0),
                     "hard": LogNormal(4.1, 0.13, 2.5, 9.0)},
                    BatchLaw(slope=slope, overhead_s=1.5 * MS))


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests of one run: arrival (s), app name, solo execution time (s)."""

    arrivals: np.ndarray
    apps: tuple[str, ...]
    solo: np.ndarray
    names: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return int(self.arrivals.size)


def capacity_rps(workload: Workload, profile_solo: Distribution, max_batch: int) -> float:
    """Requests per second one worker sustains at ``max_batch`` (expected padded latency)."""
    latency = workload.law.latency(max_batch, profile_solo.expected_max(max_batch))
    return max_batch / latency


def make_trace(workload: Workload, count: int, rate_rps: float, rng: np.random.Generator,
               period_s: float = 1.0, burst_sigma: float = 0.3) -> Trace:
    """``count`` requests, Poisson within each period, rate × a log-normal factor (mean 1)."""
    arrivals = np.empty(count)
    t, i = 0.0, 0
    while i < count:
        factor = float(np.exp(rng.normal(-burst_sigma ** 2 / 2, burst_sigma)))
        rate = rate_rps * factor
        end = t + period_s
        while i < count:
            t += float(rng.exponential(1.0 / rate))
            if t >= end:
                t = end
                break
            arrivals[i] = t
            i += 1
    which, solo = workload.draw(rng, count)
    names = tuple(sorted(workload.apps))
    return Trace(arrivals, tuple(names[j] for j in which), solo, names)


def profile_samples(workload: Workload, rng: np.random.Generator,
                    per_app: int = 2000) -> dict[str, np.ndarray]:
    """Historical solo execution times per app: the offline profile every scheduler uses."""
    out = {}
    for name in sorted(workload.apps):
        single = Workload(workload.name, {name: workload.apps[name]}, workload.law,
                          workload.static_ms)
        out[name] = single.draw(rng, per_app)[1]
    return out
