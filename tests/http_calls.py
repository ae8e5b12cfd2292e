"""HTTP helpers for both tiers: a call that expects a JSON answer, and raw requests with bytes
no HTTP client library would send. `client` is an aiohttp ClientSession (real-broker tier, with
absolute URLs) or the unit tier's TestClient over the app (`api`, with paths)."""

import asyncio
import json
import re
import uuid
from typing import Any
from urllib.parse import urlsplit


def qname(prefix: str = "q") -> str:
    """A queue name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


JSON = b"Content-Type: application/json"
JSON_TYPE = {"Content-Type": "application/json"}


async def call(client, method, url, **kw):
    """(status, JSON body) of a request; the answer must be JSON."""
    if "data" in kw:  # these bodies are JSON (or meant to be): say so, as a client would
        kw.setdefault("headers", {"Content-Type": "application/json"})
    async with client.request(method, url, **kw) as r:
        body = await r.json()
        assert r.content_type == "application/json"
        return r.status, body


def code(body):
    """The error code of an error answer's body."""
    return body["error"]["code"]


async def raw_request(url: str, head: bytes, body: bytes = b"", pause_s: float = 0.0,
                      timeout_s: float = 10.0) -> tuple[int, dict[str, Any] | None]:
    """Bytes no HTTP client library would send to the server at `url`: (status, JSON body or
    None)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(head + b"\r\n\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(65536), timeout_s)
        while b"\r\n\r\n" not in raw:
            raw += await asyncio.wait_for(reader.read(65536), timeout_s)
        top, _, rest = raw.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", top)
        while length and len(rest) < int(length.group(1)):
            rest += await asyncio.wait_for(reader.read(65536), timeout_s)
        status = int(top.split(b" ", 2)[1])
        return status, (json.loads(rest) if rest else None)
    finally:
        writer.close()


def post_head(path: bytes, length: int, *headers: bytes) -> bytes:
    """The head of a POST of `length` bytes to `path`, with `headers`."""
    return b"\r\n".join([b"POST " + path + b" HTTP/1.1", b"Host: vq",
                          b"Content-Length: %d" % length, *headers])
