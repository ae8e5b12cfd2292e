"""Claims: the keys being written, each by one call."""

import asyncio

from vqueues.locks import Claims


async def test_a_claimed_key_names_its_write_until_released():
    claims = Claims()
    assert claims.holder("k") is None
    done = claims.claim(["k", "l"])
    assert claims.holder("k") is done and claims.holder("l") is done and len(claims) == 2
    waiter = asyncio.ensure_future(asyncio.wait([done]))
    await asyncio.sleep(0)
    assert not waiter.done()
    claims.release(["k", "l"], done)
    await waiter
    assert claims.holder("k") is None and len(claims) == 0


async def test_a_waiter_cancelled_leaves_the_write_and_other_waiters_alone():
    claims = Claims()
    done = claims.claim(["k"])
    first = asyncio.ensure_future(asyncio.wait([done]))
    second = asyncio.ensure_future(asyncio.wait([done]))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    assert not done.cancelled()
    claims.release(["k"], done)
    await second
    assert done.done() and not done.cancelled()
