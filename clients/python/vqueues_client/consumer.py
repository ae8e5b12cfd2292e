"""A consumer loop: long-poll, call the handler for each record, ack after it returns."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from vqueues_client.client import AsyncClient, Record

Handler = Callable[[Record], Awaitable[object] | object]


async def consume(client: AsyncClient, queue: str, consumer: str, handler: Handler, *,
                  limit: int = 100, wait_ms: int = 20000,
                  stop: asyncio.Event | None = None, max_records: int | None = None) -> int:
    """Process the queue as `consumer` until `stop` is set (or `max_records` were handled).

    Each record is passed to `handler` (sync or async) in offset order. The consumer's offset
    is acked after each page, once every handler of the page returned: at-least-once. If a
    handler raises, the records before it are acked and the exception propagates; the failing
    record is read again by the next `consume`. Returns the number of records handled.
    """
    handled = 0
    while not (stop and stop.is_set()) and (max_records is None or handled < max_records):
        page = await client.read(queue, consumer=consumer, limit=limit, wait_ms=wait_ms)
        if not page.records:
            continue
        done_to: int | None = None
        try:
            for rec in page.records:
                result = handler(rec)
                if inspect.isawaitable(result):
                    await result
                done_to = rec.offset + 1
                handled += 1
                if max_records is not None and handled >= max_records:
                    break
        finally:
            if done_to is not None:
                await client.ack(queue, consumer, done_to)
    return handled
