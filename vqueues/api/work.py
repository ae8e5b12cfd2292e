"""The work-queue handlers: consumer settings, lease, complete, retry, extend (docs/work-queues.md).
Each decodes its JSON body, calls one WorkService function, and encodes the result."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vqueues.api import params
from vqueues.api.answers import ENCODINGS, LeasePage, encode_leased, respond
from vqueues.api.body import read_object
from vqueues.api.keys import SETTINGS, WORK
from vqueues.errors import BadRequest
from vqueues.names import validate_name
from vqueues.results import SettleResult
from vqueues.state.tags import check_tag

_SETTINGS_FIELDS = {"mode", "max_attempts", "dead_letter_queue", "visibility_ms", "max_in_flight",
                    "prefix", "durable_grants"}


def _names(request: web.Request) -> tuple[str, str]:
    return (validate_name(request.match_info["queue"], "queue"),
            validate_name(request.match_info["consumer"], "consumer"))


def _encoding(body: dict[str, Any]) -> str:
    encoding = body.get("encoding", "utf8")
    if encoding not in ENCODINGS:
        raise BadRequest("invalid_parameter", "encoding must be utf8 or base64")
    return str(encoding)


def _tag(tag: Any) -> str | None:
    """A tag filter, checked (400 invalid_parameter)."""
    if tag is None:
        return None
    why = check_tag(tag) if isinstance(tag, str) else "a tag is a string"
    if why:
        raise BadRequest("invalid_parameter", f"tag: {why}")
    return str(tag)


LEASE_FIELDS = ("max_records", "wait_ms", "visibility_ms", "encoding", "tag", "complete")
# Tokens a lease may complete: a Worker's finished records of up to ten full leases.
MAX_RIDING_TOKENS = 10_000
SETTLE_FIELDS = {"complete": ("tokens",), "retry": ("tokens", "delay_ms", "reason"),
                 "extend": ("tokens", "visibility_ms")}


async def _optional_body(request: web.Request, fields: tuple[str, ...]) -> dict[str, Any]:
    return await read_object(request, fields) if request.can_read_body else {}


async def put_consumer(request: web.Request) -> web.Response:
    queue, consumer = _names(request)
    body = await read_object(request, _SETTINGS_FIELDS)
    dlq = body.get("dead_letter_queue", False)
    if dlq is not False and dlq is not None and not isinstance(dlq, str):
        raise BadRequest("invalid_parameter", "dead_letter_queue must be a queue name or null")
    mode = body.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise BadRequest("invalid_parameter", "mode must be cursor or lease")
    prefix = body.get("prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise BadRequest("invalid_parameter", "prefix must be a prefix consumer's prefix or null")
    durable = body.get("durable_grants")
    if durable is not None and not isinstance(durable, bool):
        raise BadRequest("invalid_parameter", "durable_grants must be true or false")
    return respond(await request.app[WORK].configure(
        queue, consumer, mode, body.get("max_attempts"), dlq, body.get("visibility_ms"),
        body.get("max_in_flight", False), prefix, durable))


async def get_consumer(request: web.Request) -> web.Response:
    return respond(request.app[WORK].consumer_settings(*_names(request)))


async def lease_request(request: web.Request, fields: tuple[str, ...] = LEASE_FIELDS
                        ) -> tuple[dict[str, Any], str, int, int, int | None]:
    """A lease's body (holding only `fields`), and from it: encoding, max_records, wait_ms,
    visibility_ms."""
    body = await _optional_body(request, fields)
    settings = request.app[SETTINGS]
    encoding = _encoding(body)
    max_records = params.LEASE_MAX_RECORDS.from_body(body, settings)
    wait_ms = params.LEASE_WAIT_MS.from_body(body, settings)
    visibility_ms = params.LEASE_VISIBILITY_MS.from_body(body, settings)
    assert max_records is not None and wait_ms is not None
    return body, encoding, max_records, wait_ms, visibility_ms


async def lease(request: web.Request) -> web.Response:
    queue, consumer = _names(request)
    body, encoding, max_records, wait_ms, visibility_ms = await lease_request(request)
    tag = _tag(body.get("tag"))
    result = await request.app[WORK].lease(queue, consumer, max_records, visibility_ms, wait_ms,
                                           tag, riding_tokens(body.get("complete")))
    return respond(LeasePage(result.partition,
                             [encode_leased(r, encoding) for r in result.records],
                             result.completed, result.refused))


def riding_tokens(tokens: Any) -> list[str] | None:
    """A lease's `complete`: a list of token strings (one that does not parse is refused on
    its own, in the answer), or absent."""
    if tokens is None:
        return None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise BadRequest("invalid_token", "`complete` must be a list of lease tokens")
    if len(tokens) > MAX_RIDING_TOKENS:
        raise BadRequest("limit_out_of_range", f"`complete` holds at most {MAX_RIDING_TOKENS} "
                         "tokens", parameter="complete", min=0, max=MAX_RIDING_TOKENS)
    return tokens


SETTLING = ("complete", "retry", "extend")


async def settle(app: web.Application, kind: str, queue: str, consumer: str,
                 body: dict[str, Any]) -> SettleResult:
    """A complete, retry or extend call from its JSON body (the HTTP route or a stream op)."""
    work = app[WORK]
    tokens = work.parse_tokens(body.get("tokens"))
    if kind == "complete":
        return await work.complete(queue, consumer, tokens)
    if kind == "retry":
        delay_ms = params.RETRY_DELAY_MS.from_body(body, app[SETTINGS])
        assert delay_ms is not None
        return await work.retry(queue, consumer, tokens, delay_ms, body.get("reason"))
    visibility_ms = params.LEASE_VISIBILITY_MS.from_body(body, app[SETTINGS])
    if visibility_ms is None:
        raise BadRequest("invalid_parameter", "extend needs `visibility_ms`")
    return await work.extend(queue, consumer, tokens, visibility_ms)


async def _settle_route(request: web.Request, kind: str) -> web.Response:
    queue, consumer = _names(request)
    body = await read_object(request, SETTLE_FIELDS[kind])
    return respond(await settle(request.app, kind, queue, consumer, body))


async def complete(request: web.Request) -> web.Response:
    return await _settle_route(request, "complete")


async def retry(request: web.Request) -> web.Response:
    return await _settle_route(request, "retry")


async def extend(request: web.Request) -> web.Response:
    return await _settle_route(request, "extend")
