"""An immutable vector of named resource amounts (GPU memory, compute share, ...)."""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView

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
        if isinstance(amounts, Resources) and not named:
            # Already checked and immutable: share its amounts.
            self._amounts: dict[str, float] = amounts._amounts
            self._hash: int | None = amounts._hash
            return
        merged = dict(amounts)
        merged.update(named)
        for name, value in merged.items():
            if not isinstance(name, str) or not name:
                raise NegativeCapacityError(
                    f"resource names must be non-empty strings, got {name!r}")
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise NegativeCapacityError(
                    f"resource {name!r} must be a finite number, got {value!r}")
        self._amounts = {k: float(v) for k, v in sorted(merged.items())}
        self._hash = None

    @classmethod
    def _trusted(cls, amounts: dict[str, float]) -> Resources:
        """Wrap ``amounts`` as is: names valid and sorted, values finite floats (not copied)."""
        vector = cls.__new__(cls)
        vector._amounts = amounts
        vector._hash = None
        return vector

    @classmethod
    def non_negative(cls, amounts: Mapping[str, float], *, what: str) -> Resources:
        """Build a vector and reject any negative amount, naming ``what`` in the error."""
        vector = cls(amounts)
        negative = {k: v for k, v in vector.items() if v < 0}
        if negative:
            raise NegativeCapacityError(f"{what}: negative amounts {negative}")
        return vector

    def plus(self, name: str, amount: float) -> Resources:
        """This vector with ``amount`` added to resource ``name``: ``self + {name: amount}``."""
        if type(amount) is not float or type(name) is not str or not name:
            return self + {name: amount}
        out = dict(self._amounts)
        out[name] = out.get(name, 0.0) + amount
        return _result(out, trusted=True, resort=len(out) != len(self._amounts))

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
        return _result(out, trusted=isinstance(other, Resources),
                       resort=len(out) != len(self._amounts))

    def __sub__(self, other: Mapping[str, float]) -> Resources:
        out = dict(self._amounts)
        for name, value in other.items():
            out[name] = out.get(name, 0.0) - value
        return _result(out, trusted=isinstance(other, Resources),
                       resort=len(out) != len(self._amounts))

    def scaled(self, factor: float) -> Resources:
        """Every amount multiplied by ``factor``."""
        out = {k: v * factor for k, v in self._amounts.items()}
        # A float or int factor keeps every product a float; anything else is converted and
        # checked by the validating constructor.
        return _result(out, trusted=type(factor) in (float, int), resort=False)

    # items() and values() straight from the dict: the Mapping mixins' views call
    # __getitem__ per name, and arithmetic iterates vectors all the time.

    def items(self) -> ItemsView[str, float]:
        """(name, amount) pairs in name order (a read-only view)."""
        return self._amounts.items()

    def values(self) -> ValuesView[float]:
        """Amounts in name order (a read-only view)."""
        return self._amounts.values()

    def fits_within(self, capacity: Mapping[str, float]) -> bool:
        """True when every amount here is at most the same amount in ``capacity``."""
        get = capacity._amounts.get if isinstance(capacity, Resources) else capacity.get
        for name, value in self._amounts.items():
            # "not <=" rather than ">": a NaN in a foreign mapping must not count as room.
            if not value <= get(name, 0.0) + _EPSILON:
                return False
        return True

    def as_dict(self) -> dict[str, float]:
        """A plain copy, for JSON."""
        return dict(self._amounts)


def total(vectors: Iterable[Mapping[str, float]]) -> Resources:
    """The element-wise sum of ``vectors``."""
    out: dict[str, float] = {}
    trusted = True
    for vector in vectors:
        trusted = trusted and isinstance(vector, Resources)
        for name, value in vector.items():
            out[name] = out.get(name, 0.0) + value
    return _result(out, trusted=trusted, resort=True)


def _result(amounts: dict[str, float], *, trusted: bool, resort: bool) -> Resources:
    """A vector from the outcome of arithmetic, validated only as far as it could break.

    ``trusted`` means every name came from a ``Resources`` (so is valid) and every value is a
    float; then only finiteness is in doubt (a sum can overflow), checked in one ``sum``:
    it is finite only if every term is, and a false alarm (finite terms overflowing the
    sum) just takes the validating path, which accepts them. Untrusted input, or a non-finite
    result, goes through the constructor, which raises its usual error. ``resort`` when
    names may be out of order (a name was added, or the dict was built from scratch).
    """
    if not trusted or not math.isfinite(sum(amounts.values())):
        return Resources(amounts)
    if resort:
        amounts = dict(sorted(amounts.items()))
    return Resources._trusted(amounts)
