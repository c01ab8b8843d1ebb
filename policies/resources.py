"""An immutable vector of named resource amounts (GPU memory, compute share, ...)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

from policies.errors import NegativeCapacityError

MEMORY_MB = "memory_mb"
"""GPU memory in MiB: the resource worst-fit placement balances."""

COMPUTE = "compute"
"""Compute share in percent of one reference GPU (NVIDIA A2; see README, profiles)."""

# Slack for float comparisons: demands are sums of floats read from profiles.
_EPSILON = 1e-9


class Resources(Mapping[str, float]):
    """Amounts per resource type; a type that is absent counts as zero.

    Values are immutable after construction. Arithmetic returns new vectors.
    """

    __slots__ = ("_amounts", "_hash")

    def __init__(self, amounts: Mapping[str, float] | Iterable[tuple[str, float]] = (), /,
                 **named: float) -> None:
        merged = dict(amounts)
        merged.update(named)
        for name, value in merged.items():
            if not isinstance(name, str) or not name:
                raise NegativeCapacityError(
                    f"resource names must be non-empty strings, got {name!r}")
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise NegativeCapacityError(
                    f"resource {name!r} must be a finite number, got {value!r}")
        self._amounts: dict[str, float] = {k: float(v) for k, v in sorted(merged.items())}
        self._hash: int | None = None

    @classmethod
    def non_negative(cls, amounts: Mapping[str, float], *, what: str) -> Resources:
        """Build a vector and reject any negative amount, naming ``what`` in the error."""
        vector = cls(amounts)
        negative = {k: v for k, v in vector.items() if v < 0}
        if negative:
            raise NegativeCapacityError(f"{what}: negative amounts {negative}")
        return vector

    def __getitem__(self, name: str) -> float:
        return self._amounts.get(name, 0.0)

    def __contains__(self, name: object) -> bool:
        return name in self._amounts

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resources):
            return NotImplemented
        names = self._amounts.keys() | other._amounts.keys()
        return all(abs(self[n] - other[n]) <= _EPSILON for n in names)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple((k, round(v, 6)) for k, v in self._amounts.items() if v))
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:g}" for k, v in self._amounts.items())
        return f"Resources({inner})"

    def __add__(self, other: Mapping[str, float]) -> Resources:
        out = dict(self._amounts)
        for name, value in other.items():
            out[name] = out.get(name, 0.0) + value
        return Resources(out)

    def __sub__(self, other: Mapping[str, float]) -> Resources:
        out = dict(self._amounts)
        for name, value in other.items():
            out[name] = out.get(name, 0.0) - value
        return Resources(out)

    def scaled(self, factor: float) -> Resources:
        """Every amount multiplied by ``factor``."""
        return Resources({k: v * factor for k, v in self._amounts.items()})

    def fits_within(self, capacity: Mapping[str, float]) -> bool:
        """True when every amount here is at most the same amount in ``capacity``."""
        return all(value <= capacity.get(name, 0.0) + _EPSILON
                   for name, value in self._amounts.items())

    def as_dict(self) -> dict[str, float]:
        """A plain copy, for JSON."""
        return dict(self._amounts)


def total(vectors: Iterable[Mapping[str, float]]) -> Resources:
    """The element-wise sum of ``vectors``."""
    out: dict[str, float] = {}
    for vector in vectors:
        for name, value in vector.items():
            out[name] = out.get(name, 0.0) + value
    return Resources(out)
