"""The async client: routes each call to the node that owns the queue's partition."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json as jsonlib
import random
import re
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar
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
class Lease:
    """A leased record: complete, retry or extend it by `token` before `deadline`. A prefix
    lease says which `queue` (and `partition`) each record came from."""

    record: Record
    token: str
    attempt: int  # 1 on the first delivery
    deadline: int  # UTC epoch ms
    queue: str | None = None  # (prefix leases)
    partition: int | None = None  # (prefix leases)

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def value(self) -> bytes | None:
        return self.record.value

    @property
    def headers(self) -> dict[str, str]:
        return self.record.headers

    @property
    def text(self) -> str | None:
        return self.record.text


@dataclass(frozen=True, slots=True)
class Refused:
    """A token given to a lease's `complete=` that the node did not complete, and why:
    `lease_expired` (not current: the record comes again), `invalid_token` (not a token), or,
    for a prefix lease, `wrong_node` (that queue's partition is not the node's: complete it
    with the node that leased it)."""

    token: str
    code: str
    queue: str | None = None  # (prefix leases)


C = TypeVar("C")


class LeasePage(list[Lease], Generic[C]):
    """A lease's answer: the leased records (a plain list of `Lease`, as without `complete=`)
    and what each token given in `complete=` did: `completed` (done, or found done already) and
    `refused`. Both are empty without `complete=`. A prefix lease names its tokens with their
    queue: `completed` holds `(queue, token)` pairs there."""

    def __init__(self, leases: Iterable[Lease] = (), completed: list[C] | None = None,
                 refused: list[Refused] | None = None) -> None:
        super().__init__(leases)
        self.completed: list[C] = completed or []
        self.refused: list[Refused] = refused or []


_UNSET: Any = object()
# A prefix consumer's figures that each node gives for its own partitions.
_COUNTS = ("queues", "ready_queues", "in_flight", "backlog")


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
class RecordResult:
    """One record of a multi-queue enqueue: where it was written, or why it was not."""

    queue: str
    partition: int
    offset: int | None  # None: failed (see `error`), or the node writes with acks=0
    error: VQError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class NewRecord:
    """One record to enqueue with headers of its own (a batch may mix them)."""

    value: Value
    headers: dict[str, str] | None = None
    idempotency_key: str | None = None  # a repeat within the server's window writes nothing
    tags: list[str] | None = None  # indexed by the server: read/lease/stream by tag
    deliver_at: int | None = None  # UTC epoch ms: invisible until then
    delay_ms: int | None = None  # invisible for this long


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
        out = _encode_value(item.value, item.headers)
        if item.idempotency_key is not None:
            out["idempotency_key"] = item.idempotency_key
        if item.tags is not None:
            out["tags"] = item.tags
        if item.deliver_at is not None:
            out["deliver_at"] = item.deliver_at
        if item.delay_ms is not None:
            out["delay_ms"] = item.delay_ms
        return out
    return _encode_value(item, headers)


def _pairs(records: list[tuple[str, Value | NewRecord]]) -> list[tuple[str, Value | NewRecord]]:
    """`records` checked: each a (queue, value) pair. A dict would unpack into its two keys,
    and `{"queue": "q", "value": "v"}` would write "value" to a queue named "queue"."""
    for i, rec in enumerate(records):
        if not isinstance(rec, tuple | list) or len(rec) != 2 or not isinstance(rec[0], str):
            raise TypeError(f"records[{i}] must be a (queue, value) pair, with the queue a "
                            f"string; got {type(rec).__name__} {rec!r:.60}")
    return records


# A queue name's rule, as the node's (vqueues/names.py): 1-249 UTF-8 bytes, no control
# characters (Unicode category Cc).
MAX_NAME_BYTES = 249
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# `{"records":[` and `]}` around a multi-queue request's records.
_ENVELOPE_BYTES = len(b'{"records":[]}')
# Where a node's refusal of a whole request names the record it refused for.
_RECORD_AT = re.compile(r"records\[(\d+)\]")


def name_error(queue: str, what: str = "queue") -> VQError | None:
    """The node's `400 invalid_name` for `queue`, found before sending; None if it is valid."""
    try:
        size = len(queue.encode("utf-8"))
    except UnicodeEncodeError:
        return VQError(400, "invalid_name", f"{what} name is not valid UTF-8")
    if size == 0:
        return VQError(400, "invalid_name", f"{what} name must not be empty")
    if size > MAX_NAME_BYTES:
        return VQError(400, "invalid_name", f"{what} name is {size} UTF-8 bytes; at most "
                       f"{MAX_NAME_BYTES} allowed")
    if _CONTROL.search(queue):
        return VQError(400, "invalid_name", f"{what} name must not contain control characters")
    return None


