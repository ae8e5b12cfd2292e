"""Parked readers and writers waiting for their record to be indexed."""

import asyncio

from vqueues.state.waiters import Waiters


async def test_a_parked_reader_returns_when_its_queue_is_woken_and_leaves_no_trace():
    w = Waiters()
    parked = asyncio.ensure_future(w.records("q", 5))
    await asyncio.sleep(0)
    assert w.parked("q") == 1 and w.parked("other") == 0
    w.wake("other")
    await asyncio.sleep(0)
    assert not parked.done()
    w.wake("q")
    await asyncio.wait_for(parked, 1)
    assert w.parked("q") == 0 and w.readers == {}


async def test_a_parked_reader_returns_on_its_timeout():
    w = Waiters()
    await asyncio.wait_for(w.records("q", 0.01), 1)
    assert w.readers == {}


async def test_a_writer_waits_until_its_offset_is_indexed_or_its_timeout():
    w = Waiters()
    waiting = asyncio.ensure_future(w.position(4, 5))
    await asyncio.sleep(0)
    w.indexed_below(4)
    await asyncio.sleep(0)
    assert not waiting.done()
    w.indexed_below(5)
    assert await asyncio.wait_for(waiting, 1) is True
    assert await w.position(9, 0.01) is False


async def test_giving_the_partition_up_releases_everybody():
    w = Waiters()
    reader = asyncio.ensure_future(w.records("q", 5))
    writer = asyncio.ensure_future(w.position(100, 5))
    await asyncio.sleep(0)
    w.release_all()
    await asyncio.wait_for(reader, 1)
    assert await asyncio.wait_for(writer, 1) is True
