"""`GET /v1/queues/{queue}/consumers/{consumer}/stream`: records pushed over a WebSocket under
credit-based flow control (docs/work-queues.md#streaming).

The client grants credit (`{"op": "credit", "n": N}`) and is never sent more records than it
granted. In lease mode each record comes leased (token, attempt, deadline) and the client sends
`complete`, `retry` and `extend` on the same socket, or has its credit carry the tokens to
complete (`"complete": [tokens]`, answered token by token once written, ADR 16); in cursor mode
records come from the consumer's committed offset on, and the client sends `ack`. Every op may
carry an `id`, echoed in its `result` or `error` frame (which has none when the op had none);
an error that ends the stream is the one `error` frame marked `"final": true`. A dropped
socket keeps nothing: its leases end at their deadline, as any lease does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from vqueues.api import params
from vqueues.api.answers import ENCODINGS, encode_leased, encode_record
from vqueues.api.body import decode_object, refuse_unknown
from vqueues.api.keys import SERVICE, SETTINGS, WORK
from vqueues.api.work import SETTLE_FIELDS, SETTLING, riding_tokens, settle
from vqueues.errors import BadRequest, Conflict, VQError
from vqueues.names import validate_name
from vqueues.state.consumer_config import CURSOR, LEASE, MODES
from vqueues.state.tags import check_tag

log = logging.getLogger(__name__)

# The most credit a client may have outstanding; more is refused (a bound on what one socket
# can make the node hold).
MAX_CREDIT = 10_000
_FRAME_FIELDS = {"credit": ("n", "complete"), "ack": ("offset",), **{
    kind: tuple(f for f in fields if f != "op") for kind, fields in SETTLE_FIELDS.items()}}
# A push waits this long for records before looking at the socket and the credit again.
PUSH_WAIT_MS = 1000

_encode = msgspec.json.Encoder().encode


class _Stream:
    def __init__(self, request: web.Request, ws: web.WebSocketResponse, queue: str,
                 consumer: str, mode: str, encoding: str, visibility_ms: int | None,
                 tag: str | None = None) -> None:
        self.request = request
        self.ws = ws
        self.queue = queue
        self.consumer = consumer
        self.mode = mode
        self.encoding = encoding
        self.visibility_ms = visibility_ms
        self.tag = tag
        self.credit = 0
        self.granted = asyncio.Event()
        self.position: int | None = None  # cursor mode: the next offset to push

    async def send(self, frame: dict[str, Any]) -> None:
        if not self.ws.closed:
            await self.ws.send_str(_encode(frame).decode())

    async def run(self) -> None:
        """Push until the socket closes; an error that ends the stream (the partition moved,
        the consumer's mode does not fit) is sent as a last frame, then the socket closes."""
        try:
            await self.push()
        except VQError as exc:
            await self.send({"type": "error", "final": True, **exc.to_json()})
            await self.ws.close()
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.error("stream_failed", extra={"queue": self.queue, "error": repr(exc)})
            await self.ws.close()

    async def push(self) -> None:
        """Send records while there is credit."""
        app = self.request.app
        settings = app[SETTINGS]
        while not self.ws.closed:
            if self.credit <= 0:
                self.granted.clear()
                await self.granted.wait()
                continue
            out: list[Any]
            if self.mode == LEASE:
                limit = min(self.credit, settings.max_lease_records)
                leased = await app[WORK].lease(self.queue, self.consumer, limit,
                                               self.visibility_ms, PUSH_WAIT_MS, self.tag)
                out = [encode_leased(r, self.encoding) for r in leased.records]
            else:
                limit = min(self.credit, settings.max_read_limit)
                page = await app[SERVICE].read(self.queue, self.consumer, self.position,
                                               limit, PUSH_WAIT_MS, self.tag)
                self.position = page.next_offset
                out = [encode_record(r, self.encoding) for r in page.records]
            if out:
                self.credit -= len(out)
                await self.send({"type": "records", "records": out})

    def grant(self, op: dict[str, Any]) -> list[str] | None:
        """A credit frame: its credit added once the frame is checked; the tokens its
        `complete` carries (ADR 16), if any."""
        n = op.get("n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadRequest("invalid_parameter", "credit `n` must be a positive integer")
        if self.credit + n > MAX_CREDIT:
            raise BadRequest("limit_out_of_range", f"at most {MAX_CREDIT} credit "
                             "outstanding", parameter="n", min=1, max=MAX_CREDIT)
        tokens = riding_tokens(op.get("complete"))
        if tokens is not None and self.mode != LEASE:
            raise Conflict("consumer_mode_mismatch", "a credit's `complete` is a lease "
                           "stream's; this stream is a cursor stream", mode=self.mode)
        self.credit += n
        self.granted.set()
        return tokens

    async def handle(self, op: dict[str, Any]) -> None:
        """One client frame."""
        app = self.request.app
        kind = op.get("op")
        # Echoed only when the frame had one, as sent (no `"id": null` for a frame without):
        # clients tell the stream's end by `final`, never by a missing id.
        ident = {"id": op["id"]} if "id" in op else {}
        try:
            known = _FRAME_FIELDS.get(kind, ()) if isinstance(kind, str) else ()
            refuse_unknown(op, ("op", "id", *known), "a frame")
            riding: list[str] | None = None
            if kind == "credit":
                riding = self.grant(op)
                if riding is None:
                    return
            result: Any
            fence = app[SERVICE].ownership.fence
            partition = app[SERVICE].partition_of(self.queue)
            fence.check(partition)
            epoch = fence.epoch
            if riding is not None:
                result = await app[WORK].complete_riding(self.queue, self.consumer, riding)
            elif kind in SETTLING:
                if self.mode != LEASE:  # as the HTTP routes answer a mode's wrong call
                    raise Conflict("consumer_mode_mismatch", f"{kind} is a lease stream's op; "
                                   "this stream is a cursor stream", mode=self.mode)
                result = await settle(app, kind, self.queue, self.consumer, op)
            elif kind == "ack":
                if self.mode != CURSOR:
                    raise Conflict("consumer_mode_mismatch", "ack is a cursor stream's op; this "
                                   "stream is a lease stream: complete its records instead",
                                   mode=self.mode)
                offset = op.get("offset")
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                    raise BadRequest("invalid_offset", "`offset` must be a non-negative integer")
                result = await app[SERVICE].ack(self.queue, self.consumer, offset, False)
            else:
                raise BadRequest("invalid_parameter",
                                 "op must be credit, complete, retry, extend or ack")
            fence.check_since(epoch, partition)
            await self.send({"type": "result", **ident, "op": kind,
                             "result": msgspec.to_builtins(result)})
        except VQError as exc:
            await self.send({"type": "error", **ident, "op": kind, **exc.to_json()})


async def stream(request: web.Request) -> web.StreamResponse:
    queue = validate_name(request.match_info["queue"], "queue")
    consumer = validate_name(request.match_info["consumer"], "consumer")
    settings = request.app[SETTINGS]
    encoding = request.query.get("encoding", "utf8")
    if encoding not in ENCODINGS:
        raise BadRequest("invalid_parameter", "encoding must be utf8 or base64")
    visibility_ms = params.LEASE_VISIBILITY_MS.parse(request.query, settings)
    tag = request.query.get("tag")
    if tag is not None and check_tag(tag):
        raise BadRequest("invalid_parameter", f"tag: {check_tag(tag)}")
    service = request.app[SERVICE]
    state = service.ownership.require(service.partition_of(queue))  # 409/503 before upgrading
    config = state.configs.get((queue, consumer))
    mode = request.query.get("mode", config.mode if config is not None else CURSOR)
    if mode not in MODES:
        raise BadRequest("invalid_parameter", "mode must be cursor or lease")
    ws = web.WebSocketResponse(heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise BadRequest("bad_request", "this route is a WebSocket: open it with `Connection: "
                         "Upgrade` and `Upgrade: websocket` (docs/work-queues.md)")
    await ws.prepare(request)
    session = _Stream(request, ws, queue, consumer, mode, encoding, visibility_ms, tag)
    pusher = asyncio.create_task(session.run())
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                op = decode_object(msg.data.encode("utf-8", "surrogatepass"))
            except VQError as exc:
                await session.send({"type": "error", **exc.to_json()})
                continue
            await session.handle(op)
    finally:
        pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
            await pusher
    await ws.close()
    return ws
