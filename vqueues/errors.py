"""One error hierarchy: each error has a stable `code`, an HTTP `status` and a `retriable` flag.

The HTTP layer renders every `VQError` as `{"error": {"code", "message", ...details}}`.
"""

from __future__ import annotations

from typing import Any


class VQError(Exception):
    """Base of every client-visible error."""

    status = 500
    code = "internal"
    retriable = False

    def __init__(self, code: str | None = None, message: str = "", **details: Any) -> None:
        super().__init__(message or code or self.code)
        if code:
            self.code = code
        self.message = message or self.code
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class BadRequest(VQError):
    status = 400
    code = "bad_request"


class NotFound(VQError):
    status = 404
    code = "not_found"


class Conflict(VQError):
    status = 409
    code = "conflict"


class WrongNode(Conflict):
    """The queue's partition is owned by another node (or none)."""

    code = "wrong_node"
    retriable = True


class PayloadTooLarge(VQError):
    status = 413
    code = "payload_too_large"


class Unavailable(VQError):
    """Temporarily unable to serve (partition replaying, broker unreachable)."""

    status = 503
    code = "unavailable"
    retriable = True

    def __init__(self, code: str | None = None, message: str = "", retry_after_s: int = 1,
                 **details: Any) -> None:
        super().__init__(code, message, **details)
        self.retry_after_s = retry_after_s


class BrokerError(Unavailable):
    """A Kafka operation failed; translated at the adapter's edge."""

    code = "broker_error"


class ConfigError(Exception):
    """Settings or topic layout that a node cannot start with."""
