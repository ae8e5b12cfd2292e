"""Lease tokens: each names a record, its attempt and the lease call that granted it (ADR 8,
ADR 12)."""

from __future__ import annotations

import random
import secrets


def new_grant() -> int:
    """A lease call's number: random, so a token names one delivery whoever granted it (a
    grant a replay never saw cannot be granted again under the same token). Drawn from a
    generator seeded from the OS once per process: unique, not secret (`secrets` read the OS
    on every call)."""
    return _GRANTS.getrandbits(48) | 1


_GRANTS = random.Random(secrets.randbits(128))


def token(offset: int, attempt: int, grant: int = 0) -> str:
    """A lease token: names the record, the attempt and the lease call that granted it
    (ADR 8's tokens, without the call, name a delivery replayed from that format)."""
    return f"{offset}.{attempt}.{grant:x}" if grant else f"{offset}.{attempt}"


# What `parse_token` takes, as a JSON Schema pattern for the OpenAPI document (tokens are
# opaque to clients; a schema-driven client must still be able to tell one from a typo).
TOKEN_PATTERN = "^[0-9]{1,19}\\.[0-9]{1,9}(\\.[0-9a-f]{1,16})?$"


def parse_token(text: object) -> tuple[int, int, int] | None:
    """(offset, attempt, grant) of a token, or None if it is not one."""
    if not isinstance(text, str) or not 3 <= len(text) <= 64 or not text.isascii():
        return None
    parts = text.split(".")
    n = len(parts)
    if n == 3:
        head, attempt, grant = parts
        if not grant or len(grant) > 16 or grant.strip(_HEX):
            return None
    elif n == 2:
        head, attempt = parts
        grant = "0"
    else:
        return None
    if not head.isdigit() or not attempt.isdigit() or len(head) > 19 or len(attempt) > 9:
        return None
    return int(head), int(attempt), int(grant, 16)


_HEX = "0123456789abcdef"
