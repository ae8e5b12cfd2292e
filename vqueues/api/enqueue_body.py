"""The enqueue body's decoding: a request's records (values, headers, idempotency keys, tags,
due times) into the service's new records, refusing what is malformed with its error."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import astuple

from vqueues.api.answers import ENCODINGS
from vqueues.api.body import colon_escaped, decode_object, refuse_duplicate_keys, refuse_unknown
from vqueues.errors import BadRequest, PayloadTooLarge
from vqueues.records import NewRecord, now_ms
from vqueues.settings import Settings
from vqueues.state.idempotency import (
    KEY_HEADER,
    MAX_KEY_BYTES,
    PAYLOAD_HEADER,
    payload_header,
    sent_fingerprint,
)
from vqueues.state.schedule import CANCEL_HEADER, DELIVER_AT_HEADER, FROM_HEADER
from vqueues.state.tags import MAX_TAGS, TAGS_HEADER, check_tag

_RECORD_FIELDS = {"value", "encoding", "headers", "idempotency_key", "tags", "deliver_at",
                  "delay_ms"}


def _decode_value(value: Any, encoding: str, i: int) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("invalid_record", f"records[{i}].value must be a string or null")
    if encoding == "utf8":
        return value.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("invalid_record", f"records[{i}].value is not valid base64") from None


# An int64 (msgspec bounds no wider): any other integer goes the slow way, whose decoding
# refuses one beyond 64 bits (api/body.py).
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _InRecord(msgspec.Struct, forbid_unknown_fields=True):
    """A record as sent; UNSET tells a field left out from one sent as null (the duplicate-key
    check counts the keys sent)."""

    value: str | None
    encoding: str | UnsetType = UNSET
    headers: dict[str, str] | UnsetType = UNSET
    idempotency_key: str | UnsetType | None = UNSET
    tags: list[str] | UnsetType | None = UNSET
    deliver_at: _Int64 | UnsetType | None = UNSET
    delay_ms: _Int64 | UnsetType | None = UNSET


def _record_headers(value: bytes | None, headers: dict[str, str], tags: Any, deliver_at: Any,
                    delay_ms: Any, key: Any, i: int, settings: Settings
                    ) -> list[tuple[str, bytes]]:
    """A record's Kafka headers: the user's, then its tags, due time and idempotency key, which
    travel as headers (both decoding paths use this one). A keyed scheduled record also
    carries the fingerprint of what was sent (the schedule as given, not the due time derived
    from it), so that a retry compares the same thing before and after its due time."""
    out = [(k, v.encode("utf-8")) for k, v in headers.items()]
    if tags is not None:
        out = _with_tags(out, tags, i)
    if deliver_at is None and delay_ms is None:
        return _with_key(out, key, i)
    sent = out
    out = _with_key(_with_schedule(out, deliver_at, delay_ms, i, settings), key, i)
    if key is None:
        return out
    schedule = ("deliver_at", deliver_at) if deliver_at is not None else ("delay_ms", delay_ms)
    return [*out, payload_header(sent_fingerprint(value, sent, schedule))]


def _with_schedule(headers: list[tuple[str, bytes]], deliver_at: Any, delay_ms: Any, i: int,
                   settings: Settings) -> list[tuple[str, bytes]]:
    """The record's headers with its due time, if it is due later than now (a due time in the
    past is delivered at once: no header)."""
    if deliver_at is None and delay_ms is None:
        return headers
    if deliver_at is not None and delay_ms is not None:
        raise BadRequest("invalid_record", f"records[{i}]: give deliver_at or delay_ms, not both")
    given = deliver_at if deliver_at is not None else delay_ms
    name = "deliver_at" if deliver_at is not None else "delay_ms"
    if isinstance(given, bool) or not isinstance(given, int):
        raise BadRequest("invalid_record", f"records[{i}].{name} must be an integer")
    now = now_ms()
    hi = settings.max_schedule_delay_ms
    if delay_ms is not None and delay_ms < 0:
        raise BadRequest("limit_out_of_range", f"records[{i}].delay_ms must be between 0 and "
                         f"{hi}", parameter="delay_ms", min=0, max=hi)
    due = deliver_at if deliver_at is not None else now + delay_ms
    if due - now > hi:
        raise BadRequest("limit_out_of_range", f"records[{i}] is due {due - now} ms from now; "
                         f"at most {hi} (max_schedule_delay_ms)", parameter=name, min=0, max=hi)
    headers = [(k, v) for k, v in headers if k not in (DELIVER_AT_HEADER, FROM_HEADER,
                                                       CANCEL_HEADER)]
    if due <= now:
        return headers
    return [*headers, (DELIVER_AT_HEADER, str(due).encode())]


def _with_tags(headers: list[tuple[str, bytes]], tags: Any, i: int) -> list[tuple[str, bytes]]:
    """The record's headers with its tags (which travel in the vq-tags header)."""
    if tags is None:
        return headers
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise BadRequest("invalid_record", f"records[{i}].tags must be a list of strings")
    if len(tags) > MAX_TAGS:
        raise BadRequest("invalid_record", f"records[{i}] has more than {MAX_TAGS} tags",
                         max=MAX_TAGS)
    for tag in tags:
        why = check_tag(tag)
        if why:
            raise BadRequest("invalid_record", f"records[{i}].tags: {why}")
    return [(k, v) for k, v in headers if k != TAGS_HEADER] + [
        (TAGS_HEADER, ",".join(tags).encode("utf-8", "surrogatepass"))]


