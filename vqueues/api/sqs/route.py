"""The SQS route: POST `/` and POST `/{account}/{queue}` (SDKs post to the endpoint, the
query protocol to the queue URL). It reads and decodes its own body (the native routes'
content-type, body and Bearer checks do not apply to it) and answers every error in SQS's
shapes (protocol.py), the self-fence's too."""

from __future__ import annotations

import asyncio
import logging
import uuid

from aiohttp import web

from vqueues.api.keys import AUTH, SERVICE, SETTINGS
from vqueues.api.sqs.actions import ACTIONS, FENCED, UNSUPPORTED, Call
from vqueues.api.sqs.paths import SQS_PATHS
from vqueues.api.sqs.protocol import (
    FORM_TYPE,
    JSON_TYPE,
    TARGET_PREFIX,
    SqsError,
    decode_json,
    json_answer,
    json_error,
    xml_error,
)
from vqueues.errors import NotFound, Unavailable, VQError, WrongNode

log = logging.getLogger(__name__)


def routes() -> list[web.RouteDef]:
    return [web.post(path, handle) for path in SQS_PATHS]


def endpoint(request: web.Request) -> str:
    """What queue URLs start with: the setting, or this request's scheme and Host."""
    configured = request.app[SETTINGS].sqs_endpoint_url
    if configured:
        return configured.rstrip("/")
    return f"{request.scheme}://{request.host}"


async def handle(request: web.Request) -> web.StreamResponse:
    request_id = str(uuid.uuid4())
    if request.content_type == FORM_TYPE:
        return xml_error(SqsError("InvalidAction", "the SQS query protocol (form bodies) is "
                                  "not supported: use an SDK that speaks AWS JSON 1.0 "
                                  "(docs/sqs.md)"), request_id)
    try:
        return json_answer(await _act(request), request_id)
    except SqsError as exc:
        return json_error(exc, request_id)


async def _act(request: web.Request) -> dict[str, object]:
    target = request.headers.get("X-Amz-Target", "")
    if request.content_type != JSON_TYPE or not target.startswith(TARGET_PREFIX):
        raise SqsError("InvalidAction", f"an SQS call is a POST of {JSON_TYPE} with the "
                       "header X-Amz-Target: AmazonSQS.<Action>")
    if AUTH in request.app:
        raise SqsError("AccessDenied", "this node runs with auth on, and the SQS API does "
                       "not verify AWS signatures yet (docs/sqs.md)")
    name = target[len(TARGET_PREFIX):]
    action = ACTIONS.get(name)
    if action is None:
        if name in UNSUPPORTED:
            raise SqsError("UnsupportedOperation", f"{name} is not supported (docs/sqs.md)")
        raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise SqsError("InvalidParameterValue", "the request body exceeds "
                       f"{request.app[SETTINGS].max_body_bytes} bytes") from None
    body = decode_json(raw)
    call = Call(request.app, endpoint(request))
    fence = request.app[SERVICE].ownership.fence
    try:
        if name not in FENCED:
            return await action(call, body)
        fence.check()
        epoch = fence.epoch
        answer = await action(call, body)
        fence.check_since(epoch)
        return answer
    except VQError as exc:
        raise _sqs_error(exc) from None
    except asyncio.CancelledError:
        raise
    except SqsError:
        raise
    except Exception:
        log.exception("sqs_call_crashed", extra={"action": name})
        raise SqsError("InternalFailure", "internal error") from None


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
