"""HTTP API v1: each handler decodes the request, calls one service function, encodes the answer.

Every error leaves as `{"error": {"code", "message", ...}}` through one middleware.
The limits (body size, batch size, name length, wait time) come from Settings; docs/api.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vqueues import compat
from vqueues.errors import BadRequest, PayloadTooLarge, Unavailable, VQError, WrongNode
from vqueues.names import validate_name
from vqueues.openapi import openapi_document
from vqueues.records import Record
from vqueues.service import QueueService
from vqueues.settings import Settings

log = logging.getLogger(__name__)

SERVICE = web.AppKey("service", QueueService)
SETTINGS = web.AppKey("settings", Settings)
PROXY = web.AppKey("proxy", aiohttp.ClientSession)
FORWARDED = "X-VQ-Forwarded-By"
_HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length",
                "te", "trailer", "upgrade", "proxy-authorization", "proxy-authenticate"}
ENCODINGS = ("utf8", "base64")

_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
               413: "payload_too_large", 415: "unsupported_media_type"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(body, ensure_ascii=False, separators=(",", ":")),
                        status=status, content_type="application/json", headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except VQError as exc:
        headers = None
        if isinstance(exc, Unavailable):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if exc.status >= 500:
            log.warning("request_failed", extra={"path": request.path, "code": exc.code,
                                                 "error": exc.message})
        return _json(exc.to_json(), exc.status, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "http_error")
        message = exc.reason
        if exc.status == 413:
            message = (f"request body exceeds the limit of "
                       f"{request.app[SETTINGS].max_body_bytes} bytes")
        return _json({"error": {"code": code, "message": message}}, exc.status)
    except Exception:
        log.exception("request_crashed", extra={"path": request.path})
        return _json({"error": {"code": "internal", "message": "internal error"}}, 500)


@web.middleware
async def forward_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With --forward: a request for a partition another node owns is proxied to that node,
    once (a forwarded request is never forwarded again)."""
    try:
        return await handler(request)
    except WrongNode as exc:
        owner = exc.details.get("owner")
        if not owner or FORWARDED in request.headers:
            raise
        return await _proxy(request, owner)


async def _proxy(request: web.Request, owner: str) -> web.Response:
    body = await request.read()  # cached by aiohttp if the handler read it already
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
    headers[FORWARDED] = request.app[SETTINGS].effective_node_id
    try:
        async with request.app[PROXY].request(
                request.method, owner + request.rel_url.raw_path_qs, data=body or None,
                headers=headers) as resp:
            payload = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
            out.pop("Content-Type", None)
            return web.Response(body=payload, status=resp.status, headers=out,
                                content_type=resp.content_type)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unavailable("owner_unreachable", f"forwarding to {owner} failed: {exc}",
                          owner=owner) from None


