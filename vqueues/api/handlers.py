"""The v1 handlers: each decodes the request, calls one service function, encodes the result."""

from __future__ import annotations

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vqueues.api import params
from vqueues.api.answers import ENCODINGS, ReadPage, encode_record, respond
from vqueues.api.body import read_object, read_raw
from vqueues.api.enqueue_body import decode_enqueue
from vqueues.api.keys import SERVICE, SETTINGS
from vqueues.api.multi import quota_refusal
from vqueues.api.openapi import openapi_document
from vqueues.errors import BadRequest
from vqueues.names import validate_name
from vqueues.ownership import node_status
from vqueues.state.tags import check_tag


def _queue(request: web.Request) -> str:
    return validate_name(request.match_info["queue"], "queue")


def _consumer(request: web.Request) -> str:
    return validate_name(request.match_info["consumer"], "consumer")


async def enqueue(request: web.Request) -> web.Response:
    queue = _queue(request)
    records = decode_enqueue(await read_raw(request), request.app[SETTINGS])
    refused = quota_refusal(request, queue, records)
    if refused is not None:
        raise refused
    return respond(await request.app[SERVICE].enqueue(queue, records))


async def read(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    queue = _queue(request)
    consumer = request.query.get("consumer")
    if consumer is not None:
        validate_name(consumer, "consumer")
    offset = params.READ_OFFSET.parse(request.query, settings)
    limit = params.READ_LIMIT.require(request.query, settings)
    wait_ms = params.READ_WAIT_MS.require(request.query, settings)
    encoding = request.query.get("encoding", "utf8")
    if encoding not in ENCODINGS:
        raise BadRequest("invalid_parameter", "encoding must be utf8 or base64")
    tag = request.query.get("tag")
    if tag is not None:
        why = check_tag(tag)
        if why:
            raise BadRequest("invalid_parameter", f"tag: {why}")
    result = await request.app[SERVICE].read(queue, consumer, offset, limit, wait_ms, tag)
    return respond(ReadPage(result.partition,
                            [encode_record(r, encoding) for r in result.records],
                            result.next_offset))


async def ack(request: web.Request) -> web.Response:
    queue = _queue(request)
    consumer = _consumer(request)
    body = await read_object(request, ("offset", "allow_rewind"))
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise BadRequest("invalid_offset", "`offset` (the next offset to read) must be an integer")
    if offset < 0:
        raise BadRequest("invalid_offset", "`offset` must not be negative")
    allow_rewind = body.get("allow_rewind", False)
    if not isinstance(allow_rewind, bool):
        raise BadRequest("invalid_parameter", "`allow_rewind` must be true or false")
    return respond(await request.app[SERVICE].ack(queue, consumer, offset, allow_rewind))


async def cancel_scheduled(request: web.Request) -> web.Response:
    queue = _queue(request)
    raw = request.match_info["id"]
    if not raw.isdigit():
        raise BadRequest("invalid_parameter", "a scheduled record's id is its offset (an integer)")
    return respond(await request.app[SERVICE].cancel_scheduled(queue, int(raw)))


async def queue_info(request: web.Request) -> web.Response:
    return respond(request.app[SERVICE].queue_info(_queue(request)))


async def list_queues(request: web.Request) -> web.Response:
    limit = params.LIST_LIMIT.require(request.query, request.app[SETTINGS])
    stats = request.query.get("stats", "false")
    if stats not in ("true", "false"):
        raise BadRequest("invalid_parameter", "stats must be true or false")
    page = request.app[SERVICE].list_queues(
        request.query.get("prefix", ""), request.query.get("after"), limit, stats == "true")
    if page.stats is None:  # `stats` appears only when asked for
        return respond({"queues": page.queues, "next_after": page.next_after})
    return respond(page)


async def delete_queue(request: web.Request) -> web.Response:
    return respond(await request.app[SERVICE].delete_queue(_queue(request)))


async def delete_consumer(request: web.Request) -> web.Response:
    queue = _queue(request)
    return respond(await request.app[SERVICE].delete_consumer(queue, _consumer(request)))


async def partitions(request: web.Request) -> web.Response:
    return respond(node_status.partitions_info(request.app[SERVICE].ownership,
                                           request.app[SETTINGS]))


async def healthz(request: web.Request) -> web.Response:
    failure = request.app[SERVICE].ownership.failure
    if failure:
        return respond({"status": "failed", "error": failure}, 500)
    return respond({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    info = msgspec.to_builtins(node_status.partitions_info(service.ownership,
                                                         request.app[SETTINGS]))
    if service.ownership.ready and not service.ownership.failure:
        return respond({"status": "ready", **info})
    return respond({"status": "not_ready", **info}, 503, {"Retry-After": "1"})


async def openapi(request: web.Request) -> web.Response:
    return respond(openapi_document(request.app[SETTINGS]))


async def metrics(request: web.Request) -> web.Response:
    """Every metric, or with `name[]` (repeated) only those samples, as Prometheus' own
    exposition does."""
    registry = request.app[SERVICE].metrics.registry
    names = request.query.getall("name[]", [])
    body = generate_latest(registry.restricted_registry(names) if names else registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
