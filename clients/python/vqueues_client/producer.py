"""A batching producer: many small sends become few requests, one per queue per flush."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from vqueues_client.client import AsyncClient, Value


class BatchProducer:
    """`async with BatchProducer(client) as p: offset = await p.send("q", "x")`.

    Records for the same queue sent within `linger_ms` (or until `max_batch` of them) go in one
    request; each `send` resolves to its record's offset once the batch was acknowledged.
    """

    def __init__(self, client: AsyncClient, *, linger_ms: int = 5, max_batch: int = 500) -> None:
        self.client = client
        self.linger_s = linger_ms / 1000
        self.max_batch = max_batch
        self._pending: dict[str, list[tuple[Value, dict[str, str] | None,
                                            asyncio.Future[int | None]]]] = defaultdict(list)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._inflight: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> BatchProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    def send_nowait(self, queue: str, value: Value, headers: dict[str, str] | None = None
                    ) -> asyncio.Future[int | None]:
        fut: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        batch = self._pending[queue]
        batch.append((value, headers, fut))
        if len(batch) >= self.max_batch:
            self._launch(queue)
        elif queue not in self._timers:
            self._timers[queue] = asyncio.get_running_loop().call_later(
                self.linger_s, self._launch, queue)
        return fut

    async def send(self, queue: str, value: Value, headers: dict[str, str] | None = None
                   ) -> int | None:
        """Send one record; returns its offset (None if the node writes with acks=0)."""
        return await self.send_nowait(queue, value, headers)

    def _launch(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        batch = self._pending.pop(queue, [])
        if batch:
            task = asyncio.get_running_loop().create_task(self._send_batch(queue, batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _send_batch(self, queue: str, batch: list) -> None:
        # Records with different headers still go together: headers are per record.
        try:
            records = [(v, h) for v, h, _ in batch]
            groups: dict[tuple, list[int]] = defaultdict(list)
            for i, (_, h) in enumerate(records):
                groups[tuple(sorted((h or {}).items()))].append(i)
            offsets: list[int | None] = [None] * len(batch)
            for key, idx in groups.items():
                res = await self.client.enqueue(queue, [records[i][0] for i in idx],
                                                headers=dict(key) or None)
                for j, i in enumerate(idx):
                    offsets[i] = res.offsets[j] if res.offsets else None
            for (_, _, fut), off in zip(batch, offsets, strict=True):
                if not fut.done():
                    fut.set_result(off)
        except Exception as exc:
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)

    async def flush(self) -> None:
        """Send everything pending and wait for it."""
        for queue in list(self._pending):
            self._launch(queue)
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