def _with_key(headers: list[tuple[str, bytes]], key: Any, i: int) -> list[tuple[str, bytes]]:
    """The record's headers with its idempotency key (which travels as a header)."""
    if key is None:
        return headers
    if not isinstance(key, str) or not key:
        raise BadRequest("invalid_record", f"records[{i}].idempotency_key must be a non-empty "
                         "string")
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_KEY_BYTES:
        raise BadRequest("invalid_record", f"records[{i}].idempotency_key is over "
                         f"{MAX_KEY_BYTES} bytes", max=MAX_KEY_BYTES)
    if not headers:
        return [(KEY_HEADER, raw)]
    return [(k, v) for k, v in headers if k not in (KEY_HEADER, PAYLOAD_HEADER)] + [
        (KEY_HEADER, raw)]


class _EnqueueBody(msgspec.Struct, forbid_unknown_fields=True):
    records: list[_InRecord]


_decode_enqueue = msgspec.json.Decoder(_EnqueueBody).decode


def decode_enqueue(raw: bytes, settings: Settings) -> list[NewRecord]:
    """An enqueue request's records. Well-formed bodies are decoded and typed in one pass by
    msgspec; anything it refuses goes through `decode_records`, which names the problem with
    its registry code."""
    try:
        items = _decode_enqueue(raw).records
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        items = []
    if not items or len(items) > settings.max_batch_records:
        return decode_records(decode_object(raw), settings)
    values = [item.value for item in items]
    colons = "".join(filter(None, values)).count(":")
    if raw.count(b":") == 1 + len(items) + colons and not colon_escaped(raw):
        # Every colon is in a string, after "records" or after a record's "value": each record
        # holds nothing but its value (the usual record), and no key is named twice.
        return _values_only(values, settings.max_record_bytes)
    return _records(raw, items, colons, settings)


_OPTIONAL = len(_InRecord.__struct_fields__) - 1  # every field but `value`


def _values_only(values: list[str | None], limit: int) -> list[NewRecord]:
    out: list[NewRecord] = []
    for i, value in enumerate(values):
        data = value.encode("utf-8", "surrogatepass") if value is not None else None
        if data is not None and len(data) > limit:
            raise PayloadTooLarge("record_too_large", f"records[{i}] is {len(data)} bytes; "
                                  f"at most {limit}", max=limit)
        out.append((data, []))
    return out


