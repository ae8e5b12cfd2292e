"""Dead letters through in-memory logs: a record past `max_attempts` goes to the consumer's
dead-letter queue, whether its last attempt failed, expired before the next lease, or expired on
its own; consumers whose leases expire together are dead-lettered together."""

import asyncio

import pytest

from tests.unit.nodes import fill

pytestmark = pytest.mark.unit


async def test_a_poison_record_goes_to_the_dead_letter_queue_after_max_attempts(node):
    svc, work, *_ = node
    await work.configure("src", "w", "lease", 3, "src-dlq", None)
    await fill(svc, "src", 1)
    for attempt in (1, 2, 3):
        rec = (await work.lease("src", "w", 1, 1000, 0)).records[0]
        assert rec.attempt == attempt
        res = await work.retry("src", "w", [rec.token], 0, f"boom {attempt}")
    assert res.dead_lettered == [rec.token]
    assert (await work.lease("src", "w", 1, 1000, 0)).records == []
    info = svc.queue_info("src").consumers[0]
    assert (info.dead_lettered, info.lag) == (1, 0)
    dead = (await svc.read("src-dlq", None, None, 10, 1000)).records
    assert len(dead) == 1 and dead[0].value == b"r0"
    headers = dict(dead[0].headers)
    assert headers["vq-dlq-source-queue"] == b"src"
    assert headers["vq-dlq-attempts"] == b"3"
    assert headers["vq-dlq-reason"] == b"boom 3"
    assert headers["vq-dlq-consumer"] == b"w"


async def test_an_expired_last_attempt_is_dead_lettered_at_the_next_lease(node):
    svc, work, *_ = node
    await work.configure("exp", "w", "lease", 1, None, None)  # no DLQ: counted and skipped
    await fill(svc, "exp", 2)
    first = (await work.lease("exp", "w", 1, 100, 0)).records[0]
    await asyncio.sleep(0.15)
    nxt = (await work.lease("exp", "w", 1, 1000, 0)).records[0]
    assert nxt.record.offset > first.record.offset
    assert svc.queue_info("exp").consumers[0].dead_lettered == 1


async def test_an_expired_last_attempt_is_dead_lettered_when_it_expires(node):
    from vqueues.upkeep.lease_expiry import LeaseExpiry
    svc, work, *_ = node
    await work.configure("late", "w", "lease", 1, "late-dlq", None)
    await fill(svc, "late", 2)
    leased = (await work.lease("late", "w", 1, 100, 0)).records
    expiry = asyncio.create_task(LeaseExpiry(work, svc.ownership, 20).run_forever())
    try:
        for _ in range(100):  # no lease call meanwhile
            await asyncio.sleep(0.02)
            if svc.queue_info("late").consumers[0].dead_lettered:
                break
        assert svc.queue_info("late").consumers[0].dead_lettered == 1
        dead = (await svc.read("late-dlq", None, None, 10, 1000)).records
        assert [d.value for d in dead] == [leased[0].record.value]
        assert dict(dead[0].headers)["vq-dlq-reason"] == b"lease expired"
    finally:
        expiry.cancel()


async def test_consumers_whose_leases_expire_together_are_dead_lettered_together(
        node, monkeypatch):
    """Each dead-lettering waits for two writes: one consumer after the other, the last of
    1,000 consumers whose leases expired together waited for 2,000 of them."""
    from vqueues.upkeep.lease_expiry import LeaseExpiry
    svc, work, data_log, _ = node
    queues = [f"expiring-{i}" for i in range(20)]
    for q in queues:
        await work.configure(q, "w", "lease", 1, "expiring-dlq", None)
        await fill(svc, q, 1)
    for q in queues:
        assert (await work.lease(q, "w", 1, 100, 0)).records
    writing = most = 0
    append = data_log.append

    async def slow(partition, records):
        nonlocal writing, most
        writing += 1
        most = max(most, writing)
        try:
            await asyncio.sleep(0.05)
            return await append(partition, records)
        finally:
            writing -= 1

    monkeypatch.setattr(data_log, "append", slow)
    expiry = asyncio.create_task(LeaseExpiry(work, svc.ownership, 20).run_forever())
    try:
        for _ in range(300):
            await asyncio.sleep(0.02)
            if all(svc.queue_info(q).consumers[0].dead_lettered for q in queues):
                break
        assert [svc.queue_info(q).consumers[0].dead_lettered for q in queues] == [1] * 20
        assert most > 1  # the dead letters of several consumers were written at once
        monkeypatch.setattr(data_log, "append", append)
        dead = (await svc.read("expiring-dlq", None, None, 100, 1000)).records
        assert sorted(dict(d.headers)["vq-dlq-source-queue"] for d in dead) == \
            sorted(q.encode() for q in queues)
    finally:
        expiry.cancel()