async def _proxy_session(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    timeout = aiohttp.ClientTimeout(total=settings.max_wait_ms / 1000 + 30)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        app[PROXY] = session
        yield


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts and times every request by route template (not by queue name)."""
    started = time.perf_counter()
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "unmatched"
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        metrics = request.app[SERVICE].metrics
        metrics.requests.labels(route, request.method, str(status)).inc()
        metrics.request_seconds.labels(route, request.method).observe(
            time.perf_counter() - started)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[SERVICE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# Decoding helpers -----------------------------------------------------------------------------

async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()  # aiohttp enforces client_max_size (413)
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("malformed_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("malformed_json", "request body must be a JSON object")
    return body


def _int_param(request: web.Request, name: str, default: int | None, lo: int, hi: int
               ) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest("invalid_parameter", f"{name} must be an integer, not {raw!r}") from None
    if not lo <= value <= hi:
        raise BadRequest("limit_out_of_range", f"{name} must be between {lo} and {hi}",
                         parameter=name, min=lo, max=hi)
    return value


def _queue(request: web.Request) -> str:
    return validate_name(request.match_info["queue"], "queue")


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


_RECORD_FIELDS = {"value", "encoding", "headers"}


def _decode_records(body: dict[str, Any], settings: Settings
                    ) -> list[tuple[bytes | None, list[tuple[str, bytes]]]]:
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
        headers = item.get("headers") or {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise BadRequest("invalid_record",
                             f"records[{i}].headers must map strings to strings")
        out.append((value, [(k, v.encode("utf-8")) for k, v in headers.items()]))
    return out


def _encode_bytes(data: bytes, encoding: str) -> tuple[str, str]:
    if encoding == "utf8":
        try:
            return data.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


def _encode_record(rec: Record, encoding: str) -> dict[str, Any]:
    """A record as JSON; a value or header that is not UTF-8 falls back to base64 (marked)."""
    used = encoding
    value = None
    if rec.value is not None:
        value, used = _encode_bytes(rec.value, encoding)
    headers: dict[str, str | None] = {}
    if rec.headers:
        raw = {k: v for k, v in rec.headers}
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
    out: dict[str, Any] = {"offset": rec.offset, "timestamp": rec.timestamp, "value": value,
                           "headers": headers}
    if used != encoding:
        out["encoding"] = used
    return out


# Handlers -------------------------------------------------------------------------------------

async def enqueue(request: web.Request) -> web.Response:
    queue = _queue(request)
    records = _decode_records(await _body(request), request.app[SETTINGS])
    partition, offsets = await request.app[SERVICE].enqueue(queue, records)
    return _json({"partition": partition, "offsets": offsets})


async def read(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    queue = _queue(request)
    consumer = request.query.get("consumer")
    if consumer is not None:
        validate_name(consumer, "consumer")
    offset = _int_param(request, "offset", None, 0, 2**63 - 1)
    limit = _int_param(request, "limit", settings.default_read_limit, 1, settings.max_read_limit)
    wait_ms = _int_param(request, "wait_ms", 0, 0, settings.max_wait_ms)
    encoding = request.query.get("encoding", "utf8")
    if encoding not in ENCODINGS:
        raise BadRequest("invalid_parameter", "encoding must be utf8 or base64")
    assert limit is not None and wait_ms is not None
    result = await request.app[SERVICE].read(queue, consumer, offset, limit, wait_ms)
    return _json({"partition": result.partition,
                  "records": [_encode_record(r, encoding) for r in result.records],
                  "next_offset": result.next_offset})


async def ack(request: web.Request) -> web.Response:
    queue = _queue(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    body = await _body(request)
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise BadRequest("invalid_offset", "`offset` (the next offset to read) must be an integer")
    if offset < 0:
        raise BadRequest("invalid_offset", "`offset` must not be negative")
    allow_rewind = body.get("allow_rewind", False)
    if not isinstance(allow_rewind, bool):
        raise BadRequest("invalid_parameter", "`allow_rewind` must be true or false")
    return _json(await request.app[SERVICE].ack(queue, consumer, offset, allow_rewind))


async def queue_info(request: web.Request) -> web.Response:
    queue = _queue(request)
    service = request.app[SERVICE]
    s = service.queue_stats(queue)
    return _json({
        "queue": s.queue, "partition": service.partition_of(queue), "records": s.records,
        "first_offset": s.first_offset, "last_offset": s.last_offset,
        "consumers": [{"consumer": name, "offset": off, "lag": lag}
                      for name, (off, lag) in s.consumers.items()],
    })


async def list_queues(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    limit = _int_param(request, "limit", 1000, 1, settings.max_list_queues)
    assert limit is not None
    return _json(request.app[SERVICE].list_queues(
        request.query.get("prefix", ""), request.query.get("after"), limit))


async def delete_queue(request: web.Request) -> web.Response:
    return _json(await request.app[SERVICE].delete_queue(_queue(request)))


async def delete_consumer(request: web.Request) -> web.Response:
    queue = _queue(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    return _json(await request.app[SERVICE].delete_consumer(queue, consumer))


async def partitions(request: web.Request) -> web.Response:
    return _json(request.app[SERVICE].partitions_info())


async def healthz(request: web.Request) -> web.Response:
    failure = request.app[SERVICE].ownership.failure
    if failure:
        return _json({"status": "failed", "error": failure}, 500)
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    info = service.partitions_info()
    if service.ownership.ready and not service.ownership.failure:
        return _json({"status": "ready", **info})
    return _json({"status": "not_ready", **info}, 503, {"Retry-After": "1"})


async def openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(request.app[SETTINGS]))


def create_app(service: QueueService, settings: Settings) -> web.Application:
    """The aiohttp application of one node."""
    middlewares = [metrics_middleware, error_middleware]
    if settings.forward:
        middlewares.append(forward_middleware)
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SERVICE] = service
    app[SETTINGS] = settings
    if settings.forward:
        app.cleanup_ctx.append(_proxy_session)
    q = "/v1/queues/{queue:[^/]+}"
    app.router.add_post(f"{q}/records", enqueue)
    app.router.add_get(f"{q}/records", read)
    app.router.add_post(q + "/consumers/{consumer:[^/]+}/ack", ack)
    app.router.add_delete(q + "/consumers/{consumer:[^/]+}", delete_consumer)
    app.router.add_get(q, queue_info)
    app.router.add_delete(q, delete_queue)
    app.router.add_get("/v1/queues", list_queues)
    app.router.add_get("/v1/partitions", partitions)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_routes(compat.routes(SERVICE, SETTINGS, _body))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
