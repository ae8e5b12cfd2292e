"""The wire form of answers: records and pages as JSON (msgspec encodes the service's typed
results directly, and the OpenAPI document takes its schemas from these types)."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from aiohttp import web

from vqueues.records import Record
from vqueues.results import LeasedRecord, PrefixRefusedToken, PrefixToken, RefusedToken

ENCODINGS = ("utf8", "base64")
_encoder = msgspec.json.Encoder()


class RecordOut(msgspec.Struct, omit_defaults=True):
    """A record as a read returns it; `encoding` only when it differs from the one asked for."""

    offset: int
    timestamp: int
    value: str | None
    headers: dict[str, str | None]
    encoding: str | None = None


class LeasedOut(msgspec.Struct, omit_defaults=True):
    """A leased record: the record, and the lease it is held under."""

    offset: int
    timestamp: int
    value: str | None
    headers: dict[str, str | None]
    token: str
    attempt: int
    deadline: int
    encoding: str | None = None


class LeasePage(msgspec.Struct, omit_defaults=True):
    partition: int
    records: list[LeasedOut]
    # With `complete` in the request: what each of its tokens did (ADR 16).
    completed: list[str] | None = None
    refused: list[RefusedToken] | None = None


def encode_leased(leased: LeasedRecord, encoding: str) -> LeasedOut:
    rec = leased.record
    if encoding == "utf8" and not rec.headers and rec.value is not None:
        try:  # the usual record: a UTF-8 value and no headers
            return LeasedOut(rec.offset, rec.timestamp, rec.value.decode("utf-8"), {},
                             leased.token, leased.attempt, leased.deadline)
        except UnicodeDecodeError:
            pass
    out = encode_record(rec, encoding)
    return LeasedOut(out.offset, out.timestamp, out.value, out.headers, leased.token,
                     leased.attempt, leased.deadline, out.encoding)


class PrefixLeasedOut(LeasedOut, kw_only=True):
    """A record a prefix lease handed out: the leased record, and its queue and partition."""

    queue: str
    partition: int


class PrefixLeasePage(msgspec.Struct, omit_defaults=True):
    consumer: str
    records: list[PrefixLeasedOut]
    # With `complete` in the request: what each of its tokens did (ADR 16).
    completed: list[PrefixToken] | None = None
    refused: list[PrefixRefusedToken] | None = None


def encode_prefix_leased(queue: str, partition: int, leased: LeasedRecord, encoding: str
                         ) -> PrefixLeasedOut:
    rec = leased.record
    if encoding == "utf8" and not rec.headers and rec.value is not None:
        try:  # the usual record, as `encode_leased`, without a LeasedOut in between
            return PrefixLeasedOut(offset=rec.offset, timestamp=rec.timestamp,
                                   value=rec.value.decode("utf-8"), headers={},
                                   token=leased.token, attempt=leased.attempt,
                                   deadline=leased.deadline, queue=queue, partition=partition)
        except UnicodeDecodeError:
            pass
    out = encode_leased(leased, encoding)
    return PrefixLeasedOut(offset=out.offset, timestamp=out.timestamp, value=out.value,
                           headers=out.headers, token=out.token, attempt=out.attempt,
                           deadline=out.deadline, encoding=out.encoding, queue=queue,
                           partition=partition)


class ReadPage(msgspec.Struct):
    partition: int
    records: list[RecordOut]
    next_offset: int


def respond(body: Any, status: int = 200, headers: dict[str, str] | None = None
            ) -> web.Response:
    """A JSON answer; `body` may be a typed result, a msgspec Struct or plain data."""
    return web.Response(body=_encoder.encode(body), status=status,
                        content_type="application/json", headers=headers)


def _encode_bytes(data: bytes, encoding: str) -> tuple[str, str]:
    if encoding == "utf8":
        try:
            return data.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


def encode_record(rec: Record, encoding: str) -> RecordOut:
    """A record on the wire; a value or header that is not UTF-8 falls back to base64 (marked)."""
    used = encoding
    value = None
    if rec.value is not None:
        value, used = _encode_bytes(rec.value, encoding)
    headers: dict[str, str | None] = {}
    if rec.headers:
        raw = dict(rec.headers)
        if used == "utf8":
            try:
                headers = {k: (v.decode("utf-8") if v is not None else None)
                           for k, v in raw.items()}
            except UnicodeDecodeError:
                used = "base64"
                if rec.value is not None:
                    value = base64.b64encode(rec.value).decode("ascii")
        if used == "base64":
            headers = {k: (base64.b64encode(v).decode("ascii") if v is not None else None)
                       for k, v in raw.items()}
    return RecordOut(rec.offset, rec.timestamp, value, headers,
                     used if used != encoding else None)
