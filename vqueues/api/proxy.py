"""`--forward`: a request for a partition another node owns is proxied to that node, once
(a forwarded request carries X-VQ-Forwarded-By and is never forwarded again)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from vqueues.api.keys import PROXY, SETTINGS
from vqueues.api.middlewares import Handler
from vqueues.errors import Unavailable, WrongNode

FORWARDED = "X-VQ-Forwarded-By"
_HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length",
                "te", "trailer", "upgrade", "proxy-authorization", "proxy-authenticate"}


@web.middleware
async def forward_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except WrongNode as exc:
        owner = exc.details.get("owner")
        # A WebSocket (the stream) is not proxied: the client connects to the owner itself.
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if not owner or FORWARDED in request.headers or upgrade:
            raise
        return await proxy(request, str(owner))


async def proxy(request: web.Request, owner: str, extra: dict[str, str] | None = None
                ) -> web.Response:
    """The request sent on to `owner` (a node's URL), once, and its answer (the SQS API
    forwards this way too, with `extra` headers)."""
    body = await request.read()  # cached by aiohttp if the handler read it already
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
    headers.update(extra or {})
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


async def proxy_session(app: web.Application) -> AsyncIterator[None]:
    """The proxy's HTTP client, for the application's lifetime (a cleanup_ctx)."""
    settings = app[SETTINGS]
    timeout = aiohttp.ClientTimeout(total=settings.max_wait_ms / 1000 + 30)
    connector = aiohttp.TCPConnector(ssl=settings.client_ssl_context())
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                     connector=connector) as session:
        app[PROXY] = session
        yield