def encode_for_many(queue: str, item: Value | NewRecord) -> tuple[bytes, int]:
    """One record of a multi-queue request as the JSON sent (compact), and its value's size
    as the node counts it (decoded bytes)."""
    obj = {"queue": queue, **_encode_item(item, None)}
    try:
        data = jsonlib.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, for the node to refuse
        data = jsonlib.dumps(obj, separators=(",", ":")).encode()
    value = item.value if isinstance(item, NewRecord) else item
    if value is None:
        return data, 0
    if isinstance(value, str):
        return data, len(value.encode("utf-8", "surrogatepass"))
    return data, memoryview(value).nbytes


def request_bytes(sizes: list[int]) -> int:
    """The size of a multi-queue request holding records of these encoded sizes."""
    return _ENVELOPE_BYTES + sum(sizes) + max(0, len(sizes) - 1)


def named_record(err: VQError, count: int) -> int | None:
    """The one record (its index in the request) a node's refusal of a whole multi-queue
    request of `count` records names (`records[i]`), or None."""
    if err.retriable or not 400 <= err.status < 500:
        return None
    index = err.details.get("index")
    match = _RECORD_AT.search(err.message)
    at = int(match[1]) if match else index if type(index) is int else None
    return at if at is not None and 0 <= at < count else None


def renamed(err: VQError, name: Callable[[int], str], index: Callable[[int], int | None]
            ) -> VQError:
    """`err` with the records it names by their place in the client's own request
    (`records[k]`, `index`, `first_index`) named as the caller knows them: `name(k)` in the
    message, `index(k)` in the details (dropped where None)."""
    message = _RECORD_AT.sub(lambda m: name(int(m[1])), err.message)
    details = {**err.details, "message": message}
    for field_ in ("index", "first_index"):
        k = details.pop(field_, None)
        if type(k) is int and index(k) is not None:
            details[field_] = index(k)
    return VQError(err.status, err.code, message, details, retriable=err.retriable)


def _decode_record(raw: dict[str, Any]) -> Record:
    value = raw.get("value")
    b64 = raw.get("encoding") == "base64"
    headers = raw.get("headers") or {}
    if b64:
        headers = {k: base64.b64decode(v).decode("utf-8", "replace") if v is not None else ""
                   for k, v in headers.items()}
    data = None if value is None else (base64.b64decode(value) if b64 else value.encode())
    return Record(raw["offset"], raw["timestamp"], data, headers)


def _error_from(status: int, body: Any, reason: str = "") -> VQError:
    """The VQError a node's error answer (`{"error": {...}}`) stands for."""
    err = body.get("error", {}) if isinstance(body, dict) else {}
    return VQError(status, err.get("code", "http_error"), err.get("message", reason), err,
                   retriable=err.get("retriable") is True)


DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # the node's max_body_bytes default
DEFAULT_MAX_BATCH_RECORDS = 1000  # its max_batch_records
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024  # its max_record_bytes


