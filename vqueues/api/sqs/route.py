"""The SQS route: POST `/` and POST `/{account}/{queue}` (SDKs post to the endpoint, the
query protocol to the queue URL), and GET on both for the query protocol. It reads and decodes
its own body (the native routes' content-type, body and Bearer checks do not apply to it): AWS
JSON 1.0, or the query protocol's form parameters translated to the same input (query.py),
answered in the caller's protocol. Every error is in SQS's shapes (protocol.py), the
self-fence's too. A call for a queue another node owns is sent on to that node unchanged;
while a partition has no ready owner the call is held and tried again, rather than answered
with an error an SDK gives up on after a few retries."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from urllib.parse import parse_qsl

from aiohttp import web

from vqueues.api.keys import AUTH, SERVICE, SETTINGS, SQS_KEYS
from vqueues.api.proxy import FORWARDED, proxy
from vqueues.api.sqs.actions import (
    ACTIONS,
    FENCED,
    UNSUPPORTED,
    Action,
    Call,
    required_scope,
)
from vqueues.api.sqs.paths import ANSWER_JSON, FORWARDED_HOST, FORWARDED_PROTO, SQS_PATHS
from vqueues.api.sqs.protocol import (
    FORM_TYPE,
    JSON_TYPE,
    TARGET_PREFIX,
    SqsError,
    decode_json,
    json_answer,
    json_error,
    new_id,
    xml_error,
)
from vqueues.api.sqs.query import decode, xml_answer
from vqueues.api.sqs.signatures import verify
from vqueues.errors import NotFound, Unavailable, VQError, WrongNode

log = logging.getLogger(__name__)

# What says a partition is between owners (or its new owner is replaying it): held for.
_CHANGING_OWNER = ("partition_unavailable", "partition_replaying")
# ... and an owner that does not answer (it may have died: the map moves on), or a map that
# names no owner yet.
_HELD = (*_CHANGING_OWNER, "owner_unreachable", "wrong_node")
HOLD_RETRY_S = 0.2
# Parameters a query-protocol call may hold (its query string and form body together): SQS's
# largest call, a batch of 10 entries with 10 message attributes each, holds about 500. The
# bound keeps the parsing, which runs before the signature is checked, short on the loop.
MAX_QUERY_PARAMETERS = 2000


def routes() -> list[web.RouteDef]:
    return [*(web.post(path, handle) for path in SQS_PATHS),
            *(web.get(path, handle, allow_head=False) for path in SQS_PATHS)]


def endpoint(request: web.Request) -> str:
    """What queue URLs start with: the setting; or the scheme and Host the caller used (for
    a call another node sent on, the ones that node was called with)."""
    configured = request.app[SETTINGS].sqs_endpoint_url
    if configured:
        return configured.rstrip("/")
    if FORWARDED in request.headers and FORWARDED_HOST in request.headers:
        scheme = request.headers.get(FORWARDED_PROTO, request.scheme)
        return f"{scheme}://{request.headers[FORWARDED_HOST]}"
    return f"{request.scheme}://{request.host}"


def hold_s(request: web.Request) -> float:
    """How long a call is held while its partition changes owner: a session timeout (a dead
    node's partitions move then) and ten seconds to take them over."""
    return request.app[SETTINGS].session_timeout_ms / 1000 + 10


def _is_query(request: web.Request) -> bool:
    """Whether the call is in the query protocol: a form body, or a GET."""
    return request.method == "GET" or request.content_type == FORM_TYPE


async def handle(request: web.Request) -> web.StreamResponse:
    request_id = new_id()
    query = _is_query(request)
    try:
        name, action, body = await (_decode_query(request) if query else _decode(request))
        deadline = time.monotonic() + hold_s(request)
        # A node listing queues asks another for its own in JSON (actions._peer_names).
        xml = query and not (FORWARDED in request.headers and ANSWER_JSON in request.headers)
        while True:
            try:
                return await _answer(request, name, action, body, request_id, xml)
            except (WrongNode, Unavailable) as exc:
                # A node a call was sent on to answers at once: the sender holds it.
                forwarded = FORWARDED in request.headers and isinstance(exc, WrongNode)
                if exc.code not in _HELD or forwarded or time.monotonic() >= deadline:
                    raise _sqs_error(exc) from None
            await asyncio.sleep(HOLD_RETRY_S)
    except SqsError as exc:
        return xml_error(exc, request_id) if query else json_error(exc, request_id)


async def _answer(request: web.Request, name: str, action: Action, body: dict[str, object],
                  request_id: str, xml: bool) -> web.Response:
    """The action's answer here (in the query protocol's XML if `xml`), or the owner's if
    another node owns the queue."""
    try:
        output = await _act(request, name, action, body)
        return xml_answer(name, output, request_id) if xml else json_answer(output, request_id)
    except WrongNode as exc:
        owner = exc.details.get("owner")
        if not owner or FORWARDED in request.headers:
            raise
        answer = await proxy(request, str(owner), {FORWARDED_HOST: request.host,
                                                   FORWARDED_PROTO: request.scheme})
        if answer.status == 503:  # that node no longer owns it, or cannot serve it yet
            raise Unavailable("owner_unreachable", f"{owner} could not serve the call now",
                              owner=owner) from None
        return answer


async def _decode(request: web.Request) -> tuple[str, Action, dict[str, object]]:
    target = request.headers.get("X-Amz-Target", "")
    if request.content_type != JSON_TYPE or not target.startswith(TARGET_PREFIX):
        raise SqsError("InvalidAction", f"an SQS call is a POST of {JSON_TYPE} with the "
                       "header X-Amz-Target: AmazonSQS.<Action>")
    name = target[len(TARGET_PREFIX):]
    action = _action(name)
    raw = await _read(request)
    body = decode_json(raw)
    if AUTH in request.app:
        _authorize(request, name, body, raw)
    return name, action, body


async def _decode_query(request: web.Request) -> tuple[str, Action, dict[str, object]]:
    """A query-protocol call: its parameters from the query string and, POSTed, the form
    body, translated to the JSON action's input."""
    raw = await _read(request) if request.method == "POST" else b""
    query = request.rel_url.raw_query_string
    if raw.count(b"&") + query.count("&") + 2 > MAX_QUERY_PARAMETERS:
        raise SqsError("InvalidParameterValue", "a query-protocol call holds at most "
                       f"{MAX_QUERY_PARAMETERS} parameters")
    try:
        params = parse_qsl(query, keep_blank_values=True,
                           errors="strict") + parse_qsl(raw.decode("utf-8"),
                                                        keep_blank_values=True,
                                                        errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise SqsError("InvalidParameterValue", "the request's parameters are not UTF-8 "
                       "form encoding") from None
    name, body = decode(params)
    action = _action(name)
    if AUTH in request.app:
        _authorize(request, name, body, raw)
    return name, action, body


def _action(name: str) -> Action:
    action = ACTIONS.get(name)
    if action is None:
        if name in UNSUPPORTED:
            raise SqsError("UnsupportedOperation", f"{name} is not supported (docs/sqs.md)")
        raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
    return action


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise SqsError("InvalidParameterValue", "the request body exceeds "
                       f"{request.app[SETTINGS].max_body_bytes} bytes") from None


def _authorize(request: web.Request, name: str, body: dict[str, object], raw: bytes) -> None:
    """With auth on: the call's SigV4 signature against the access keys, then the key's
    scope on the action's queue (docs/sqs.md)."""
    keys = request.app.get(SQS_KEYS)
    if keys is None:
        raise SqsError("AccessDenied", "this node runs with auth on and no "
                       "sqs_access_key_file: the SQS API takes no calls (docs/sqs.md)")
    headers: dict[str, list[str]] = {}
    for key, value in request.headers.items():
        headers.setdefault(key.lower(), []).append(value)
    if FORWARDED in request.headers and FORWARDED_HOST in request.headers:
        headers["host"] = [request.headers[FORWARDED_HOST]]  # the Host the caller signed
    identity = verify(keys.keys, request.method, request.raw_path.partition("?")[0],
                      request.rel_url.raw_query_string, headers, raw, dt.datetime.now(dt.UTC))
    scope, queue = required_scope(name, body)
    if not identity.allows(scope, queue):
        raise SqsError("AccessDenied", f"User: {identity.name} is not authorized to perform: "
                       f"sqs:{name} (it needs the {scope!r} scope on {queue!r})")


async def _act(request: web.Request, name: str, action: Action, body: dict[str, object]
               ) -> dict[str, object]:
    """One try of the action. WrongNode and a partition between owners come out as they are
    (the caller forwards or holds); other service errors as SQS's."""
    call = Call(request, endpoint(request), FORWARDED in request.headers)
    fence = request.app[SERVICE].ownership.fence
    try:
        if name not in FENCED:
            return await action(call, body)
        fence.check()
        epoch = fence.epoch
        answer = await action(call, body)
    except (WrongNode, SqsError, asyncio.CancelledError):
        raise
    except Unavailable as exc:
        if exc.code in _CHANGING_OWNER:  # raised before anything was written, or by a
            raise  # retry-safe step (a send's dedup id, a completion, a lease's wait)
        raise _sqs_error(exc) from None
    except VQError as exc:
        raise _sqs_error(exc) from None
    except Exception:
        log.exception("sqs_call_crashed", extra={"action": name})
        raise SqsError("InternalFailure", "internal error") from None
    try:
        fence.check_since(epoch)  # outside the hold: what it wrote may count or not
    except VQError as exc:
        raise _sqs_error(exc) from None
    return answer


def _sqs_error(exc: VQError) -> SqsError:
    """A service's error as SQS's: a queue or consumer not found is QueueDoesNotExist; what
    a retry may fix (a partition changing owner, a node standing still) ServiceUnavailable,
    which SDKs retry; a refused value InvalidParameterValue."""
    if isinstance(exc, NotFound) and exc.code in ("queue_not_found", "consumer_not_found"):
        return SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if isinstance(exc, (Unavailable, WrongNode)) or (exc.retriable and exc.status >= 500):
        return SqsError("ServiceUnavailable", exc.message)
    if exc.status < 500:
        return SqsError("InvalidParameterValue", exc.message)
    return SqsError("InternalFailure", exc.message)
