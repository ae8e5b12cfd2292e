"""The Worker's room (records leased ahead of its handlers) follows its handlers: a fake lease
consumer answering after a fixed round trip stands in for the node (unit tier: no broker, no
HTTP; tests/test_work_queues.py runs the Worker against a real node)."""

import asyncio
import time
from typing import cast

from vqueues_client import AsyncClient, Lease, LeasePage, Record, Worker


class FakeLeases:
    """Lease consumers over `records` records in all (whatever the queue) that answer every
    call after `rtt_s`, counting how many records were leased and not yet handled at most
    (`peak`)."""

    def __init__(self, records: int, rtt_s: float) -> None:
        self.left = records
        self.rtt_s = rtt_s
        self.next = 0
        self.leased = 0
        self.handled = 0
        self.peak = 0
        self.completed: list[str] = []

    async def lease(self, queue, consumer, max_records, visibility_ms, wait_ms, complete=None):
        await asyncio.sleep(self.rtt_s)
        done = [x.token for x in complete or []]  # finished records ride on the lease
        self.completed += done
        n = min(max_records, self.left)
        if not n:
            await asyncio.sleep(wait_ms / 1000)
            return LeasePage([], done)
        self.left -= n
        deadline = int(time.time() * 1000) + visibility_ms
        out = [Lease(Record(o, 0, b"x"), f"{o}.1.1", 1, deadline)
               for o in range(self.next, self.next + n)]
        self.next += n
        self.leased += n
        self.peak = max(self.peak, self.leased - self.handled)
        return LeasePage(out, done)

    async def complete(self, queue, consumer, leases):
        await asyncio.sleep(self.rtt_s)
        self.completed += [x.token for x in leases]

    async def retry(self, queue, consumer, leases, delay_ms=0, reason=None):
        raise AssertionError("nothing fails here")

    async def extend(self, queue, consumer, leases, visibility_ms):
        return {"deadline": int(time.time() * 1000) + visibility_ms}


def drain(fake: FakeLeases, total: int, handler_s: float, **options) -> Worker:
    async def handle(lease: Lease) -> None:
        fake.handled += 1
        if handler_s:
            await asyncio.sleep(handler_s)

    async def go() -> Worker:
        # Four queues: their leasers share the room, as over a Worker's several queues.
        # The fake answers the calls a Worker makes.
        worker = Worker(cast(AsyncClient, fake), ["q0", "q1", "q2", "q3"], "w", handle,
                        concurrency=4, wait_ms=10, **options)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 60
        while len(fake.completed) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await worker.stop()
        await runner
        return worker

    worker = asyncio.run(go())
    assert sorted(fake.completed) == sorted(f"{o}.1.1" for o in range(total))
    return worker


def test_fast_handlers_get_more_records_leased_ahead_up_to_sixty_four_per_slot():
    # 4 slots: 64 ahead at first (10 per slot, at least 64), at most 256 (64 per slot).
    fake = FakeLeases(4000, rtt_s=0.02)
    worker = drain(fake, 4000, handler_s=0)
    assert worker.capacity == 4 + 256
    assert 4 + 64 < fake.peak <= 4 + 256


def test_slow_handlers_keep_ten_records_per_slot_ahead():
    # Two round trips of 5 ms cover fewer records than 4 slots of 30 ms handlers leave.
    fake = FakeLeases(300, rtt_s=0.005)
    worker = drain(fake, 300, handler_s=0.03)
    assert worker.capacity == 4 + 64
    assert fake.peak <= 4 + 64


def test_an_explicit_prefetch_is_kept_whatever_the_handlers():
    fake = FakeLeases(1000, rtt_s=0.02)
    worker = drain(fake, 1000, handler_s=0, prefetch=10)
    assert worker.capacity == 4 + 10
    assert fake.peak <= 4 + 10
