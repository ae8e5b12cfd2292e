"""Errors the client raises: the server's error code, HTTP status, message and retriable flag."""

from __future__ import annotations

from typing import Any


class VQError(Exception):
    """An error answer from vqueues, or a transport failure (status 0).

    `retriable` is the server's own `retriable` field of the error body (its error registry
    decides); a transport failure is retriable, and an answer without that field is not.
    """

    def __init__(self, status: int, code: str, message: str,
                 details: dict[str, Any] | None = None, *, retriable: bool = False) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retriable = retriable


class DeadlineExceeded(VQError):
    """Retries did not succeed within the call's deadline; `last` is the last error seen."""

    def __init__(self, last: VQError | None) -> None:
        super().__init__(last.status if last else 0, "deadline_exceeded",
                         f"gave up after retries; last error: {last}")
        self.last = last
