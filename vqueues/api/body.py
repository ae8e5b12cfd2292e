"""Request bodies: what a node accepts before any handler looks at a field (docs/api.md,
"Request bodies"). One policy for every route:

- `Content-Type`: `application/json` or `application/<x>+json` (charset UTF-8 if one is named),
  or none at all; anything else is `415 unsupported_media_type`.
- `Content-Encoding`: none, `identity`, `gzip` or `deflate`, decoded here (the server runs with
  aiohttp's own decoding off: its parser would refuse a broken body as plain text before any
  handler runs); another is `415`, a body that does not decode is `400 bad_request`, one that
  decodes to more than `max_body_bytes` is `413`.
- The whole body arrives within `body_timeout_ms`, else `408 request_timeout`.
- JSON: valid UTF-8, nested at most `MAX_JSON_DEPTH` deep, no key twice in one object,
  integers within 64 bits, an object at the top (`400 malformed_json`); fields a route does not
  know are refused. A number with no fractional part is an integer, however written (`5.0`).
"""

from __future__ import annotations

import asyncio
import json
import math
import zlib
from collections.abc import Collection, Iterable
from decimal import Decimal
from typing import Any

import msgspec
from aiohttp import web

from vqueues.api.keys import SETTINGS
from vqueues.errors import BadRequest, PayloadTooLarge, VQError

MAX_JSON_DEPTH = 32  # our deepest body is 4 levels; deeper is an attack on the decoder
_INT_MIN, _INT_END = -(2**63), 2**64  # integers a body may hold: int64 and uint64
DECODED_ENCODINGS = ("identity", "gzip", "deflate")

_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError,
                  RecursionError)


class UnreadableBody(VQError):
    """A body that could not be read to its end: its connection cannot carry another
    request."""


