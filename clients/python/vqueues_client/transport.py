"""Routing: the session, the cluster map and the node's limits, and calls sent to a queue's
owner (or to one node), retried until their deadline."""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from typing import Any, Self

import aiohttp

from vqueues_client.encoding import error_from, request_bytes
from vqueues_client.errors import DeadlineExceeded, VQError
from vqueues_client.hashing import partition_for

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # the node's max_body_bytes default
DEFAULT_MAX_BATCH_RECORDS = 1000  # its max_batch_records
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024  # its max_record_bytes


class Transport:
    """The routing under `AsyncClient`'s calls: it keeps the session, the cluster map and the
    node's limits, and sends a call to its queue's owner, following `wrong_node` and retrying
    what fails retriably until the call's deadline."""

    def __init__(self, urls: str | list[str], *, deadline_s: float = 30.0,
                 request_timeout_s: float = 60.0, refresh_interval_s: float = 30.0,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 session: aiohttp.ClientSession | None = None, token: str | None = None,
                 ca_file: str | None = None) -> None:
        self.seeds = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.seeds:
            raise ValueError("at least one node URL is needed")
        self.deadline_s = deadline_s
        self.refresh_interval_s = refresh_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        # A bearer token for nodes run with auth on (docs/security.md), sent on every call.
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        # https:// URLs are verified against the system's CAs, or `ca_file` (a PEM bundle) for
        # a private CA; hostnames are checked too.
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._session = session
        self._own_session = session is None
        self.partitions: int | None = None
        self.owners: dict[int, str] = {}
        self.generation = -1
        # The node's limits (docs/api.md, "Limits"): their documented defaults until the
        # cluster map publishes the node's own (`limits`). A 413 or too_many_records lowers
        # them until the next map.
        self.max_body_bytes = DEFAULT_MAX_BODY_BYTES
        self.max_records_per_call = DEFAULT_MAX_BATCH_RECORDS
        self.max_record_bytes = DEFAULT_MAX_RECORD_BYTES
        self._map_at = 0.0
        self._map_lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
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
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=self._ssl))
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
                    async with self.session.get(f"{url}/v1/partitions",
                                                headers=self.headers) as r:
                        if r.status in (401, 403):  # the token, not the node: no retry
                            body = await r.json(content_type=None)
                            err = body.get("error", {}) if isinstance(body, dict) else {}
                            raise VQError(r.status, err.get("code", "unauthenticated"),
                                          err.get("message", ""), err, retriable=False)
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
                self._learn_limits(body.get("limits"))
                self._map_at = time.monotonic()
                return body
            raise VQError(0, "no_node_reachable", f"no node answered: {last}", retriable=True)

    async def _owner_url(self, queue: str) -> str:
        await self._fresh_map()
        return self.cached_owner(queue)

    @property
    def map_stale(self) -> bool:
        """The cached map is unknown or older than `refresh_interval_s`."""
        return self.partitions is None or \
            time.monotonic() - self._map_at > self.refresh_interval_s

    async def _fresh_map(self) -> None:
        """Fetch the map if it is stale (`map_stale`)."""
        if self.map_stale:
            try:
                await self.refresh_map()
            except VQError:
                if self.partitions is None:
                    raise

    def cached_owner(self, queue: str) -> str:
        """The owner of `queue` in the cached map (a seed when it is unknown)."""
        if self.partitions is None:
            return self.seeds[0]
        return self.owners.get(partition_for(queue, self.partitions), self.seeds[0])

    def _grown(self, body: Any) -> bool:
        """An answer from a partition past the map's count: the partitions grew since the map
        was fetched (docs/growing.md)."""
        partition = body.get("partition") if isinstance(body, dict) else None
        return isinstance(partition, int) and self.partitions is not None and \
            partition >= self.partitions

    def _partition_of(self, queue: str) -> int:
        return partition_for(queue, self.partitions) if self.partitions else -1

    async def node_urls(self) -> list[str]:
        """Every node in the cluster map (the seeds if no partition has an owner yet)."""
        await self.refresh_map()
        return sorted(set(self.owners.values())) or list(self.seeds)

    # The node's limits -------------------------------------------------------------------------

    def _learn_limits(self, limits: Any) -> None:
        """Take the node's limits from its cluster map (a node before 0.2 publishes none)."""
        if not isinstance(limits, dict):
            return
        for name, attr in (("max_body_bytes", "max_body_bytes"),
                           ("max_batch_records", "max_records_per_call"),
                           ("max_record_bytes", "max_record_bytes")):
            value = limits.get(name)
            if type(value) is int and value > 0:
                setattr(self, attr, value)

    def learn_refusal(self, err: VQError, sizes: list[int]) -> None:
        """A node refused a multi-queue request of records of these encoded sizes as too
        large (`payload_too_large`, `too_many_records`): take the limit it names, or else
        half the request (never less than its largest record alone), until the next map."""
        limit = err.details.get("max")
        if err.code == "too_many_records":
            self.max_records_per_call = limit if type(limit) is int and 0 < limit < \
                len(sizes) else max(1, len(sizes) // 2)
            return
        sent = request_bytes(sizes)
        self.max_body_bytes = limit if type(limit) is int and 0 < limit < sent else \
            max(sent // 2, request_bytes([max(sizes)]))

    def size_error(self, name: str, data: bytes, value_bytes: int) -> VQError | None:
        """The node's 413 for a record (`name`: how to call it) whose value is over
        `max_record_bytes`, or that alone makes a multi-queue request over `max_body_bytes`;
        None if it fits."""
        if value_bytes > self.max_record_bytes:
            return VQError(413, "record_too_large", f"{name} is {value_bytes} bytes; at most "
                           f"{self.max_record_bytes} (max_record_bytes)",
                           {"max": self.max_record_bytes})
        size = request_bytes([len(data)])
        if size > self.max_body_bytes:
            return VQError(413, "payload_too_large", f"{name} alone makes a {size}-byte "
                           f"request; at most {self.max_body_bytes} (max_body_bytes)",
                           {"max": self.max_body_bytes})
        return None

    def chunks(self, indices: list[int], sizes: list[int]) -> list[list[int]]:
        """`indices`, in order, cut into multi-queue requests within the node's limits
        (`sizes`: each index's encoded size)."""
        out: list[list[int]] = []
        chunk: list[int] = []
        size = 0
        for i in indices:
            if chunk and (len(chunk) >= self.max_records_per_call
                          or request_bytes([size, sizes[i]]) > self.max_body_bytes):
                out.append(chunk)
                chunk, size = [], 0
            size += sizes[i] + (1 if chunk else 0)
            chunk.append(i)
        if chunk:
            out.append(chunk)
        return out

    # Requests ----------------------------------------------------------------------------------

    async def _call(self, method: str, queue: str | None, path: str, *,
                    json: Any = None, params: dict[str, str] | None = None,
                    deadline_s: float | None = None, ok404: bool = False) -> Any:
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        delay = self.backoff_initial_s
        last: VQError | None = None
        url_override: str | None = None
        while True:
            try:
                base = url_override or (await self._owner_url(queue) if queue else self.seeds[0])
            except VQError as exc:  # no node answered for the map: retried like any call
                if not exc.retriable:
                    raise
                last, url_override = exc, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(last) from None
                await asyncio.sleep(min(remaining, random.uniform(0, delay)))
                delay = min(self.backoff_max_s, delay * 2)
                continue
            url_override = None
            try:
                async with self.session.request(method, base + path, json=json,
                                                params=params, headers=self.headers) as r:
                    body = await r.json(content_type=None) if r.content_length != 0 else None
                    if r.status < 300:
                        if queue and self._grown(body):
                            await self._refresh_quietly()
                        return body
                    last = error_from(r.status, body, r.reason or "")
                    err = last.details
                    if r.status == 404 and ok404:
                        return None
                    if r.status == 409 and last.code == "wrong_node":
                        url_override = err.get("owner")
                        await self._refresh_quietly()
                    elif r.status in (429, 503) and r.headers.get("Retry-After"):
                        delay = max(delay, min(float(r.headers["Retry-After"]), 5.0) / 4)
                        if last.code == "partition_unavailable":  # the map is moving
                            await self._refresh_quietly()
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

    async def _call_node(self, url: str, method: str, path: str, *, json: Any = None,
                         deadline_s: float | None = None) -> dict[str, Any]:
        """One call to one node (a prefix consumer's calls: the node holds those queues),
        retried like `_call` while it fails retriably, but never sent elsewhere. A node that
        refuses the connection is gone: that fails at once (`connection_error`), for the
        caller to follow the cluster map."""
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        delay = self.backoff_initial_s
        while True:
            try:
                async with self.session.request(method, url + path, json=json,
                                                headers=self.headers) as r:
                    body = await r.json(content_type=None) if r.content_length != 0 else None
                    if r.status < 300:
                        assert isinstance(body, dict), body
                        return body
                    last = error_from(r.status, body, r.reason or "")
                    if not last.retriable or last.code == "wrong_node":
                        raise last
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                last = VQError(0, "connection_error", f"{url}: {exc}", retriable=True)
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise last from None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(last)
            await asyncio.sleep(min(remaining, random.uniform(0, delay)))
            delay = min(self.backoff_max_s, delay * 2)

    async def _call_obj(self, method: str, queue: str | None, path: str, **kw: Any
                        ) -> dict[str, Any] | None:
        """`_call` for routes that answer a JSON object (or None on an allowed 404)."""
        body = await self._call(method, queue, path, **kw)
        assert body is None or isinstance(body, dict), body
        return body

    async def _get_node(self, url: str, path: str, params: dict[str, str] | None = None
                        ) -> tuple[int, Any]:
        """One GET to one node (no routing, no retry): (status, JSON body)."""
        async with self.session.get(url + path, params=params, headers=self.headers) as r:
            return r.status, await r.json(content_type=None)

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(VQError):
            await self.refresh_map()
