"""Which records a lease hands out, through in-memory logs: never one record to two leases,
one per ordering key at a time and in order, none past the window's bound or the consumer's
in-flight cap, and one slow record holds back nothing else."""

import asyncio

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import fill, work_node
from vqueues.settings import Settings

pytestmark = pytest.mark.unit


async def test_concurrent_leases_never_share_a_record(node):
    svc, work, *_ = node
    await fill(svc, "many", 40)
    got = await asyncio.gather(*(work.lease("many", "w", 7, 1000, 0) for _ in range(8)))
    offsets = [r.record.offset for page in got for r in page.records]
    assert len(offsets) == len(set(offsets)) == 40


async def test_records_with_one_ordering_key_go_one_at_a_time_in_order(node):
    svc, work, *_ = node
    a = await fill(svc, "ordered", 3, key="a")
    b = await fill(svc, "ordered", 2, key="b")
    free = await fill(svc, "ordered", 2)
    got = await work.lease("ordered", "w", 10, 1000, 0)
    assert [r.record.offset for r in got.records] == [a[0], b[0], *free]
    assert (await work.lease("ordered", "w", 10, 1000, 0)).records == []
    by_offset = {r.record.offset: r for r in got.records}
    await work.complete("ordered", "w", [by_offset[a[0]].token])
    nxt = await work.lease("ordered", "w", 10, 1000, 0)
    assert [r.record.offset for r in nxt.records] == [a[1]]
    # A retried record keeps its key busy: the next one of that key waits for it.
    await work.retry("ordered", "w", [nxt.records[0].token], 200, None)
    assert (await work.lease("ordered", "w", 10, 1000, 0)).records == []


async def test_leasing_waits_while_the_window_is_full(node, settings):
    svc, work, *_ = node
    await fill(svc, "big", settings.max_lease_window + 10)
    first = await work.lease("big", "w", 1000, 1000, 0)
    assert len(first.records) == settings.max_lease_window
    assert (await work.lease("big", "w", 10, 1000, 0)).records == []
    await work.complete("big", "w", [first.records[0].token])
    assert len((await work.lease("big", "w", 10, 1000, 0)).records) == 1


async def test_one_slow_record_does_not_hold_back_the_queue():
    """The default window (100,000 records in flight or done out of order): one record held
    for long, thousands of others leased and completed past it."""
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    try:
        assert Settings().max_lease_window >= 100_000
        offsets = await fill(svc, "slow", 5000)
        held = (await work.lease("slow", "w", 1, 600_000, 0)).records
        assert [r.record.offset for r in held] == offsets[:1]
        done = 0
        while True:
            got = (await work.lease("slow", "w", 1000, 60_000, 0)).records
            if not got:
                break
            await work.complete("slow", "w", [r.token for r in got])
            done += len(got)
        assert done == 4999
        info = svc.queue_info("slow").consumers[0]
        assert (info.offset, info.in_flight, info.available) == (offsets[0], 1, 0)
        await work.complete("slow", "w", [held[0].token])
        assert svc.queue_info("slow").consumers[0].offset == offsets[-1] + 1
    finally:
        svc.close()


async def test_an_in_flight_cap_holds_exactly_under_concurrent_leases(node):
    svc, work, *_ = node
    await fill(svc, "capped", 30)
    settings = await work.configure("capped", "w", "lease", None, False, None, 4)
    assert settings.max_in_flight == 4
    pages = await asyncio.gather(*(work.lease("capped", "w", 3, 150, 0) for _ in range(6)))
    held = [r for page in pages for r in page.records]
    assert len(held) == 4  # 6 concurrent calls of 3: never more than the cap
    assert (await work.lease("capped", "w", 10, 150, 0)).records == []
    await work.complete("capped", "w", [held[0].token])
    more = (await work.lease("capped", "w", 10, 150, 0)).records
    assert len(more) == 1  # one slot freed
    await asyncio.sleep(0.2)  # every lease ran out: the cap counts only leases running
    again = (await work.lease("capped", "w", 10, 1000, 0)).records
    assert len(again) == 4
    assert work.consumer_settings("capped", "w").max_in_flight == 4
    await work.configure("capped", "w", None, None, False, None, None)  # the cap cleared
    assert len((await work.lease("capped", "w", 10, 1000, 0)).records) == 10


async def test_a_long_poll_on_a_capped_consumer_wakes_when_a_lease_is_completed(node):
    svc, work, *_ = node
    await fill(svc, "capwait", 5)
    await work.configure("capwait", "w", "lease", None, False, None, 1)
    first = (await work.lease("capwait", "w", 5, 30_000, 0)).records
    waiting = asyncio.ensure_future(work.lease("capwait", "w", 5, 30_000, 5000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await work.complete("capwait", "w", [first[0].token])
    got = (await asyncio.wait_for(waiting, 2)).records
    assert len(got) == 1 and got[0].record.offset != first[0].record.offset
