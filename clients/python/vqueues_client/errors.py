"""Errors the client raises: the server's error code, HTTP status and message."""

from __future__ import annotations

from typing import Any


class VQError(Exception):
    """An error answer from vqueues (or a transport failure, status 0)."""

    def __init__(self, status: int, code: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def retriable(self) -> bool:
        return self.status in (0, 409, 429, 502, 503, 504) and self.code not in (
            "rewind_not_allowed",)


class DeadlineExceeded(VQError):
    """Retries did not succeed within the call's deadline; `last` is the last error seen."""

    def __init__(self, last: VQError | None) -> None:
        super().__init__(last.status if last else 0, "deadline_exceeded",
                         f"gave up after retries; last error: {last}")
        self.last = last
