"""A batching producer: many small sends become few requests, in send order per queue."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

from vqueues_client.client import AsyncClient
from vqueues_client.encoding import (
    encode_for_many,
    error_from,
    name_error,
    named_record,
    renamed,
    request_bytes,
)
from vqueues_client.errors import DeadlineExceeded, VQError
from vqueues_client.types import NewRecord, Value


@dataclass(slots=True)
class _Pending:
    data: bytes  # the record as sent (encode_for_many)
    value_bytes: int  # its value's decoded size
    future: asyncio.Future[int | None]
    since: float = field(default_factory=time.monotonic)


class BatchProducer:
    """`async with BatchProducer(client) as p: offset = await p.send("q", "x")`.

    Records sent within `linger_ms` (or until `max_batch` of them wait) go to the nodes in one
    multi-queue request (`POST /v1/records`) per owner node, whatever their queues, each with its
    own headers; the owners are called in parallel. A request holds at most `max_batch` records
    and the node's `max_batch_records`, in at most its `max_body_bytes` (the client's limits,
    from the cluster map). A queue has at most one request in flight, so records sent A, B, C
    to one queue get increasing offsets in that order. A record that fails retriably (its
    partition moved: `wrong_node`, and the cluster map is refreshed; a rebalance or replay under
    way; a broker error; a lost connection; no node answering) is sent again, ahead of the
    queue's later records, with backoff, until the client's `deadline_s` since its `send`. Each
    `send` resolves to its record's offset once written, or raises its error: a record that
    fails for good fails the queue's records sent after it too, so none overtakes a failed one.
    A bad queue name fails its `send` at once; a value over `max_record_bytes` fails before it
    is sent; a record a node refuses a whole request for (a 400 or 413 naming it) fails, named
    by its queue, and the request's other records are sent again; a request refused as too
    large is split and sent again.
    """

    def __init__(self, client: AsyncClient, *, linger_ms: int = 5, max_batch: int = 1000
                 ) -> None:
        self.client = client
        self.linger_s = linger_ms / 1000
        self.max_batch = max_batch
        self.requests = 0  # multi-queue requests sent
        self._queued: dict[str, deque[_Pending]] = {}  # per queue: not yet in a request
        self._count = 0
        self._busy: set[str] = set()  # queues with a request in flight
        self._not_before: dict[str, float] = {}  # queues backing off after a retriable failure
        self._delay: dict[str, float] = {}
        self._map_delay = client.backoff_initial_s  # while no node answers for the map
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BatchProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    @property
    def _batch(self) -> int:
        return max(1, min(self.max_batch, self.client.max_records_per_call))

    def send_nowait(self, queue: str, value: Value, headers: dict[str, str] | None = None, *,
                    idempotency_key: str | None = None, tags: list[str] | None = None,
                    deliver_at: int | None = None, delay_ms: int | None = None
                    ) -> asyncio.Future[int | None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        bad = name_error(queue)
        if bad is not None:  # never queued: it holds nothing else back
            fut.set_exception(bad)
            return fut
        record = NewRecord(value, headers, idempotency_key, tags, deliver_at, delay_ms)
        data, value_bytes = encode_for_many(queue, record)
        self._queued.setdefault(queue, deque()).append(_Pending(data, value_bytes, fut))
        self._count += 1
        if self._count >= self._batch:
            self._dispatch()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_s, self._dispatch)
        return fut

    async def send(self, queue: str, value: Value, headers: dict[str, str] | None = None, *,
                   idempotency_key: str | None = None, tags: list[str] | None = None,
                   deliver_at: int | None = None, delay_ms: int | None = None) -> int | None:
        """Send one record; returns its offset (None if the node writes with acks=0). With an
        `idempotency_key`, a record whose request is retried is still written once; `tags`,
        `deliver_at` and `delay_ms` are passed per record."""
        return await self.send_nowait(queue, value, headers, idempotency_key=idempotency_key,
                                      tags=tags, deliver_at=deliver_at, delay_ms=delay_ms)

    def _dispatch(self) -> None:
        """Put every queued record that may go now into requests, one per owner (and per
        `max_batch` records, or the node's body limit), and send them."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        client = self.client
        if client.map_stale:
            if self._refreshing is None:
                self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
            return
        now = time.monotonic()
        batch, body_limit = self._batch, client.max_body_bytes
        requests: dict[str, list[list[tuple[str, list[_Pending]]]]] = {}
        sizes: dict[str, tuple[int, int]] = {}  # per owner: the last request's records, bytes
        wake = None
        for queue in list(self._queued):
            if queue in self._busy:
                continue
            not_before = self._not_before.get(queue, 0.0)
            if not_before > now:
                wake = min(wake or not_before, not_before)
                continue
            pending = self._queued[queue]
            bad = client.size_error(f"the record sent to queue {queue!r}", pending[0].data,
                                    pending[0].value_bytes)
            if bad is not None:  # too large to send: it fails, with those behind it
                self._fail(queue, [], bad)
                continue
            url = client.cached_owner(queue)
            chunks = requests.setdefault(url, [[]])
            count, size = sizes.get(url, (0, 0))
            if count and (count >= batch or
                          request_bytes([size, len(pending[0].data)]) > body_limit):
                chunks.append([])
                count, size = 0, 0
            take, count, size = self._take(pending, count, size, batch, body_limit)
            if not pending:
                del self._queued[queue]
            if not take:
                continue
            self._count -= len(take)
            sizes[url] = (count, size)
            chunks[-1].append((queue, take))
            self._busy.add(queue)
        for url, chunks in requests.items():
            for groups in chunks:
                if groups:
                    task = asyncio.get_running_loop().create_task(self._send(url, groups))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        if wake is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, wake - now), self._dispatch)

    def _take(self, pending: deque[_Pending], count: int, size: int, batch: int,
              body_limit: int) -> tuple[list[_Pending], int, int]:
        """The records of one queue that fit the request being filled (`count` records,
        `size` bytes so far), taken from the head of `pending`; and the new count and size."""
        take: list[_Pending] = []
        while pending and count < batch:
            p = pending[0]
            if count and request_bytes([size, len(p.data)]) > body_limit:
                break
            if self.client.size_error("", p.data, p.value_bytes) is not None:
                break  # it fails once it heads its queue: after these are written
            take.append(pending.popleft())
            size += len(p.data) + (1 if count else 0)
            count += 1
        return take, count, size

    async def _refresh(self) -> None:
        """Fetch the cluster map; while no node answers, try again with backoff, failing only
        the records whose deadline passed."""
        try:
            await self.client._fresh_map()
            self._map_delay = self.client.backoff_initial_s
        except VQError as exc:
            now = time.monotonic()
            for queue in list(self._queued):
                if not exc.retriable:
                    self._fail(queue, [], exc)
                elif now - self._queued[queue][0].since > self.client.deadline_s:
                    self._fail(queue, [], DeadlineExceeded(exc))
            if self._queued:
                await asyncio.sleep(random.uniform(0, self._map_delay))  # full jitter
                self._map_delay = min(self.client.backoff_max_s, self._map_delay * 2)
        finally:
            self._refreshing = None
        if self._queued:
            self._dispatch()

    async def _send(self, url: str, groups: list[tuple[str, list[_Pending]]]) -> None:
        refresh = False
        try:
            self.requests += 1
            try:
                answers = await self.client.post_encoded(
                    url, [p.data for _, ps in groups for p in ps])
            except VQError as exc:
                refresh = self._refused(groups, exc)
                return
            at = 0
            for queue, pending in groups:
                mine, at = answers[at:at + len(pending)], at + len(pending)
                for n, (p, answer) in enumerate(zip(pending, mine, strict=True)):
                    if "error" in answer:
                        err = error_from(int(answer.get("status", 0)), answer)
                        refresh = self._failed(queue, pending[n:], self._ours(err, groups)) \
                            or refresh
                        break
                    if not p.future.done():
                        p.future.set_result(answer.get("offset"))
                else:
                    self._delay.pop(queue, None)
                    self._not_before.pop(queue, None)
        finally:
            if refresh:
                await self.client._refresh_quietly()
            for queue, _ in groups:
                self._busy.discard(queue)
            if self._queued:
                self._dispatch()

    @staticmethod
    def _ours(err: VQError, groups: list[tuple[str, list[_Pending]]]) -> VQError:
        """`err` naming records by their queue, not by their place in the producer's
        request."""
        queues = [q for q, ps in groups for _ in ps]

        def name(k: int) -> str:
            return f"the record sent to queue {queues[k]!r}" if 0 <= k < len(queues) else \
                "a record"
        return renamed(err, name, lambda k: None)

    def _refused(self, groups: list[tuple[str, list[_Pending]]], err: VQError) -> bool:
        """A node refused the request of `groups` as a whole (or it was not delivered):
        send it again, split, or without the one record it names; or fail it. True if the
        cluster map should be refreshed."""
        if err.retriable:
            refresh = False
            for queue, pending in groups:
                refresh = self._failed(queue, pending, err) or refresh
            return refresh
        total = sum(len(ps) for _, ps in groups)
        at = named_record(err, total)
        if at is None and total == 1 and err.code == "payload_too_large":
            at = 0
        if at is not None:  # that record fails (with its queue's later ones); the rest go again
            mine = self._ours(err, groups)
            for queue, pending in groups:
                if 0 <= at < len(pending):
                    self._fail(queue, pending[at:], mine)
                    self._requeue(queue, pending[:at])
                else:
                    self._requeue(queue, pending)
                at -= len(pending)
            return False
        if err.code in ("payload_too_large", "too_many_records"):
            self.client.learn_refusal(err, [len(p.data) for _, ps in groups for p in ps])
            for queue, pending in groups:
                self._requeue(queue, pending)
            return False
        for queue, pending in groups:
            self._fail(queue, pending, err)
        return False

    def _requeue(self, queue: str, pending: list[_Pending]) -> None:
        """Put `pending` back at the head of its queue, to go in the next request."""
        if pending:
            self._queued.setdefault(queue, deque()).extendleft(reversed(pending))
            self._count += len(pending)

    def _failed(self, queue: str, pending: list[_Pending], err: VQError) -> bool:
        """`pending` (the queue's oldest records) failed with `err`: put them back at the head
        of the queue to go again, or fail them and everything after them. True if the cluster
        map should be refreshed."""
        now = time.monotonic()
        retriable = err.retriable or err.code == "wrong_node"
        if not retriable or now - pending[0].since > self.client.deadline_s:
            self._fail(queue, pending, err if not retriable else DeadlineExceeded(err))
            return False
        self._requeue(queue, pending)
        if err.code != "wrong_node":  # moved: go to the new owner at once; else back off
            delay = self._delay.get(queue, self.client.backoff_initial_s)
            self._not_before[queue] = now + random.uniform(0, delay)  # full jitter
            self._delay[queue] = min(self.client.backoff_max_s, delay * 2)
        return err.code in ("wrong_node", "partition_unavailable", "connection_error")

    def _fail(self, queue: str, pending: list[_Pending], err: VQError) -> None:
        """Fail `pending` and every record of the queue still waiting behind it."""
        behind = self._queued.pop(queue, deque())
        self._count -= len(behind)
        for p in (*pending, *behind):
            if not p.future.done():
                p.future.set_exception(err)
        self._not_before.pop(queue, None)
        self._delay.pop(queue, None)

    async def flush(self) -> None:
        """Send everything pending and wait for it."""
        while self._queued or self._tasks or self._refreshing is not None:
            self._dispatch()
            waiting = [*self._tasks, *([self._refreshing] if self._refreshing else [])]
            if waiting:
                await asyncio.wait(waiting)
            elif self._queued:  # all backing off
                await asyncio.sleep(max(0.001, min(self._not_before.values(), default=0)
                                        - time.monotonic()))
