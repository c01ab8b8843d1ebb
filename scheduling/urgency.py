"""The requests a candidate batch must not cost their chance (Orloj's goodput selection, ours).

Goodput alone favours batches of short requests (more finishes per second of worker time),
which would starve long ones past their deadlines. So each candidate is also weighed by what
it costs the few requests of highest priority it leaves out: the chance each has now of
finishing alone, less the chance it keeps after waiting for the candidate (:func:`lost`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from scheduling.distribution import Distribution

URGENT_COUNT = 4
"""How many of the highest priorities overall a batch is checked against (:func:`lost`)."""
HARMLESS_LOSS = 0.1
"""Expected finishes below which a batch costs the requests it leaves out nothing."""


@dataclass(frozen=True, slots=True)
class Urgent:
    """One of the requests of highest priority, as a decision's candidates are weighed."""

    key: Hashable
    slack_s: float
    latency: Distribution
    """The latency of a batch of it alone."""
    chance: float
    """P(it finishes in time) sent alone now."""

    @classmethod
    def alone(cls, key: Hashable, slack_s: float, latency: Distribution) -> Urgent:
        """The request ``key`` with ``slack_s`` left, whose batch alone takes ``latency``."""
        return cls(key, slack_s, latency, latency.cdf_list((slack_s,))[0])


def lost(keys: Iterable[Hashable], urgent: list[Urgent], took_s: float) -> float:
    """Expected finishes the ``urgent`` requests lose if ``keys`` run first, for ``took_s``.

    Each urgent request not in ``keys`` loses the chance it has now of finishing alone
    minus the chance it keeps after the wait.
    """
    chosen = set(keys)
    return sum(u.chance - u.latency.cdf_list((u.slack_s - took_s,))[0]
               for u in urgent if u.key not in chosen)
