"""Controller exceptions, each mapped to one HTTP status in one place (``api.py``)."""

from __future__ import annotations


class ControllerError(Exception):
    """Base class; ``status`` is the HTTP status the API answers with."""

    status = 500
    retryable = False


class NotFoundError(ControllerError):
    """An app, server or resource that does not exist."""

    status = 404


class ConflictError(ControllerError):
    """The request contradicts the current state (duplicate id, draining a failed server)."""

    status = 409


class InvalidRequestError(ControllerError):
    """Well-formed but unacceptable input (unknown family or variant, unknown pinned server)."""

    status = 422


class InvalidBatchError(InvalidRequestError):
    """A batch with invalid entries; ``errors`` names each (``field``, ``message``)."""

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


class InvalidRecordError(ControllerError):
    """A record the controller was about to write does not read back: refused, never stored."""

    status = 500


class UnauthorizedError(ControllerError):
    """Missing or wrong bearer token."""

    status = 401


class AgentUnavailableError(ControllerError):
    """The server's agent is not connected, or did not answer in time (retryable)."""

    status = 503
    retryable = True


class AgentCommandError(ControllerError):
    """The agent answered a command with an error."""

    status = 502

    def __init__(self, message: str, code: str = "", retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
