"""A batching producer: many small sends become few requests, in send order per queue."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

from vqueues_client.client import AsyncClient, NewRecord, Value, _encode_item, _error_from
from vqueues_client.errors import DeadlineExceeded, VQError


@dataclass(slots=True)
class _Pending:
    record: NewRecord
    future: asyncio.Future[int | None]
    since: float = field(default_factory=time.monotonic)


class BatchProducer:
    """`async with BatchProducer(client) as p: offset = await p.send("q", "x")`.

    Records sent within `linger_ms` (or until `max_batch` of them wait) go to the nodes in one
    multi-queue request (`POST /v1/records`) per owner node, whatever their queues, each with its
    own headers; the owners are called in parallel. A queue has at most one request in flight,
    so records sent A, B, C to one queue get increasing offsets in that order. A record that
    fails retriably (its partition moved: `wrong_node`, and the cluster map is refreshed; a
    rebalance or replay under way; a broker error; a lost connection) is sent again, ahead of
    the queue's later records, with backoff, until the client's `deadline_s` since its `send`.
    Each `send` resolves to its record's offset once written, or raises its error: a record that
    fails for good fails the queue's records sent after it too, so none overtakes a failed one.
    """

    def __init__(self, client: AsyncClient, *, linger_ms: int = 5, max_batch: int = 1000
                 ) -> None:
        self.client = client
        self.linger_s = linger_ms / 1000
        self.max_batch = min(max_batch, client.max_records_per_call)
        self.requests = 0  # multi-queue requests sent
        self._queued: dict[str, deque[_Pending]] = {}  # per queue: not yet in a request
        self._count = 0
        self._busy: set[str] = set()  # queues with a request in flight
        self._not_before: dict[str, float] = {}  # queues backing off after a retriable failure
        self._delay: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._refreshing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BatchProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    def send_nowait(self, queue: str, value: Value, headers: dict[str, str] | None = None, *,
                    idempotency_key: str | None = None, tags: list[str] | None = None,
                    deliver_at: int | None = None, delay_ms: int | None = None
                    ) -> asyncio.Future[int | None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        record = NewRecord(value, headers, idempotency_key, tags, deliver_at, delay_ms)
        self._queued.setdefault(queue, deque()).append(_Pending(record, fut))
        self._count += 1
        if self._count >= self.max_batch:
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
        `max_batch` records), and send them."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        client = self.client
        if client.map_stale:
            if self._refreshing is None:
                self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
            return
        now = time.monotonic()
        requests: dict[str, list[list[tuple[str, list[_Pending]]]]] = {}
        sizes: dict[str, int] = {}
        wake = None
        for queue in list(self._queued):
            if queue in self._busy:
                continue
            not_before = self._not_before.get(queue, 0.0)
            if not_before > now:
                wake = min(wake or not_before, not_before)
                continue
            pending = self._queued[queue]
            url = client.cached_owner(queue)
            chunks = requests.setdefault(url, [[]])
            if sizes.get(url, 0) >= self.max_batch:
                chunks.append([])
                sizes[url] = 0
            room = self.max_batch - sizes.get(url, 0)
            take = [pending.popleft() for _ in range(min(room, len(pending)))]
            if not pending:
                del self._queued[queue]
            self._count -= len(take)
            sizes[url] = sizes.get(url, 0) + len(take)
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

    async def _refresh(self) -> None:
        try:
            await self.client._fresh_map()
        except VQError as exc:  # no node answers: what waits fails, in order
            for queue in list(self._queued):
                self._fail(queue, [], exc)
        finally:
            self._refreshing = None
        if self._queued:
            self._dispatch()

    async def _send(self, url: str, groups: list[tuple[str, list[_Pending]]]) -> None:
        refresh = False
        try:
            items = [{"queue": q, **_encode_item(p.record, None)} for q, ps in groups for p in ps]
            self.requests += 1
            try:
                answers = await self.client.post_records(url, items)
            except VQError as exc:
                for queue, pending in groups:
                    refresh = self._failed(queue, pending, exc) or refresh
                return
            at = 0
            for queue, pending in groups:
                mine, at = answers[at:at + len(pending)], at + len(pending)
                for n, (p, answer) in enumerate(zip(pending, mine, strict=True)):
                    if "error" in answer:
                        err = _error_from(int(answer.get("status", 0)), answer)
                        refresh = self._failed(queue, pending[n:], err) or refresh
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

    def _failed(self, queue: str, pending: list[_Pending], err: VQError) -> bool:
        """`pending` (the queue's oldest records) failed with `err`: put them back at the head
        of the queue to go again, or fail them and everything after them. True if the cluster
        map should be refreshed."""
        now = time.monotonic()
        retriable = err.retriable or err.code == "wrong_node"
        if not retriable or now - pending[0].since > self.client.deadline_s:
            self._fail(queue, pending, err if not retriable else DeadlineExceeded(err))
            return False
        self._queued.setdefault(queue, deque()).extendleft(reversed(pending))
        self._count += len(pending)
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
