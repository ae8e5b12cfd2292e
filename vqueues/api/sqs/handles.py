"""Receipt handles: the queue and the lease token of one receive, as an opaque string (the
base64url of `queue` LF `token`), so any node can tell which queue a handle belongs to."""

from __future__ import annotations

import base64
import binascii

from vqueues.state.tokens import parse_token

PREFIX = "vq1."


def encode_handle(queue: str, token: str) -> str:
    raw = f"{queue}\n{token}".encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_handle(handle: object) -> tuple[str, str] | None:
    """(queue, token) of a handle, or None if it is not one this API gave."""
    if not isinstance(handle, str) or not handle.startswith(PREFIX) or len(handle) > 1024:
        return None
    text = handle[len(PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        queue, sep, token = raw.decode("utf-8").partition("\n")
    except (binascii.Error, ValueError):
        return None
    if not sep or not queue or parse_token(token) is None:
        return None
    return queue, token
