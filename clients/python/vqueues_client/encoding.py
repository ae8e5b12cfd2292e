"""Requests as a node reads them, and its answers as the client's types: records' JSON,
the node's name and size rules, and its errors."""

from __future__ import annotations

import base64
import json as jsonlib
import re
from collections.abc import Callable
from typing import Any

from vqueues_client.errors import VQError
from vqueues_client.types import NewRecord, Record, Value


def _encode_value(value: Value, headers: dict[str, str] | None) -> dict[str, Any]:
    item: dict[str, Any]
    if isinstance(value, bytes | bytearray | memoryview):
        item = {"value": base64.b64encode(bytes(value)).decode("ascii"), "encoding": "base64"}
    else:
        item = {"value": value}
    if headers:
        item["headers"] = headers
    return item


def encode_item(item: Value | NewRecord, headers: dict[str, str] | None) -> dict[str, Any]:
    if isinstance(item, NewRecord):
        out = _encode_value(item.value, item.headers)
        if item.idempotency_key is not None:
            out["idempotency_key"] = item.idempotency_key
        if item.tags is not None:
            out["tags"] = item.tags
        if item.deliver_at is not None:
            out["deliver_at"] = item.deliver_at
        if item.delay_ms is not None:
            out["delay_ms"] = item.delay_ms
        return out
    return _encode_value(item, headers)


def checked_pairs(records: list[tuple[str, Value | NewRecord]]
                  ) -> list[tuple[str, Value | NewRecord]]:
    """`records` checked: each a (queue, value) pair. A dict would unpack into its two keys,
    and `{"queue": "q", "value": "v"}` would write "value" to a queue named "queue"."""
    for i, rec in enumerate(records):
        if not isinstance(rec, tuple | list) or len(rec) != 2 or not isinstance(rec[0], str):
            raise TypeError(f"records[{i}] must be a (queue, value) pair, with the queue a "
                            f"string; got {type(rec).__name__} {rec!r:.60}")
    return records


# A queue name's rule, as the node's (vqueues/names.py): 1-249 UTF-8 bytes, no control
# characters (Unicode category Cc).
MAX_NAME_BYTES = 249
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# `{"records":[` and `]}` around a multi-queue request's records.
_ENVELOPE_BYTES = len(b'{"records":[]}')
# Where a node's refusal of a whole request names the record it refused for.
_RECORD_AT = re.compile(r"records\[(\d+)\]")


def name_error(queue: str, what: str = "queue") -> VQError | None:
    """The node's `400 invalid_name` for `queue`, found before sending; None if it is valid."""
    try:
        size = len(queue.encode("utf-8"))
    except UnicodeEncodeError:
        return VQError(400, "invalid_name", f"{what} name is not valid UTF-8")
    if size == 0:
        return VQError(400, "invalid_name", f"{what} name must not be empty")
    if size > MAX_NAME_BYTES:
        return VQError(400, "invalid_name", f"{what} name is {size} UTF-8 bytes; at most "
                       f"{MAX_NAME_BYTES} allowed")
    if _CONTROL.search(queue):
        return VQError(400, "invalid_name", f"{what} name must not contain control characters")
    return None


def encode_for_many(queue: str, item: Value | NewRecord) -> tuple[bytes, int]:
    """One record of a multi-queue request as the JSON sent (compact), and its value's size
    as the node counts it (decoded bytes)."""
    obj = {"queue": queue, **encode_item(item, None)}
    try:
        data = jsonlib.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, for the node to refuse
        data = jsonlib.dumps(obj, separators=(",", ":")).encode()
    value = item.value if isinstance(item, NewRecord) else item
    if value is None:
        return data, 0
    if isinstance(value, str):
        return data, len(value.encode("utf-8", "surrogatepass"))
    return data, memoryview(value).nbytes


def request_bytes(sizes: list[int]) -> int:
    """The size of a multi-queue request holding records of these encoded sizes."""
    return _ENVELOPE_BYTES + sum(sizes) + max(0, len(sizes) - 1)


def named_record(err: VQError, count: int) -> int | None:
    """The one record (its index in the request) a node's refusal of a whole multi-queue
    request of `count` records names (`records[i]`), or None."""
    if err.retriable or not 400 <= err.status < 500:
        return None
    index = err.details.get("index")
    match = _RECORD_AT.search(err.message)
    at = int(match[1]) if match else index if type(index) is int else None
    return at if at is not None and 0 <= at < count else None


def renamed(err: VQError, name: Callable[[int], str], index: Callable[[int], int | None]
            ) -> VQError:
    """`err` with the records it names by their place in the client's own request
    (`records[k]`, `index`, `first_index`) named as the caller knows them: `name(k)` in the
    message, `index(k)` in the details (dropped where None)."""
    message = _RECORD_AT.sub(lambda m: name(int(m[1])), err.message)
    details = {**err.details, "message": message}
    for field_ in ("index", "first_index"):
        k = details.pop(field_, None)
        if type(k) is int and index(k) is not None:
            details[field_] = index(k)
    return VQError(err.status, err.code, message, details, retriable=err.retriable)


def decode_record(raw: dict[str, Any]) -> Record:
    value = raw.get("value")
    b64 = raw.get("encoding") == "base64"
    headers = raw.get("headers") or {}
    if b64:
        headers = {k: base64.b64decode(v).decode("utf-8", "replace") if v is not None else ""
                   for k, v in headers.items()}
    data = None if value is None else (base64.b64decode(value) if b64 else value.encode())
    return Record(raw["offset"], raw["timestamp"], data, headers)


def error_from(status: int, body: Any, reason: str = "") -> VQError:
    """The VQError a node's error answer (`{"error": {...}}`) stands for."""
    err = body.get("error", {}) if isinstance(body, dict) else {}
    return VQError(status, err.get("code", "http_error"), err.get("message", reason), err,
                   retriable=err.get("retriable") is True)
