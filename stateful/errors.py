"""Exceptions raised by ``stateful``.

Errors a caller can fix by changing its input (a graph spec, a request, a message from the wire)
derive from ``InvalidGraphError`` / ``InvalidGraphRequestError`` / ``WireFormatError``; they are
final.
``ReplicaUnavailableError`` is the retryable branch: the replica or the frontend is not serving
yet (or no longer), and the same call may succeed later.

The names are distinct from the controller's: ``understudy.wire.protocol.ProtocolError`` is a
bad controller <-> agent frame and ``controller.errors.InvalidRequestError`` a rejected API
request; here a bad replica frame is a ``WireFormatError`` and a message a role cannot take an
``UnexpectedMessageError``.
"""

from __future__ import annotations


class StatefulError(Exception):
    """Base class of every error raised by ``stateful``."""


class InvalidGraphError(StatefulError, ValueError):
    """A service-graph spec is inconsistent (cycle, unknown operator, no stateful operator...)."""


class UnknownOperatorKindError(InvalidGraphError):
    """An operator names a model kind that no registered factory provides."""


class InvalidGraphRequestError(StatefulError, ValueError):
    """A client request does not match the graph (unknown entry, wrong tensor shape...)."""


class WireFormatError(StatefulError, ValueError):
    """A frame or message from the wire cannot be decoded (bad length, version, JSON)."""


class UnexpectedMessageError(StatefulError):
    """A replica received a message its role cannot accept; logged and dropped by the cores."""


class ReplicaUnavailableError(StatefulError):
    """Retryable: a replica, the frontend or the graph is not (or no longer) serving."""


class LaunchError(ReplicaUnavailableError):
    """A replica process could not be started or did not become ready in time."""


class UnrecoverableError(StatefulError):
    """Both replicas of a stateful operator were lost: outside HAMS's failure model (§III-A)."""
