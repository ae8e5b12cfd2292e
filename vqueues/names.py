"""Validation of queue and consumer names (the limits are documented in docs/api.md)."""

from __future__ import annotations

import re

import mmh3

from vqueues.errors import BadRequest

MAX_NAME_BYTES = 249
# A name made from another (a dead-letter queue's `{queue}` filled in) that would be over the
# limit keeps its first bytes and ends with "~" and 16 hex digits of the whole name's hash.
FITTED_HASH_DIGITS = 16
FITTED_HEAD_BYTES = MAX_NAME_BYTES - 1 - FITTED_HASH_DIGITS
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


def fitted_name(name: str) -> str:
    """`name` if it is at most 249 UTF-8 bytes; else its first 232 bytes (cut at a character
    boundary), "~" and the first 16 hex digits of its 128-bit MurmurHash3 (x64, seed 0): one
    valid name per long name, readable by every route (docs/work-queues.md)."""
    data = name.encode("utf-8")
    if len(data) <= MAX_NAME_BYTES:
        return name
    head = data[:FITTED_HEAD_BYTES].decode("utf-8", "ignore")  # a cut character is dropped
    digest = format(mmh3.hash128(data, 0, True, False), "032x")[:FITTED_HASH_DIGITS]
    return f"{head}~{digest}"
