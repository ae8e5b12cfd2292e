"""The middlewares every request passes: metrics by route template, and the one place where
errors become JSON (`{"error": {"code", "message", "retriable", ...}}`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from vqueues.api.codec import respond
from vqueues.api.keys import SERVICE, SETTINGS
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
        if exc.status >= 500:
            log.warning("request_failed", extra={"path": request.path, "code": exc.code,
                                                 "error": exc.message})
        return respond(exc.to_json(), exc.status, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = VQError(_HTTP_CODES.get(exc.status, "bad_request"), exc.reason)
        if exc.status == 413:
            error.message = (f"request body exceeds the limit of "
                             f"{request.app[SETTINGS].max_body_bytes} bytes")
        return respond(error.to_json(), error.status)
    except Exception:
        log.exception("request_crashed", extra={"path": request.path})
        return respond(VQError("internal", "internal error").to_json(), 500)


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
