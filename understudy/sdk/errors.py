"""Why a request got no answer: one exception per reason, each carrying the request's record.

Every SDK call ends with an answer or one of these; ``reason`` is a short stable label (for
logs and reports) and the message says what happened, naming the replica and its last error
where there was one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from understudy.sdk.records import RequestRecord


class SdkError(RuntimeError):
    """A request that ended without an answer; ``record`` is how the client saw it."""

    reason = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.record: RequestRecord | None = None


class UnknownAppError(SdkError):
    """The controller does not know the app."""

    reason = "unknown_app"


class AppDeletedError(UnknownAppError):
    """The app was deleted while its request waited."""

    reason = "deleted"


class UnavailableError(SdkError):
    """No replica answered before the deadline (the message says the last error)."""

    reason = "unavailable"


class DeadlineError(SdkError):
    """An attempt was still in flight when the deadline passed (the replica is too slow)."""

    reason = "deadline"


class InferenceError(SdkError):
    """Triton refused the request for a reason another replica would share (a bad input)."""

    reason = "rejected"


class ClosedError(SdkError):
    """The client was closed (or is stopping) before the request was answered."""

    reason = "closed"


ClientError = SdkError
"""The name the first SDK used for its one error."""
