"""Validation of queue and consumer names (the limits are documented in docs/api.md)."""

from __future__ import annotations

import unicodedata

from vqueues.errors import BadRequest

MAX_NAME_BYTES = 249


def validate_name(name: str, what: str = "queue") -> str:
    """Return `name` if it is 1..249 UTF-8 bytes with no control characters, else raise 400."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("invalid_name", f"{what} name is not valid UTF-8") from None
    if size == 0:
        raise BadRequest("invalid_name", f"{what} name must not be empty")
    if size > MAX_NAME_BYTES:
        raise BadRequest(
            "invalid_name", f"{what} name is {size} UTF-8 bytes; at most {MAX_NAME_BYTES} allowed"
        )
    for ch in name:
        if unicodedata.category(ch) == "Cc":
            raise BadRequest("invalid_name", f"{what} name must not contain control characters")
    return name