def check_media(request: web.Request) -> None:
    """415 unless the body is JSON (or untyped) in an encoding aiohttp decodes."""
    ctype = request.headers.get("Content-Type")
    if ctype is not None:
        kind = request.content_type  # aiohttp's parse: lower case, without parameters
        charset = request.charset
        if not (kind == "application/json" or (kind.startswith("application/")
                                                and kind.endswith("+json"))) or \
                (charset is not None and charset.lower() not in ("utf-8", "utf8")):
            raise VQError("unsupported_media_type", f"Content-Type {ctype!r} is not accepted: "
                          "send application/json (UTF-8)")
    encoding = request.headers.get("Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in DECODED_ENCODINGS:
        raise VQError("unsupported_media_type", f"Content-Encoding {encoding!r} is not "
                      f"accepted: send one of {', '.join(DECODED_ENCODINGS)}")


async def read_raw(request: web.Request) -> bytes:
    """The body's bytes, decoded from its Content-Encoding, after `check_media` (aiohttp
    enforces client_max_size on what is sent: 413)."""
    check_media(request)
    settings = request.app[SETTINGS]
    timeout_s = settings.body_timeout_ms / 1000
    try:
        if request.content.is_eof():  # all of it came with the headers: nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()
    except TimeoutError:
        raise UnreadableBody("request_timeout", f"the request body did not arrive within "
                      f"{round(timeout_s * 1000)} ms") from None
    except web.HTTPException:
        raise
    except (web.RequestPayloadError, ValueError):  # a broken chunked body, say
        request.content.feed_eof()  # nothing more to read: aiohttp must not try (and log)
        raise UnreadableBody("bad_request", "the request body could not be read "
                             "(its transfer broke off or was malformed)") from None
    coding = (request.headers.get("Content-Encoding") or "identity").strip().lower()
    return raw if coding == "identity" else decompress(raw, coding, settings.max_body_bytes)


def decompress(raw: bytes, coding: str, limit: int) -> bytes:
    """`raw` decoded from gzip or deflate (zlib-wrapped, or bare as some clients send it),
    at most `limit` bytes of it (413 beyond: a small body can inflate a thousandfold)."""
    tries = (16 + zlib.MAX_WBITS,) if coding == "gzip" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for wbits in tries:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(raw, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise PayloadTooLarge("payload_too_large", f"the request body decodes to over "
                                  f"{limit} bytes (max_body_bytes)", max=limit)
        if inflater.eof and not inflater.unused_data:
            return out
    raise BadRequest("bad_request", f"the request body is not valid {coding}")


def colon_escaped(raw: bytes) -> bool:
    """Whether `raw` may hold a colon written as an escape, which a count of colons misses."""
    return b"\\" in raw and (b"\\u003a" in raw or b"\\u003A" in raw)


def shape(body: dict[str, Any]) -> tuple[int, int] | None:
    """A decoded body's keys (in all its objects) and the colons its keys and strings hold,
    for `refuse_duplicate_keys`; None if it nests deeper than MAX_JSON_DEPTH (the body itself
    is the first level). One walk of what the decoder built, far cheaper than a regular
    expression over the raw bytes finding the brackets outside strings."""
    keys = colons = 0
    level: list[Any] = [body]
    depth = 1
    while level:
        if depth > MAX_JSON_DEPTH:
            return None
        below: list[Any] = []
        for value in level:
            if type(value) is dict:
                keys += len(value)
                for key in value:
                    if ":" in key:
                        colons += key.count(":")
                colons += _walk(value.values(), below)
            else:
                colons += _walk(value, below)
        level = below
        depth += 1
    return keys, colons


def _walk(items: Iterable[Any], below: list[Any]) -> int:
    """The colons `items`' strings hold; their objects and arrays go to `below`, an integer
    beyond 64 bits is refused."""
    colons = 0
    for item in items:
        if type(item) is str:
            if ":" in item:
                colons += item.count(":")
        elif type(item) is dict or type(item) is list:
            below.append(item)
        elif type(item) is int and not _INT_MIN <= item < _INT_END:
            _refuse_integer(item)
    return colons


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BadRequest("malformed_json", f"request body has the key {key!r} twice "
                                 "in one object")
            seen.add(key)
    return out


def refuse_duplicate_keys(raw: bytes, keys: int | None = None, string_colons: int = 0) -> None:
    """400 if an object of `raw` (valid JSON, not too deep) names a key twice. When the caller
    knows how many distinct keys it decoded and how many colons its strings hold, a count of
    the colons settles it without a second parse: every other colon separates a key."""
    colons = raw.count(b":")
    if keys is None:
        if colons <= 1:  # one key at most: nothing can repeat
            return
    elif colons == keys + string_colons and not colon_escaped(raw):
        return
    json.loads(raw, object_pairs_hook=_unique)


def _refuse_integer(value: int) -> None:
    raise BadRequest("malformed_json", f"request body holds an integer beyond 64 bits "
                     f"({str(value)[:30]}...)")


def _number(text: str) -> int | float:
    """A JSON number written with a fraction or an exponent: an integer if it has no
    fractional part (`5.0`, `1e3`), as JSON Schema's `integer` reads it (the OpenAPI
    document's integer fields take them), else a float, which no field takes. An integer
    beyond 64 bits (`1e30`) or a number beyond the float range (`1e400`) is refused."""
    number = float(text)
    if math.isinf(number):
        raise ValueError("a number is out of range")
    if not number.is_integer():
        return number
    if not _INT_MIN <= number < _INT_END:
        raise ValueError("an integer is beyond 64 bits")
    return int(Decimal(text))  # exact, where the float may not be (9007199254740993.0)


_decode = msgspec.json.Decoder(float_hook=_number).decode


def decode_object(raw: bytes) -> dict[str, Any]:
    """A JSON object from `raw`, under the rules in the module's docstring."""
    try:
        body = _decode(raw) if raw else None
    except _DECODE_ERRORS as exc:
        raise BadRequest("malformed_json", f"request body is not valid JSON: "
                         f"{_why(exc)}") from None
    if not isinstance(body, dict):
        raise BadRequest("malformed_json", "request body must be a JSON object")
    counted = shape(body)
    if counted is None:
        raise BadRequest("malformed_json", f"request body nests deeper than {MAX_JSON_DEPTH}")
    refuse_duplicate_keys(raw, *counted)
    return body


def _why(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "a string is not UTF-8"
    if isinstance(exc, RecursionError):
        return f"it nests deeper than {MAX_JSON_DEPTH}"
    return str(exc)


def refuse_unknown(body: dict[str, Any], fields: Collection[str], what: str = "") -> None:
    """400 invalid_parameter naming the fields of `body` not in `fields`."""
    unknown = [k for k in body if k not in fields]
    if unknown:
        raise BadRequest("invalid_parameter", f"unknown field(s) {sorted(unknown)}"
                         f"{' in ' + what if what else ''}; known: {sorted(fields)}",
                         unknown=sorted(unknown))


async def read_object(request: web.Request, fields: Collection[str] | None
                      ) -> dict[str, Any]:
    """The request's JSON object, holding only `fields` (None: the caller checks them)."""
    body = decode_object(await read_raw(request))
    if fields is not None:
        refuse_unknown(body, fields)
    return body
