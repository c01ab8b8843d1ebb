"""The package's exceptions: one base, a subclass per stage."""

from __future__ import annotations


class ParityError(ValueError):
    """Anything the parity package refuses; the command line maps it to exit status 2."""


class CodingError(ParityError):
    """A coding group, a query or an output that the encoder or the decoder cannot take."""


class ParityTrainingError(ParityError):
    """A parity model that cannot be trained as asked (unknown family or variant, bad k)."""
