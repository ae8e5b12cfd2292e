"""The middlewares every request passes: metrics by route template, and the one place where
errors become JSON (`{"error": {"code", "message", "retriable", ...}}`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import unquote_to_bytes

from aiohttp import web

from vqueues.api.answers import respond
from vqueues.api.auth import required_scope
from vqueues.api.body import UnreadableBody
from vqueues.api.keys import AUTH, IDENTITY, PREFIX, QUERY_PARAMETERS, SERVICE, SETTINGS
from vqueues.api.sqs.paths import SQS_ROUTES
from vqueues.errors import Unavailable, VQError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's own refusals, as registry codes.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
               415: "unsupported_media_type"}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except VQError as exc:
        headers = None
        if isinstance(exc, Unavailable):
            headers = {"Retry-After": str(exc.retry_after_s)}
        elif exc.status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="vqueues"'}
        if exc.status >= 500:
            log.warning("request_failed", extra={"path": request.path, "code": exc.code,
                                                 "error": exc.message})
        response = respond(exc.to_json(), exc.status, headers)
        if isinstance(exc, UnreadableBody) or (request.can_read_body
                                               and not request.content.is_eof()):
            response.force_close()  # a body left unread: the connection is not reused
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = VQError(_HTTP_CODES.get(exc.status, "bad_request"), exc.reason)
        if exc.status == 413:
            error.message = (f"request body exceeds the limit of "
                             f"{request.app[SETTINGS].max_body_bytes} bytes")
        allow = exc.headers.get("Allow")  # a 405 names the methods the route takes (RFC 9110)
        return respond(error.to_json(), error.status,
                       {"Allow": allow} if allow is not None else None)
    except Exception:
        log.exception("request_crashed", extra={"path": request.path})
        return respond(VQError("internal", "internal error").to_json(), 500)


def _not_utf8(text: str) -> bool:
    """Whether percent-decoding `text` gives bytes that are not UTF-8."""
    try:
        unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@web.middleware
async def text_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Names, parameters and header values are UTF-8 text: a path that percent-decodes to other
    bytes is `400 invalid_name` (else `%FF` would reach a queue named by the literal text), a
    query is `400 invalid_parameter`, a header value `400 bad_request`. A query holds only
    its route's parameters, each once."""
    raw = request.raw_path
    if "%" in raw:
        path, _, query = raw.partition("?")
        if _not_utf8(path):
            raise VQError("invalid_name", "a path segment is not UTF-8 once percent-decoded")
        # The SQS route reads its own query (the query protocol's parameters) and answers a
        # bad one in SQS's shape.
        if _not_utf8(query.replace("+", " ")) and not _sqs_route(request):
            raise VQError("invalid_parameter", "the query is not UTF-8 once percent-decoded")
    if request.query_string:
        _check_query(request)
    for name, value in request.headers.items():
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise VQError("bad_request", f"header {name} is not UTF-8") from None
    return await handler(request)


def _sqs_route(request: web.Request) -> bool:
    info = request.match_info.route.resource
    return info is not None and info.canonical in SQS_ROUTES


def _check_query(request: web.Request) -> None:
    """`400 invalid_parameter` for a query parameter the route does not take (named in
    `unknown`), as for a body's unknown field: a misspelt `wait_ms` would otherwise be a
    long poll that returns at once. A parameter given twice is refused too (which one would
    count?), but for an array such as `/metrics`' `name[]`."""
    info = request.match_info.route.resource
    if info is None:
        return
    known = request.app[QUERY_PARAMETERS].get((info.canonical, request.method))
    if known is None:  # not a documented route: the console's files, the compat routes
        return
    seen: set[str] = set()
    again: set[str] = set()  # one pass: a query of 2,000 names must not cost 2,000 squared
    # items(), not keys(): a MultiDict's keys() names a repeated parameter once.
    for name, _ in request.query.items():  # noqa: PERF102
        (again if name in seen else seen).add(name)
    unknown = sorted(seen - known)
    if unknown:
        raise VQError("invalid_parameter", f"unknown query parameter(s) {unknown}; known: "
                      f"{sorted(known)}", unknown=unknown)
    twice = sorted(n for n in again if not n.endswith("[]"))
    if twice:
        raise VQError("invalid_parameter", f"query parameter(s) {twice} given more than once",
                      parameter=twice[0])


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
        counter, timer = request.app[SERVICE].metrics.of_request(route, request.method, status)
        counter.inc()
        timer.observe(time.perf_counter() - started)


_UNFENCED = ("/v1/queues/{queue}/records", "/v1/records", "/v1/prefix-consumers/{consumer}",
             "/v1/queues/{queue}/scheduled/{id}", "/get_records", "/get_partitions",
             # The SQS API fences its own actions, answering in SQS's shape (api/sqs/route.py).
             *SQS_ROUTES)


@web.middleware
async def fence_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The self-fence (vqueues/ownership/self_fence.py) on every route that writes the offset topic
    (acks, leases, settles, consumer and queue changes): 503 before acting while this node
    may have stood still unconfirmed, and 503 instead of 200 if it stood still while acting,
    as the next owner's replay may ignore what it wrote. Enqueues and reads need no fence:
    a record written to the data topic is served by whoever owns it next."""
    info = request.match_info.route.resource
    route = info.canonical if info is not None else ""
    if request.method == "GET" or route in _UNFENCED or route.endswith("/stream"):
        return await handler(request)
    fence = request.app[SERVICE].ownership.fence
    if fence.stale():
        fence.check(_partition(request))
    epoch = fence.epoch
    response = await handler(request)
    if epoch != fence.epoch or fence.stale():
        fence.check_since(epoch, _partition(request))
    return response


def _partition(request: web.Request) -> int | None:
    queue = request.match_info.get("queue")
    return request.app[SERVICE].partition_of(queue) if queue is not None else None


def _scoped_queue(request: web.Request, route: str) -> str | None:
    """What a route's scope is checked on: its queue; the prefix of a listing or of a prefix
    consumer (the scope must reach every queue under it); "" (every queue) for a compat
    route. None: the handler checks (a new prefix consumer's prefix is in its body)."""
    queue = request.match_info.get("queue")
    if queue is not None:
        return queue
    if route == "/v1/records":
        return None  # each record's queue: checked per record (api/multi.py)
    if route == "/v1/queues":
        return request.query.get("prefix", "")
    if route.startswith("/v1/prefix-consumers/"):
        pc = request.app[PREFIX].prefixes.by_name.get(request.match_info.get("consumer", ""))
        if pc is not None:
            return pc.prefix
        return None if request.method == "PUT" else ""
    return ""


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With auth on: who is calling (401 if nobody known) and whether their scopes reach this
    route's queue (403). Public routes pass. See vqueues/api/auth.py."""
    auth = request.app[AUTH]
    info = request.match_info.route.resource
    route = info.canonical if info is not None else ""
    need = required_scope(route, request.method)
    if need is None or (need == "metrics" and not request.app[SETTINGS].metrics_auth):
        return await handler(request)
    identity = auth.identify(request.headers.get("Authorization"))
    request[IDENTITY] = identity
    if need not in ("any", "metrics"):
        queue = _scoped_queue(request, route)
        if queue is not None and not identity.allows(need, queue):
            raise VQError("forbidden", f"token {identity.name!r} has no {need!r} scope on queue "
                          f"{queue!r}", scope=need)
    return await handler(request)
