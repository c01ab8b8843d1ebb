"""What the gateway tells a client when it cannot answer, and with which status (one place).

Each error carries the HTTP status and gRPC code it maps to; the front ends answer with Triton's
error shape (``{"error": "..."}``), so a tritonclient raises it with the reason as its message.
"""

from __future__ import annotations


class GatewayError(Exception):
    """A request the gateway answers with an error; ``reason`` is the metrics label."""

    status = 500
    grpc_code = "INTERNAL"
    reason = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(GatewayError):
    status, grpc_code, reason = 400, "INVALID_ARGUMENT", "bad_request"


class BodyTooLargeError(GatewayError):
    status, grpc_code, reason = 413, "RESOURCE_EXHAUSTED", "too_large"


class UnknownAppError(GatewayError):
    status, grpc_code, reason = 404, "NOT_FOUND", "unknown_app"


class AppDeletedError(UnknownAppError):
    reason = "deleted"


class QueueFullError(GatewayError):
    status, grpc_code, reason = 503, "UNAVAILABLE", "queue_full"


class UnavailableError(GatewayError):
    """The app had no serving replica that answered before the request's deadline."""

    status, grpc_code, reason = 503, "UNAVAILABLE", "unavailable"


class DeadlineError(GatewayError):
    """The deadline passed while an attempt was in flight (the replica was too slow)."""

    status, grpc_code, reason = 504, "DEADLINE_EXCEEDED", "deadline"


class StoppingError(GatewayError):
    status, grpc_code, reason = 503, "UNAVAILABLE", "stopping"


class DroppedError(GatewayError):
    """The app's batch scheduler gave up on the request before sending it.

    ``reason`` says why (``scheduling.types``): ``deadline-unreachable`` (it can no longer
    finish by its deadline, even alone), ``expired`` (the deadline passed while it waited),
    ``action-window-missed`` (the Clockwork-like scheduler's planned batch missed its window).
    """

    status, grpc_code, reason = 504, "DEADLINE_EXCEEDED", "deadline-unreachable"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