class AsyncClient:
    """`async with AsyncClient(["http://node1:8080"]) as vq: await vq.enqueue("q", ["x"])`.

    `token` is sent as a bearer token on every call; `ca_file` verifies https:// nodes whose
    certificates a private CA signed. The cluster map is fetched from any of `urls`, cached,
    and refreshed on a 409 wrong_node, on a connection error, and every `refresh_interval_s`.
    Retriable failures are retried with exponential backoff and jitter until `deadline_s`.
    """

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
                        return body
                    last = _error_from(r.status, body, r.reason or "")
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
                    last = _error_from(r.status, body, r.reason or "")
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

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(VQError):
            await self.refresh_map()

    @staticmethod
    def _q(queue: str) -> str:
        return quote(queue, safe="")

    # The API -----------------------------------------------------------------------------------

    async def enqueue(self, queue: str,
                      values: list[Value | NewRecord] | Value | NewRecord,
                      headers: dict[str, str] | None = None, *,
                      idempotency_key: str | None = None,
                      tags: list[str] | None = None, deliver_at: int | None = None,
                      delay_ms: int | None = None) -> EnqueueResult:
        """Enqueue one value or a list, in one request and in this order; `bytes` go base64,
        `str` as UTF-8. `headers` apply to plain values; a `NewRecord` carries its own.

        A retried enqueue (after a connection error) may write twice: at-least-once, unless
        the records carry idempotency keys (`idempotency_key` for a single value, or
        `NewRecord(..., idempotency_key=...)` per record): then the automatic retry is safe.
        """
        items = values if isinstance(values, list) else [values]
        if any(x is not None for x in (idempotency_key, tags, deliver_at, delay_ms)):
            if len(items) != 1 or isinstance(items[0], NewRecord):
                raise ValueError("idempotency_key=, tags=, deliver_at= and delay_ms= are for "
                                 "one plain value; give each NewRecord its own")
            items = [NewRecord(items[0], headers, idempotency_key, tags, deliver_at, delay_ms)]
        body = await self._call("POST", queue, f"/v1/queues/{self._q(queue)}/records",
                                json={"records": [_encode_item(v, headers) for v in items]})
        return EnqueueResult(body["partition"], body["offsets"])

    async def enqueue_many(self, records: list[tuple[str, Value | NewRecord]], *,
                           deadline_s: float | None = None) -> list[RecordResult]:
        """Enqueue records to many queues: one `POST /v1/records` per owner node (in calls of
        at most `max_records_per_call` records and `max_body_bytes` bytes, the node's limits),
        the owners in parallel. Records that fail retriably (`wrong_node`: the map is
        refreshed and they go to the new owner; a partition moving or replaying; a broker
        error; a lost connection; no node answering) are sent again, before any later record
        of their queue, until `deadline_s`. Each queue's records keep their order. Returns
        one result per record, in order; a record that failed for good has `error` set
        (nothing is raised for it): a bad queue name or a value over `max_record_bytes`
        before anything is sent; a record a node refuses the whole call for (a 400 or 413
        naming it) alone, named `records[i]` by its place in `records`, the call's other
        records sent again. A call refused as too large is split and sent again. Raises for
        a refusal of a whole call that names no record (401, 403, 415...)."""
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        pairs = _pairs(records)
        queues = [q for q, _ in pairs]
        encoded = [encode_for_many(q, v) for q, v in pairs]
        results: list[RecordResult | None] = [None] * len(pairs)
        last: dict[int, VQError] = {}
        todo: list[int] = []
        for i, q in enumerate(queues):
            bad = name_error(q, f"records[{i}].queue")
            if bad is None:
                todo.append(i)
            else:
                results[i] = RecordResult(q, -1, None, bad)
        delay = self.backoff_initial_s
        while todo:
            try:
                await self._fresh_map()
            except VQError as exc:  # no node answers: wait and ask again, until the deadline
                if not exc.retriable:
                    raise
                last.update(dict.fromkeys(todo, exc))
            else:
                fit = []
                for i in todo:
                    bad = self.size_error(f"records[{i}]", *encoded[i])
                    if bad is None:
                        fit.append(i)
                    else:
                        results[i] = RecordResult(queues[i], self._partition_of(queues[i]),
                                                  None, bad)
                by_owner: dict[str, list[int]] = {}
                for i in fit:
                    by_owner.setdefault(self.cached_owner(queues[i]), []).append(i)
                rounds = await asyncio.gather(*(
                    self._enqueue_at(url, queues, encoded, indices, results, last)
                    for url, indices in by_owner.items()))
                todo = sorted(i for retry, _ in rounds for i in retry)
                if not todo:
                    break
                if any(refresh for _, refresh in rounds):
                    await self._refresh_quietly()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for i in todo:
                    q = queues[i]
                    results[i] = RecordResult(q, self._partition_of(q), None,
                                              DeadlineExceeded(last.get(i)))
                break
            if not all(last[i].code == "wrong_node" for i in todo):
                await asyncio.sleep(min(remaining, random.uniform(0, delay)))  # full jitter
                delay = min(self.backoff_max_s, delay * 2)
        return [r for r in results if r is not None]

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

    def _partition_of(self, queue: str) -> int:
        return partition_for(queue, self.partitions) if self.partitions else -1

    async def _enqueue_at(self, url: str, queues: list[str], encoded: list[tuple[bytes, int]],
                          indices: list[int], results: list[RecordResult | None],
                          last: dict[int, VQError]) -> tuple[list[int], bool]:
        """Send `indices` to the node at `url`, in calls within its limits, one after
        another; fill `results`. Returns the indices to send again and whether the map should
        be refreshed. A queue that failed retriably in one call has its later records held
        back for the next round, so they cannot overtake."""
        retry: list[int] = []
        refresh = False
        held: set[str] = set()
        sizes = [len(data) for data, _ in encoded]
        work = deque(self.chunks(indices, sizes))
        while work:
            chunk: list[int] = []
            for i in work.popleft():
                (retry if queues[i] in held else chunk).append(i)
            if not chunk:
                continue
            try:
                answers = await self.post_encoded(url, [encoded[i][0] for i in chunk])
            except VQError as exc:
                if exc.retriable:
                    refresh = refresh or exc.status in (0, 503)
                    for i in chunk:
                        retry.append(i)
                        last[i] = exc
                        held.add(queues[i])
                    continue
                at = named_record(exc, len(chunk))
                if at is None and len(chunk) == 1 and exc.code == "payload_too_large":
                    at = 0
                if at is not None:  # that record fails alone; the others go again
                    i = chunk[at]
                    results[i] = RecordResult(queues[i], self._partition_of(queues[i]), None,
                                              self._in_call(exc, chunk))
                    if len(chunk) > 1:
                        work.appendleft(chunk[:at] + chunk[at + 1:])
                    continue
                if exc.code in ("payload_too_large", "too_many_records"):
                    self.learn_refusal(exc, [sizes[i] for i in chunk])
                    work.extendleft(reversed(self.chunks(chunk, sizes)))
                    continue
                raise
            for i, answer in zip(chunk, answers, strict=True):
                q = queues[i]
                if "error" not in answer:
                    results[i] = RecordResult(q, answer["partition"], answer.get("offset"))
                    continue
                err = _error_from(int(answer.get("status", 0)), answer)
                if err.retriable or err.code == "wrong_node":
                    retry.append(i)
                    last[i] = err
                    held.add(q)
                    refresh = refresh or err.code in ("wrong_node", "partition_unavailable")
                else:
                    results[i] = RecordResult(q, answer.get("partition", -1), None,
                                              self._in_call(err, chunk))
        return retry, refresh

    @staticmethod
    def _in_call(err: VQError, chunk: list[int]) -> VQError:
        """`err`, about a call of `chunk`'s records, naming them by their place in the
        caller's list."""
        def ours(k: int) -> int:
            return chunk[k] if 0 <= k < len(chunk) else k
        return renamed(err, lambda k: f"records[{ours(k)}]", ours)

    async def post_records(self, url: str, items: list[dict[str, Any]]
                           ) -> list[dict[str, Any]]:
        """One `POST /v1/records` to one node, not retried: its per-record answers. Raises
        VQError for a refusal of the whole request, or a transport failure (status 0)."""
        return await self.post_encoded(url, [
            jsonlib.dumps(item, separators=(",", ":")).encode() for item in items])

    async def post_encoded(self, url: str, records: list[bytes]) -> list[dict[str, Any]]:
        """`post_records` with each record already encoded (`encode_for_many`): the body is
        exactly `request_bytes` of their sizes."""
        body = b'{"records":[' + b",".join(records) + b"]}"
        try:
            # A file-like body: aiohttp warns of (and writes at once) raw bytes over 1 MiB.
            async with self.session.post(f"{url}/v1/records", data=io.BytesIO(body), headers={
                    **self.headers, "Content-Type": "application/json"}) as r:
                answer = await r.json(content_type=None) if r.content_length != 0 else None
                if r.status >= 300:
                    raise _error_from(r.status, answer, r.reason or "")
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise VQError(0, "connection_error", f"{url}: {exc}", retriable=True) from None
        assert isinstance(answer, dict) and isinstance(answer.get("results"), list), answer
        return list(answer["results"])

    async def read(self, queue: str, *, consumer: str | None = None, offset: int | None = None,
                   limit: int | None = None, wait_ms: int | None = None,
                   tag: str | None = None) -> ReadResult:
        params = {k: str(v) for k, v in (("consumer", consumer), ("offset", offset),
                                         ("limit", limit), ("wait_ms", wait_ms), ("tag", tag))
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

    async def cancel_scheduled(self, queue: str, record_id: int) -> dict[str, Any] | None:
        """Cancel a scheduled record (its id: the offset its enqueue answered) before it is
        due; None if it is not waiting any more."""
        return await self._call_obj("DELETE", queue,
                                    f"/v1/queues/{self._q(queue)}/scheduled/{record_id}",
                                    ok404=True)

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

    async def _get_node(self, url: str, path: str, params: dict[str, str] | None = None
                        ) -> tuple[int, Any]:
        """One GET to one node (no routing, no retry): (status, JSON body)."""
        async with self.session.get(url + path, params=params, headers=self.headers) as r:
            return r.status, await r.json(content_type=None)

    async def node_urls(self) -> list[str]:
        """Every node in the cluster map (the seeds if no partition has an owner yet)."""
        await self.refresh_map()
        return sorted(set(self.owners.values())) or list(self.seeds)

    async def list_queues(self, prefix: str = "", *, limit: int | None = None,
                          stats: bool = False) -> list[Any]:
        """Queue names (or, with `stats`, one summary dict each) across the whole cluster,
        sorted by name: every node's listing, paged and merged."""
        out: list[Any] = []
        for url in await self.node_urls():
            after: str | None = None
            while True:
                params = {"prefix": prefix, "limit": "1000", "stats": str(stats).lower()}
                if after is not None:
                    params["after"] = after
                status, body = await self._get_node(url, "/v1/queues", params)
                if status != 200:
                    raise _error_from(status, body)
                out.extend(body["stats"] if stats else body["queues"])
                after = body["next_after"]
                if after is None or (limit is not None and len(out) >= limit * 2):
                    break
        out.sort(key=(lambda x: x["queue"]) if stats else (lambda x: x))
        return out if limit is None else out[:limit]

    async def nodes(self) -> list[dict[str, Any]]:
        """Each node's own view: its `/readyz` answer (`status`, `owned`, `ready`, `details`:
        per owned partition its replay progress) or, if it did not answer, `error`."""
        out = []
        for url in await self.node_urls():
            try:
                status, body = await self._get_node(url, "/readyz")
                out.append({"url": url, **body} if isinstance(body, dict)
                           else {"url": url, "error": f"HTTP {status}"})
            except (aiohttp.ClientError, TimeoutError) as exc:
                out.append({"url": url, "status": "unreachable", "error": str(exc)})
        return out

    async def find_offset(self, queue: str, timestamp_ms: int) -> int:
        """The offset of the queue's first record stamped at or after `timestamp_ms` (the
        queue's end if none): a binary search over one-record reads, like Kafka's
        offsets-for-times. Assumes the queue's timestamps do not go back in time."""
        info = await self.queue_info(queue)
        if info is None or info["first_offset"] is None:
            raise VQError(404, "queue_not_found", f"queue {queue!r} has no records")
        lo, hi = int(info["first_offset"]), int(info["last_offset"]) + 1
        end = hi
        while lo < hi:  # the smallest start whose first record is at or after timestamp_ms
            mid = (lo + hi) // 2
            page = await self.read(queue, offset=mid, limit=1)
            if page.records and page.records[0].timestamp < timestamp_ms:
                lo = page.records[0].offset + 1
            else:
                hi = mid
        page = await self.read(queue, offset=lo, limit=1)
        return page.records[0].offset if page.records else end

    # Work queues (docs/work-queues.md) --------------------------------------------------------

    def _c(self, queue: str, consumer: str) -> str:
        return f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}"

    async def configure_consumer(self, queue: str, consumer: str, *, mode: str | None = None,
                                 max_attempts: int | None = None,
                                 dead_letter_queue: str | None = _UNSET,
                                 visibility_ms: int | None = None) -> dict[str, Any]:
        """Set a consumer's settings; fields left out keep their value (`dead_letter_queue=None`
        removes the dead-letter queue)."""
        body: dict[str, Any] = {k: v for k, v in (("mode", mode), ("max_attempts", max_attempts),
                                                  ("visibility_ms", visibility_ms))
                                if v is not None}
        if dead_letter_queue is not _UNSET:
            body["dead_letter_queue"] = dead_letter_queue
        out = await self._call_obj("PUT", queue, self._c(queue, consumer), json=body)
        assert out is not None
        return out

    async def consumer_settings(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj("GET", queue, self._c(queue, consumer), ok404=True)

    async def lease(self, queue: str, consumer: str, *, max_records: int = 1,
                    visibility_ms: int | None = None, wait_ms: int = 0,
                    tag: str | None = None,
                    complete: Lease | str | list[Lease] | list[str] | list[Lease | str] |
                    None = None) -> LeasePage[str]:
        """Lease up to `max_records` records no other worker holds (long poll: `wait_ms`).

        `complete`: leases (or tokens) finished since, at most 10,000, completed first in the
        same call, token by token: the answer's `completed` (tokens) and `refused`
        (`Refused`) say what each did. If the call raises, some may have been completed: send
        them again (completing is idempotent). A lease whose answer is lost (a retried call)
        simply expires: its records come again, with the next attempt number."""
        body: dict[str, Any] = {"max_records": max_records, "wait_ms": wait_ms}
        if visibility_ms is not None:
            body["visibility_ms"] = visibility_ms
        if tag is not None:
            body["tag"] = tag
        if complete is not None:
            body["complete"] = self._tokens(complete)
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/lease", json=body,
                                   deadline_s=self.deadline_s + wait_ms / 1000)
        assert out is not None
        return LeasePage([Lease(_decode_record(r), r["token"], r["attempt"], r["deadline"])
                          for r in out["records"]],
                         [str(t) for t in out.get("completed") or []],
                         [Refused(str(r["token"]), str(r["code"]))
                          for r in out.get("refused") or []])

    @staticmethod
    def _tokens(leases: Lease | str | list[Lease] | list[str] | list[Lease | str]) -> list[str]:
        items = leases if isinstance(leases, list) else [leases]
        return [x.token if isinstance(x, Lease) else x for x in items]

    async def complete(self, queue: str, consumer: str,
                       leases: Lease | str | list[Lease] | list[str] | list[Lease | str]
                       ) -> dict[str, Any]:
        """Finish leased records for good (by Lease or token); 409 `lease_expired` if a lease
        is not current any more (then nothing was done)."""
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/complete",
                                   json={"tokens": self._tokens(leases)})
        assert out is not None
        return out

    async def retry(self, queue: str, consumer: str,
                    leases: Lease | str | list[Lease] | list[str] | list[Lease | str], *,
                    delay_ms: int = 0, reason: str | None = None) -> dict[str, Any]:
        """Give leased records back, available again after `delay_ms`; a record that used up
        its attempts goes to the consumer's dead-letter queue instead."""
        body: dict[str, Any] = {"tokens": self._tokens(leases), "delay_ms": delay_ms}
        if reason is not None:
            body["reason"] = reason
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/retry", json=body)
        assert out is not None
        return out

    async def extend(self, queue: str, consumer: str,
                     leases: Lease | str | list[Lease] | list[str] | list[Lease | str],
                     visibility_ms: int) -> dict[str, Any]:
        """Move the leases' deadline to now + `visibility_ms`."""
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/extend",
                                   json={"tokens": self._tokens(leases),
                                         "visibility_ms": visibility_ms})
        assert out is not None
        return out

    # Prefix consumers: one pool of workers for every queue under a prefix ------------------------

    def _p(self, consumer: str) -> str:
        return f"/v1/prefix-consumers/{self._q(consumer)}"

    async def configure_prefix_consumer(self, consumer: str, prefix: str, *,
                                        max_attempts: int | None = None,
                                        visibility_ms: int | None = None,
                                        dead_letter_queue: str | None = None,
                                        max_in_flight: int | None = None,
                                        weights: dict[str, int] | None = None,
                                        records_per_turn: int | None = None
                                        ) -> dict[str, Any]:
        """Define (or redefine) `consumer` over every queue whose name starts with `prefix`
        (docs/work-queues.md); `dead_letter_queue` may hold `{queue}`: one per queue."""
        options = (("max_attempts", max_attempts), ("visibility_ms", visibility_ms),
                   ("dead_letter_queue", dead_letter_queue), ("max_in_flight", max_in_flight),
                   ("weights", weights), ("records_per_turn", records_per_turn))
        body: dict[str, Any] = {"prefix": prefix}
        body.update((name, value) for name, value in options if value is not None)
        out = await self._call_obj("PUT", None, self._p(consumer), json=body)
        assert out is not None
        return out

    async def delete_prefix_consumer(self, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj("DELETE", None, self._p(consumer), ok404=True)

    async def prefix_consumers(self) -> list[dict[str, Any]]:
        """Every prefix consumer, with its queues, queues waiting for a turn, records in flight
        and backlog summed over the nodes."""
        merged: dict[str, dict[str, Any]] = {}
        for url in await self.node_urls():
            status, body = await self._get_node(url, "/v1/prefix-consumers")
            if status != 200:
                raise _error_from(status, body)
            for info in body["prefix_consumers"]:
                seen = merged.setdefault(info["consumer"], {**info, **dict.fromkeys(_COUNTS, 0)})
                for count in _COUNTS:
                    seen[count] += info[count]
        return [merged[c] for c in sorted(merged)]

    async def lease_prefix(self, consumer: str, node: str, *, max_records: int = 1,
                           visibility_ms: int | None = None, wait_ms: int = 0,
                           complete: list[Lease] | list[tuple[str, str]] |
                           list[Lease | tuple[str, str]] | None = None
                           ) -> LeasePage[tuple[str, str]]:
        """Lease up to `max_records` records from the queues under `consumer`'s prefix that
        `node` (a URL of `node_urls()`) owns, queue by queue in turn. Settle them with the
        same node.

        `complete`: leases from prefix leases of this node, or `(queue, token)` pairs, at
        most 10,000, completed first in the same call, token by token: the answer's
        `completed` (`(queue, token)` pairs) and `refused` (`Refused`, with `queue`; code
        `wrong_node` for a queue this node does not serve) say what each did."""
        body: dict[str, Any] = {"max_records": max_records, "wait_ms": wait_ms}
        if visibility_ms is not None:
            body["visibility_ms"] = visibility_ms
        if complete is not None:
            body["complete"] = self._pairs(complete)
        out = await self._call_node(node, "POST", self._p(consumer) + "/lease", json=body,
                                    deadline_s=self.deadline_s + wait_ms / 1000)
        return LeasePage([Lease(_decode_record(r), r["token"], r["attempt"], r["deadline"],
                                r["queue"], r["partition"]) for r in out["records"]],
                         [(str(t["queue"]), str(t["token"])) for t in out.get("completed") or []],
                         [Refused(str(r["token"]), str(r["code"]), str(r["queue"]))
                          for r in out.get("refused") or []])

    @staticmethod
    def _pairs(leases: list[Lease] | list[tuple[str, str]] | list[Lease | tuple[str, str]]
               ) -> list[dict[str, str]]:
        out = []
        for x in leases:
            if isinstance(x, Lease):
                if x.queue is None:
                    raise ValueError("prefix calls take leases from a prefix lease (they name "
                                     "a queue)")
                out.append({"queue": x.queue, "token": x.token})
            else:
                queue, token = x
                out.append({"queue": queue, "token": token})
        return out

    async def complete_prefix(self, consumer: str, node: str, leases: list[Lease]
                              ) -> dict[str, Any]:
        """Complete leases of many queues at once; all or nothing (409 `lease_expired` names
        every stale one as {"queue", "token"})."""
        return await self._call_node(node, "POST", self._p(consumer) + "/complete",
                                     json={"tokens": self._pairs(leases)})

    async def retry_prefix(self, consumer: str, node: str, leases: list[Lease], *,
                           delay_ms: int = 0, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"tokens": self._pairs(leases), "delay_ms": delay_ms}
        if reason is not None:
            body["reason"] = reason
        return await self._call_node(node, "POST", self._p(consumer) + "/retry", json=body)

    async def extend_prefix(self, consumer: str, node: str, leases: list[Lease],
                            visibility_ms: int) -> dict[str, Any]:
        return await self._call_node(node, "POST", self._p(consumer) + "/extend",
                                     json={"tokens": self._pairs(leases),
                                           "visibility_ms": visibility_ms})
