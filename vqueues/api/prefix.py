"""The prefix-consumer handlers: define, show and delete a prefix consumer; lease across its
queues; complete, retry and extend tokens of many queues (docs/work-queues.md, ADR 13)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vqueues.api import params
from vqueues.api.answers import PrefixLeasePage, encode_prefix_leased, respond
from vqueues.api.body import read_object, refuse_unknown
from vqueues.api.keys import AUTH, IDENTITY, PREFIX, SETTINGS, WORK
from vqueues.api.work import LEASE_FIELDS, MAX_RIDING_TOKENS, SETTLE_FIELDS, lease_request
from vqueues.errors import BadRequest, VQError
from vqueues.names import validate_name
from vqueues.state import prefix_consumers
from vqueues.work.work_service import COMPLETE, EXTEND, RETRY, Settle


def _consumer(request: web.Request) -> str:
    return validate_name(request.match_info["consumer"], "consumer")


async def list_prefix_consumers(request: web.Request) -> web.Response:
    return respond({"prefix_consumers": request.app[PREFIX].infos()})


async def get_prefix_consumer(request: web.Request) -> web.Response:
    return respond(request.app[PREFIX].info(_consumer(request)))


async def put_prefix_consumer(request: web.Request) -> web.Response:
    consumer = _consumer(request)
    body = await read_object(request, prefix_consumers.FIELDS)
    identity = request.get(IDENTITY)
    prefix = body.get("prefix")
    if AUTH in request.app and identity is not None and isinstance(prefix, str) and \
            not identity.allows("admin", prefix):
        raise VQError("forbidden", f"token {identity.name!r} has no 'admin' scope on queue "
                      f"{prefix!r}", scope="admin")
    return respond(await request.app[PREFIX].define(consumer, body))


async def delete_prefix_consumer(request: web.Request) -> web.Response:
    return respond(await request.app[PREFIX].delete(_consumer(request)))


async def lease(request: web.Request) -> web.Response:
    consumer = _consumer(request)
    body, encoding, max_records, wait_ms, visibility_ms = await lease_request(
        request, tuple(f for f in LEASE_FIELDS if f != "tag"))
    complete = body.get("complete")
    pairs = None
    if complete is not None:
        if not isinstance(complete, list):
            raise BadRequest("invalid_token", "`complete` must be a list of "
                             '{"queue": ..., "token": ...} objects')
        if len(complete) > MAX_RIDING_TOKENS:
            raise BadRequest("limit_out_of_range", f"`complete` holds at most "
                             f"{MAX_RIDING_TOKENS} tokens", parameter="complete", min=0,
                             max=MAX_RIDING_TOKENS)
        pairs = _pairs(complete) if complete else []
    result = await request.app[PREFIX].lease(consumer, max_records, visibility_ms, wait_ms,
                                             pairs)
    return respond(PrefixLeasePage(consumer, [
        encode_prefix_leased(r.queue, r.partition, r.leased, encoding) for r in result.records],
        result.completed, result.refused))


def _pairs(raw: Any) -> list[tuple[str, str]]:
    """`tokens` of a prefix settle: [{"queue": q, "token": t}, ...], checked (400)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("invalid_token", "`tokens` must be a non-empty list of "
                         '{"queue": ..., "token": ...} objects')
    out = []
    named = None  # the last queue name checked: a call's tokens come queue by queue
    for item in raw:  # the usual item, checked inline: a function call per item costs more
        if type(item) is dict and len(item) == 2:
            queue, token = item.get("queue"), item.get("token")
            if type(queue) is str and type(token) is str:
                if queue != named:
                    named = validate_name(queue, "queue")
                out.append((queue, token))
                continue
        return _checked_pairs(raw)
    return out


def _checked_pairs(raw: list[Any]) -> list[tuple[str, str]]:
    """`_pairs` item by item, naming what is wrong."""
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("queue"), str) or \
                not isinstance(item.get("token"), str):
            raise BadRequest("invalid_token", "each of `tokens` must be an object with a "
                             "string `queue` and a string `token`")
        refuse_unknown(item, ("queue", "token"), "tokens")
        out.append((validate_name(item["queue"], "queue"), item["token"]))
    return out


async def _settle(request: web.Request, kind: str) -> web.Response:
    consumer = _consumer(request)
    body = await read_object(request, SETTLE_FIELDS[kind])
    pairs = _pairs(body.get("tokens"))
    work = request.app[WORK]
    settings = request.app[SETTINGS]
    if kind == RETRY:
        delay_ms = params.RETRY_DELAY_MS.from_body(body, settings)
        assert delay_ms is not None
        how = Settle(RETRY, delay_ms, work.check_retry(delay_ms, body.get("reason")))
    elif kind == EXTEND:
        visibility_ms = params.LEASE_VISIBILITY_MS.from_body(body, settings)
        if visibility_ms is None:
            raise BadRequest("invalid_parameter", "extend needs `visibility_ms`")
        how = Settle(EXTEND, work.check_visibility(visibility_ms))
    else:
        how = Settle(COMPLETE)
    return respond(await request.app[PREFIX].settle(consumer, how, pairs))


async def complete(request: web.Request) -> web.Response:
    return await _settle(request, COMPLETE)


async def retry(request: web.Request) -> web.Response:
    return await _settle(request, RETRY)


async def extend(request: web.Request) -> web.Response:
    return await _settle(request, EXTEND)
