"""`Worker`: a pool of handlers on a lease consumer (docs/work-queues.md).

Each of `concurrency` slots leases a record, runs the handler on it (a coroutine function, or a
plain function run in a thread), extends the lease while the handler runs, and then completes
the record; if the handler raises, the record is retried after a backoff that grows with its
attempt number, with the exception as the reason (past the consumer's `max_attempts` the server
moves it to the dead-letter queue). `stop()` stops leasing and lets running handlers finish, or,
with `finish=False`, cancels them and gives their records back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from vqueues_client.client import AsyncClient, Lease
from vqueues_client.errors import VQError

log = logging.getLogger(__name__)

Handler = Callable[[Lease], Awaitable[Any]] | Callable[[Lease], Any]


class Worker:
    """`await Worker(vq, "jobs", "workers", handle, concurrency=8).run()` until `stop()`."""

    def __init__(self, client: AsyncClient, queues: str | list[str], consumer: str,
                 handler: Handler, *, concurrency: int = 8, visibility_ms: int = 30_000,
                 wait_ms: int = 1000, idle_sleep_s: float = 0.05,
                 backoff_initial_ms: int = 1000, backoff_max_ms: int = 60_000) -> None:
        self.client = client
        self.queues = [queues] if isinstance(queues, str) else list(queues)
        if not self.queues:
            raise ValueError("a Worker needs at least one queue")
        self.consumer = consumer
        self.handler = handler
        self.concurrency = concurrency
        self.visibility_ms = visibility_ms
        self.wait_ms = wait_ms
        self.idle_sleep_s = idle_sleep_s
        self.backoff_initial_ms = backoff_initial_ms
        self.backoff_max_ms = backoff_max_ms
        self.completed = 0
        self.failed = 0
        self._stopping = asyncio.Event()
        self._finish = True
        self._slots: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[Any]] = set()
        self._is_async = inspect.iscoroutinefunction(handler)

    async def run(self) -> None:
        """Run the slots until `stop()` (then return once they are done)."""
        self._slots = [asyncio.create_task(self._slot(i)) for i in range(self.concurrency)]
        try:
            await asyncio.gather(*self._slots)
        finally:
            for t in self._slots:
                t.cancel()

    async def stop(self, finish: bool = True) -> None:
        """Stop leasing. `finish`: running handlers complete their records; otherwise they are
        cancelled and their records given back (retry with no delay)."""
        self._finish = finish
        self._stopping.set()
        if not finish:
            for t in list(self._running):
                t.cancel()
        if self._slots:
            await asyncio.gather(*self._slots, return_exceptions=True)

    def backoff_ms(self, attempt: int) -> int:
        """Delay before a failed record comes again: exponential in its attempt, jittered."""
        base = min(self.backoff_max_ms, self.backoff_initial_ms * 2 ** max(0, attempt - 1))
        return int(base * random.uniform(0.5, 1.0))

    async def _slot(self, index: int) -> None:
        turn = index % len(self.queues)
        while not self._stopping.is_set():
            got: list[Lease] = []
            queue = self.queues[turn]
            # One queue: long-poll it. Several: look at each in turn, then rest a moment.
            for _ in range(len(self.queues)):
                queue = self.queues[turn]
                turn = (turn + 1) % len(self.queues)
                wait = self.wait_ms if len(self.queues) == 1 else 0
                try:
                    got = await self.client.lease(queue, self.consumer, max_records=1,
                                                  visibility_ms=self.visibility_ms,
                                                  wait_ms=wait)
                except VQError as exc:
                    log.warning("lease_failed", extra={"queue": queue, "error": str(exc)})
                    await asyncio.sleep(self.idle_sleep_s)
                if got or self._stopping.is_set():
                    break
            if not got:
                if len(self.queues) > 1:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.idle_sleep_s)
                continue
            for lease in got:
                await self._handle(queue, lease)

    async def _handle(self, queue: str, lease: Lease) -> None:
        keeper = asyncio.create_task(self._keep_alive(queue, lease))
        work: asyncio.Task[Any] = asyncio.ensure_future(self._call(lease))
        self._running.add(work)
        try:
            await work
        except asyncio.CancelledError:
            if self._finish:
                raise
            # stop(finish=False): give the record back for another worker at once.
            with contextlib.suppress(VQError):
                await self.client.retry(queue, self.consumer, lease, reason="worker stopped")
            return
        except Exception as exc:
            self.failed += 1
            with contextlib.suppress(VQError):
                await self.client.retry(queue, self.consumer, lease,
                                        delay_ms=self.backoff_ms(lease.attempt),
                                        reason=f"{type(exc).__name__}: {exc}"[:1000])
            return
        finally:
            self._running.discard(work)
            keeper.cancel()
        try:
            await self.client.complete(queue, self.consumer, lease)
            self.completed += 1
        except VQError as exc:  # the lease expired meanwhile: another worker has it now
            log.warning("complete_failed", extra={"queue": queue, "error": str(exc)})

    async def _call(self, lease: Lease) -> Any:
        if self._is_async:
            return await self.handler(lease)
        return await asyncio.to_thread(self.handler, lease)

    async def _keep_alive(self, queue: str, lease: Lease) -> None:
        """Extend the lease at a third of its length for as long as the handler runs."""
        while True:
            await asyncio.sleep(self.visibility_ms / 3000)
            try:
                await self.client.extend(queue, self.consumer, lease, self.visibility_ms)
            except VQError as exc:
                log.warning("extend_failed", extra={"queue": queue, "error": str(exc)})
                return
