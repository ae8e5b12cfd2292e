"""The async client: routes each call to the node that owns the queue's partition."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from vqueues_client.errors import DeadlineExceeded, VQError
from vqueues_client.hashing import partition_for

Value = bytes | str | None


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    value: bytes | None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode("utf-8")


@dataclass(frozen=True, slots=True)
class ReadResult:
    partition: int
    records: list[Record]
    next_offset: int


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    partition: int
    offsets: list[int] | None


@dataclass(frozen=True, slots=True)
class NewRecord:
    """One record to enqueue with headers of its own (a batch may mix them)."""

    value: Value
    headers: dict[str, str] | None = None


def _encode_value(value: Value, headers: dict[str, str] | None) -> dict[str, Any]:
    item: dict[str, Any]
    if isinstance(value, bytes | bytearray | memoryview):
        item = {"value": base64.b64encode(bytes(value)).decode("ascii"), "encoding": "base64"}
    else:
        item = {"value": value}
    if headers:
        item["headers"] = headers
    return item


def _encode_item(item: Value | NewRecord, headers: dict[str, str] | None) -> dict[str, Any]:
    if isinstance(item, NewRecord):
        return _encode_value(item.value, item.headers)
    return _encode_value(item, headers)


def _decode_record(raw: dict[str, Any]) -> Record:
    value = raw.get("value")
    b64 = raw.get("encoding") == "base64"
    headers = raw.get("headers") or {}
    if b64:
        headers = {k: base64.b64decode(v).decode("utf-8", "replace") if v is not None else ""
                   for k, v in headers.items()}
    data = None if value is None else (base64.b64decode(value) if b64 else value.encode())
    return Record(raw["offset"], raw["timestamp"], data, headers)


class AsyncClient:
    """`async with AsyncClient(["http://node1:8080"]) as vq: await vq.enqueue("q", ["x"])`.

    The cluster map is fetched from any of `urls`, cached, and refreshed on a 409 wrong_node,
    on a connection error, and every `refresh_interval_s`. Retriable failures are retried with
    exponential backoff and jitter until `deadline_s` has passed.
    """

    def __init__(self, urls: str | list[str], *, deadline_s: float = 30.0,
                 request_timeout_s: float = 60.0, refresh_interval_s: float = 30.0,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.seeds = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.seeds:
            raise ValueError("at least one node URL is needed")
        self.deadline_s = deadline_s
        self.refresh_interval_s = refresh_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session = session
        self._own_session = session is None
        self.partitions: int | None = None
        self.owners: dict[int, str] = {}
        self.generation = -1
        self._map_at = 0.0
        self._map_lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    # The cluster map ---------------------------------------------------------------------------

    async def refresh_map(self) -> dict[str, Any]:
        """Fetch the map from the first node that answers (known owners first, then seeds)."""
        async with self._map_lock:
            last: Exception | None = None
            candidates = list(dict.fromkeys([*self.owners.values(), *self.seeds]))
            random.shuffle(candidates)
            for url in candidates:
                try:
                    async with self.session.get(f"{url}/v1/partitions") as r:
                        if r.status != 200:
                            continue
                        body = await r.json()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = exc
                    continue
                assert isinstance(body, dict)
                self.partitions = int(body["partitions"])
                self.owners = {int(p): o["url"] for p, o in body.get("owners", {}).items()}
                self.generation = int(body.get("generation", 0))
                self._map_at = time.monotonic()
                return body
            raise VQError(0, "no_node_reachable", f"no node answered: {last}", retriable=True)

    async def _owner_url(self, queue: str) -> str:
        if self.partitions is None or time.monotonic() - self._map_at > self.refresh_interval_s:
            try:
                await self.refresh_map()
            except VQError:
                if self.partitions is None:
                    raise
        assert self.partitions is not None
        return self.owners.get(partition_for(queue, self.partitions), self.seeds[0])

    # Requests ----------------------------------------------------------------------------------

    async def _call(self, method: str, queue: str | None, path: str, *,
                    json: Any = None, params: dict[str, str] | None = None,
                    deadline_s: float | None = None, ok404: bool = False) -> Any:
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        delay = self.backoff_initial_s
        last: VQError | None = None
        url_override: str | None = None
        while True:
            base = url_override or (await self._owner_url(queue) if queue else self.seeds[0])
            url_override = None
            try:
                async with self.session.request(method, base + path, json=json,
                                                params=params) as r:
                    body = await r.json(content_type=None) if r.content_length != 0 else None
                    if r.status < 300:
                        return body
                    err = (body or {}).get("error", {}) if isinstance(body, dict) else {}
                    last = VQError(r.status, err.get("code", "http_error"),
                                   err.get("message", r.reason or ""), err,
                                   retriable=err.get("retriable") is True)
                    if r.status == 404 and ok404:
                        return None
                    if r.status == 409 and last.code == "wrong_node":
                        url_override = err.get("owner")
                        await self._refresh_quietly()
                    elif r.status == 503 and r.headers.get("Retry-After"):
                        delay = max(delay, min(float(r.headers["Retry-After"]), 5.0) / 4)
                    if not last.retriable:
                        raise last
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                last = VQError(0, "connection_error", f"{base}: {exc}", retriable=True)
                await self._refresh_quietly()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(last)
            if url_override is None:
                await asyncio.sleep(min(remaining, random.uniform(0, delay)))  # full jitter
                delay = min(self.backoff_max_s, delay * 2)

    async def _call_obj(self, method: str, queue: str | None, path: str, **kw: Any
                        ) -> dict[str, Any] | None:
        """`_call` for routes that answer a JSON object (or None on an allowed 404)."""
        body = await self._call(method, queue, path, **kw)
        assert body is None or isinstance(body, dict), body
        return body

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(VQError):
            await self.refresh_map()

    @staticmethod
    def _q(queue: str) -> str:
        return quote(queue, safe="")

    # The API -----------------------------------------------------------------------------------

    async def enqueue(self, queue: str,
                      values: list[Value | NewRecord] | Value | NewRecord,
                      headers: dict[str, str] | None = None) -> EnqueueResult:
        """Enqueue one value or a list, in one request and in this order; `bytes` go base64,
        `str` as UTF-8. `headers` apply to plain values; a `NewRecord` carries its own.

        A retried enqueue (after a connection error) may write twice: at-least-once.
        """
        items = values if isinstance(values, list) else [values]
        body = await self._call("POST", queue, f"/v1/queues/{self._q(queue)}/records",
                                json={"records": [_encode_item(v, headers) for v in items]})
        return EnqueueResult(body["partition"], body["offsets"])

    async def read(self, queue: str, *, consumer: str | None = None, offset: int | None = None,
                   limit: int | None = None, wait_ms: int | None = None) -> ReadResult:
        params = {k: str(v) for k, v in (("consumer", consumer), ("offset", offset),
                                         ("limit", limit), ("wait_ms", wait_ms))
                  if v is not None}
        deadline = self.deadline_s + (wait_ms or 0) / 1000
        body = await self._call("GET", queue, f"/v1/queues/{self._q(queue)}/records",
                                params=params, deadline_s=deadline)
        return ReadResult(body["partition"], [_decode_record(r) for r in body["records"]],
                          body["next_offset"])

    async def ack(self, queue: str, consumer: str, offset: int, *,
                  allow_rewind: bool = False) -> dict[str, Any]:
        """Commit `offset`, the consumer's next offset to read."""
        body = await self._call_obj(
            "POST", queue, f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}/ack",
            json={"offset": offset, "allow_rewind": allow_rewind})
        assert body is not None
        return body

    async def queue_info(self, queue: str) -> dict[str, Any] | None:
        """The queue's partition, record count, offsets and consumers; None if unknown."""
        return await self._call_obj("GET", queue, f"/v1/queues/{self._q(queue)}", ok404=True)

    async def delete_queue(self, queue: str) -> dict[str, Any] | None:
        """Delete the queue and its consumers; None if it did not exist."""
        return await self._call_obj("DELETE", queue, f"/v1/queues/{self._q(queue)}",
                                    ok404=True)

    async def delete_consumer(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj(
            "DELETE", queue, f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}",
            ok404=True)

    async def cluster_map(self) -> dict[str, Any]:
        return await self.refresh_map()
