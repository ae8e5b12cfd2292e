"""Offset-topic writes in flight: a revocation waits for them."""

import asyncio

from vqueues.state.writes_in_flight import WritesInFlight


async def test_waiting_returns_at_once_with_no_write_in_flight():
    assert await WritesInFlight().wait(0.01) is True


async def test_waiting_ends_when_the_last_write_ends():
    writes = WritesInFlight()
    writes.begin()
    with writes.writing():
        waiting = asyncio.ensure_future(writes.wait(5))
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiting.done()  # one write is still in flight
    writes.end()
    assert await asyncio.wait_for(waiting, 1) is True


async def test_waiting_gives_up_after_its_timeout():
    writes = WritesInFlight()
    writes.begin()
    assert await writes.wait(0.01) is False
