"""A consumer loop: long-poll, call the handler for each record, ack after the page."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from vqueues_client.client import AsyncClient
from vqueues_client.types import Record

Handler = Callable[[Record], Awaitable[object] | object]

# An empty page that came back sooner than this (a node answering at once, e.g. while it
# stops) is followed by a pause, so the loop never spins.
_QUICK_EMPTY_S = 0.05
_MAX_PAUSE_S = 1.0


async def consume(client: AsyncClient, queue: str, consumer: str, handler: Handler, *,
                  limit: int = 100, wait_ms: int = 20000,
                  stop: asyncio.Event | None = None, max_records: int | None = None) -> int:
    """Process the queue as `consumer` until `stop` is set (or `max_records` were handled).

    Each record is passed to `handler` (sync or async) in offset order. Once every record of a
    page was handled, the page's `next_offset` is acked (at-least-once), which also moves the
    consumer past records that no longer exist (retention, deletion): a page with no records
    but a moved `next_offset` is acked, then the loop long-polls. If a handler raises, the
    records before it are acked and the exception propagates; the failing record is read
    again by the next `consume`. Returns the number of records handled.

    The first read starts at the consumer's committed offset; later reads continue from the
    previous page's `next_offset` (this loop owns the consumer while it runs).
    """
    handled = 0
    position: int | None = None  # the next offset to read, once known
    acked: int | None = None
    pause = _QUICK_EMPTY_S
    while not (stop and stop.is_set()) and (max_records is None or handled < max_records):
        started = time.monotonic()
        page = await client.read(queue, consumer=consumer, offset=position, limit=limit,
                                 wait_ms=wait_ms)
        if not page.records:
            if page.next_offset != position and page.next_offset != acked:
                await client.ack(queue, consumer, page.next_offset)  # past a gap
                acked = page.next_offset
            elif time.monotonic() - started < _QUICK_EMPTY_S:
                await asyncio.sleep(pause)
                pause = min(_MAX_PAUSE_S, pause * 2)
            position = page.next_offset
            continue
        pause = _QUICK_EMPTY_S
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
            else:
                done_to = page.next_offset  # the whole page, gaps after its last record too
        finally:
            if done_to is not None:
                await client.ack(queue, consumer, done_to)
                acked = position = done_to
    return handled
