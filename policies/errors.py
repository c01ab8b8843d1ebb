"""Exceptions raised by the pure policy layer.

Every error a caller can fix by changing its input derives from ``InvalidInputError``;
the controller maps that whole branch to HTTP 422 in one place.
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base class of every error raised by ``policies``."""


class InvalidInputError(PolicyError, ValueError):
    """The snapshot, an entity or a configuration is inconsistent."""


class DuplicateIdError(InvalidInputError):
    """Two entities of one kind share an id."""


class UnknownReferenceError(InvalidInputError):
    """An entity names another entity (family, site, server, app) that does not exist."""


class UnknownFamilyError(UnknownReferenceError):
    """An application names a model family the catalogue does not hold."""


class NegativeCapacityError(InvalidInputError):
    """A capacity or demand is negative or not a finite number."""


class VariantTooLargeError(InvalidInputError):
    """A variant needs more of some resource than any server has in total."""


class CapacityExceededError(InvalidInputError):
    """The placements in a snapshot already use more than a server's capacity."""


class SolverUnavailableError(PolicyError):
    """The requested ILP solver is not installed or not licensed on this machine."""


class SolverFailedError(PolicyError):
    """The solver ended without a usable solution (crash, or no incumbent before the limit)."""
