"""A batching producer: many small sends become few requests, in send order per queue."""

from __future__ import annotations

import asyncio

from vqueues_client.client import AsyncClient, NewRecord, Value

_Pending = tuple[NewRecord, "asyncio.Future[int | None]"]


class BatchProducer:
    """`async with BatchProducer(client) as p: offset = await p.send("q", "x")`.

    Records for the same queue sent within `linger_ms` (or until `max_batch` of them) go in one
    request, each with its own headers. A queue's batches are sent one after another, never
    side by side, so records sent A, B, C to one queue get increasing offsets in that order;
    different queues' batches go in parallel. Each `send` resolves to its record's offset once
    its batch was acknowledged (or raises the batch's error: that batch and the ones queued
    behind it for the same queue fail, so no later record overtakes a failed one).
    """

    def __init__(self, client: AsyncClient, *, linger_ms: int = 5, max_batch: int = 500) -> None:
        self.client = client
        self.linger_s = linger_ms / 1000
        self.max_batch = max_batch
        self._pending: dict[str, list[_Pending]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Per queue: the batches closed but not yet sent, and the task sending them in order.
        self._closed: dict[str, list[list[_Pending]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def __aenter__(self) -> BatchProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    def send_nowait(self, queue: str, value: Value, headers: dict[str, str] | None = None, *,
                    idempotency_key: str | None = None, tags: list[str] | None = None,
                    deliver_at: int | None = None, delay_ms: int | None = None
                    ) -> asyncio.Future[int | None]:
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        batch = self._pending.setdefault(queue, [])
        batch.append((NewRecord(value, headers, idempotency_key, tags, deliver_at, delay_ms),
                      fut))
        if len(batch) >= self.max_batch:
            self._close(queue)
        elif queue not in self._timers:
            self._timers[queue] = asyncio.get_running_loop().call_later(
                self.linger_s, self._close, queue)
        return fut

    async def send(self, queue: str, value: Value, headers: dict[str, str] | None = None, *,
                   idempotency_key: str | None = None, tags: list[str] | None = None,
                   deliver_at: int | None = None, delay_ms: int | None = None) -> int | None:
        """Send one record; returns its offset (None if the node writes with acks=0). With an
        `idempotency_key`, a record whose batch is retried is still written once; `tags`,
        `deliver_at` and `delay_ms` are passed per record."""
        return await self.send_nowait(queue, value, headers, idempotency_key=idempotency_key,
                                      tags=tags, deliver_at=deliver_at, delay_ms=delay_ms)

    def _close(self, queue: str) -> None:
        """The queue's pending records become a batch, sent after the queue's earlier ones."""
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        batch = self._pending.pop(queue, [])
        if not batch:
            return
        self._closed.setdefault(queue, []).append(batch)
        if queue not in self._senders:
            task = asyncio.get_running_loop().create_task(self._send_in_order(queue))
            self._senders[queue] = task

    async def _send_in_order(self, queue: str) -> None:
        failure: BaseException | None = None
        try:
            while self._closed.get(queue):
                batch = self._closed[queue].pop(0)
                if failure is None:
                    try:
                        res = await self.client.enqueue(queue, [rec for rec, _ in batch])
                    except Exception as exc:
                        failure = exc
                    else:
                        for i, (_, fut) in enumerate(batch):
                            if not fut.done():
                                fut.set_result(res.offsets[i] if res.offsets else None)
                        continue
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(failure)
        finally:
            self._closed.pop(queue, None)
            self._senders.pop(queue, None)

    async def flush(self) -> None:
        """Send everything pending and wait for it."""
        for queue in list(self._pending):
            self._close(queue)
        while self._senders:
            await asyncio.gather(*list(self._senders.values()), return_exceptions=True)
