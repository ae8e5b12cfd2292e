"""VirtualQueues compatibility: `POST /get_partitions`, `/get_records`, `/consumer_ack`.

Request fields are the original's (`Queue`, `Consumer`, `Offset`, `MaxRecords`, `AllowRewind`),
matched case-insensitively; answers have its shapes. The semantics are those its README
intends, not its bugs; docs/virtualqueues-compat.md lists the differences.
"""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from vqueues.api.body import read_object, refuse_unknown
from vqueues.api.keys import SERVICE, SETTINGS
from vqueues.errors import BadRequest
from vqueues.names import validate_name

DEFAULT_MAX_RECORDS = 10  # the original's default


_GET_RECORDS = ("queue", "consumer", "offset", "maxrecords")
_CONSUMER_ACK = ("queue", "consumer", "offset", "allowrewind")


async def _fields(request: web.Request, known: tuple[str, ...]) -> dict[str, Any]:
    """The body's fields by lower-case name (the original matched them so); any other, or one
    named twice in two spellings, is refused."""
    body = await read_object(request, None)
    fields = {k.lower(): v for k, v in body.items()}
    if len(fields) != len(body):
        raise BadRequest("malformed_json", "a field is named twice (names ignore case)")
    refuse_unknown(fields, known)
    return fields


def _int(fields: dict[str, Any], name: str, default: int | None) -> int | None:
    value = fields.get(name.lower())
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("invalid_parameter", f"{name} must be an integer")
    return value


def _name(fields: dict[str, Any], name: str, required: bool) -> str | None:
    value = fields.get(name.lower())
    if value in (None, ""):
        if required:
            raise BadRequest("missing_field", f"{name} is required")
        return None
    if not isinstance(value, str):
        raise BadRequest("invalid_parameter", f"{name} must be a string")
    return validate_name(value, name.lower())


def routes() -> list[web.RouteDef]:
    """The three routes."""

    async def get_partitions(request: web.Request) -> web.Response:
        owners = request.app[SERVICE].ownership.cluster_map.owners
        # The original's map: partition -> "host:port" (its advertise address).
        return web.json_response({str(p): urlsplit(o.url).netloc for p, o in owners.items()})

    async def get_records(request: web.Request) -> web.Response:
        settings = request.app[SETTINGS]
        f = await _fields(request, _GET_RECORDS)
        queue = _name(f, "Queue", True)
        consumer = _name(f, "Consumer", False)
        # Go clients always send Offset, 0 when unset: 0 means "from the consumer's offset".
        offset = _int(f, "Offset", None) or None
        limit = _int(f, "MaxRecords", DEFAULT_MAX_RECORDS) or DEFAULT_MAX_RECORDS
        if not 1 <= limit <= settings.max_read_limit:
            raise BadRequest("limit_out_of_range",
                             f"MaxRecords must be between 1 and {settings.max_read_limit}")
        if offset is not None and offset < 0:
            raise BadRequest("invalid_offset", "Offset must not be negative")
        assert queue is not None
        result = await request.app[SERVICE].read(queue, consumer, offset, limit, 0)
        return web.json_response({"Records": [
            {"o": r.offset, "r": base64.b64encode(r.value or b"").decode("ascii")}
            for r in result.records]})

    async def consumer_ack(request: web.Request) -> web.Response:
        f = await _fields(request, _CONSUMER_ACK)
        queue = _name(f, "Queue", True)
        consumer = _name(f, "Consumer", True)
        offset = _int(f, "Offset", None)
        if offset is None:  # absent or null
            raise BadRequest("missing_field", "Offset is required")
        assert queue is not None and consumer is not None
        if offset < 0:
            raise BadRequest("invalid_offset", "Offset must not be negative")
        rewind = f.get("allowrewind", False)
        if not isinstance(rewind, bool):
            raise BadRequest("invalid_parameter", "AllowRewind must be true or false")
        await request.app[SERVICE].ack(queue, consumer, offset, rewind)
        return web.Response(status=200)

    return [web.post("/get_partitions", get_partitions), web.post("/get_records", get_records),
            web.post("/consumer_ack", consumer_ack)]