def _records(raw: bytes, items: list[_InRecord], colons: int, settings: Settings
             ) -> list[NewRecord]:
    """Records with more than a value: each field checked, and the keys counted so that a key
    named twice is found (`colons`: those in the values)."""
    out: list[NewRecord] = []
    limit = settings.max_record_bytes
    keys = 1 + len(items)  # "records", and each record's "value"
    for i, item in enumerate(items):
        value = item.value
        encoding = item.encoding if item.encoding is not UNSET else "utf8"
        if encoding == "utf8" and value is not None:
            data: bytes | None = value.encode("utf-8", "surrogatepass")
        elif encoding in ENCODINGS:
            data = _decode_value(value, encoding, i)
        else:
            raise BadRequest("invalid_record", f"records[{i}].encoding must be utf8 or base64")
        if data is not None and len(data) > limit:
            raise PayloadTooLarge("record_too_large", f"records[{i}] is {len(data)} bytes; "
                                  f"at most {limit}", max=limit)
        unset = astuple(item).count(UNSET)
        keys += _OPTIONAL - unset
        key = item.idempotency_key
        if unset == _OPTIONAL:
            out.append((data, []))  # nothing but a value
            continue
        if unset == _OPTIONAL - 1 and key is not UNSET:  # a value and a key: the keyed enqueue
            if key is None:
                out.append((data, []))
            else:
                colons += key.count(":")
                out.append((data, _with_key([], key, i)))
            continue
        headers = item.headers if item.headers is not UNSET else {}
        tags = item.tags if item.tags is not UNSET else None
        deliver_at = item.deliver_at if item.deliver_at is not UNSET else None
        delay_ms = item.delay_ms if item.delay_ms is not UNSET else None
        if key is UNSET:
            key = None
        elif key:
            colons += key.count(":")
        if headers or tags is not None or deliver_at is not None or delay_ms is not None:
            keys += len(headers)
            colons += "".join(headers).count(":") + "".join(headers.values()).count(":")
            colons += "".join(tags).count(":") if tags else 0
            out.append((data, _record_headers(data, headers, tags, deliver_at, delay_ms, key, i,
                                              settings)))
        elif key is not None:  # a key and a value: the keyed enqueue
            out.append((data, _with_key([], key, i)))
        else:
            out.append((data, []))
    refuse_duplicate_keys(raw, keys, colons)
    return out


def decode_records(body: dict[str, Any], settings: Settings) -> list[NewRecord]:
    """An enqueue body's records, validated against the settings' limits."""
    refuse_unknown(body, ("records",))
    items = body.get("records")
    if not isinstance(items, list) or not items:
        raise BadRequest("invalid_records", "body must have a non-empty array `records`")
    if len(items) > settings.max_batch_records:
        raise BadRequest("too_many_records", f"at most {settings.max_batch_records} records "
                         f"per request, got {len(items)}", max=settings.max_batch_records)
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "value" not in item:
            raise BadRequest("invalid_record", f"records[{i}] must be an object with `value`")
        unknown = set(item) - _RECORD_FIELDS
        if unknown:
            raise BadRequest("invalid_record", f"records[{i}] has unknown fields {sorted(unknown)}")
        encoding = item.get("encoding", "utf8")
        if encoding not in ENCODINGS:
            raise BadRequest("invalid_record", f"records[{i}].encoding must be utf8 or base64")
        value = _decode_value(item["value"], encoding, i)
        if value is not None and len(value) > settings.max_record_bytes:
            raise PayloadTooLarge("record_too_large", f"records[{i}] is {len(value)} bytes; "
                                  f"at most {settings.max_record_bytes}",
                                  max=settings.max_record_bytes)
        headers = item.get("headers")
        if headers is None:
            headers = {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise BadRequest("invalid_record",
                             f"records[{i}].headers must map strings to strings")
        out.append((value, _record_headers(value, headers, item.get("tags"),
                                           item.get("deliver_at"), item.get("delay_ms"),
                                           item.get("idempotency_key"), i, settings)))
    return out
