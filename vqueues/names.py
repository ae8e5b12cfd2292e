"""Validation of queue and consumer names (the limits are documented in docs/api.md)."""

from __future__ import annotations

import re

from vqueues.errors import BadRequest

MAX_NAME_BYTES = 249
# Unicode's control characters (category Cc) are exactly these 65 code points; one regex search
# is a tenth of asking unicodedata about every character.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# The same rule as a JSON Schema pattern, for the OpenAPI document (the byte limit aside).
NAME_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"


def validate_name(name: str, what: str = "queue") -> str:
    """Return `name` if it is 1..249 UTF-8 bytes with no control characters, else raise 400."""
    if name in _VALID:  # most requests name a queue and consumer seen a moment ago
        return name
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
    if _CONTROL.search(name):
        raise BadRequest("invalid_name", f"{what} name must not contain control characters")
    if len(_VALID) >= 65_536:
        _VALID.clear()
    _VALID[name] = None
    return name


# Names that passed, whatever they named (the rules are the same for queues and consumers).
_VALID: dict[str, None] = {}
