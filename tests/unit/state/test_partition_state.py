"""A partition's state: index, consumers, deletions, readiness and waiting readers."""

import asyncio
import weakref

import pytest

from tests.unit.partitions import rec, state_with
from vqueues.locks import KeyedLocks
from vqueues.records import ConsumerAcked, ConsumerDeleted, QueueDeleted, Record, now_ms
from vqueues.state.cache import RecordCache
from vqueues.state.idempotency import Seen
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_index import QueueIndex
from vqueues.state.queue_map import QUEUE_SHARDS


async def test_a_partition_is_ready_once_data_and_offsets_are_replayed():
    s = PartitionState(0, RecordCache(1000))
    s.apply_records([("a", rec(0))], high_watermark=3)
    assert not s.ready.is_set()
    s.skip_to(3)  # records 1 and 2 were not queue records
    assert s.data_replayed and not s.ready.is_set()
    s.mark_offsets_replayed()
    assert s.ready.is_set()
    s.revoke()
    assert not s.ready.is_set()


async def test_consumers_follow_acks_deletions_and_queue_deletions():
    s = state_with([("a", rec(0)), ("a", rec(1)), ("a", rec(2))])
    s.apply_offset_entries([ConsumerAcked("a", "c", 1), ConsumerAcked("a", "d", 0)])
    assert s.committed("a", "c") == 1 and s.committed("a", "x") is None
    stats = s.stats("a")
    assert stats is not None and stats.consumers == {"c": (1, 2), "d": (0, 3)}
    s.apply_offset_entries([ConsumerDeleted("a", "d")])
    assert s.committed("a", "d") is None
    s.apply_offset_entries([QueueDeleted("a", 2)])
    assert s.select("a", 0, 10) == [2] and s.committed("a", "c") is None
    s.apply_records([("a", rec(3))], None)
    assert s.first_offset("a") == 2


async def test_a_waiting_reader_wakes_for_its_queue_only():
    s = state_with([])
    waiter = asyncio.create_task(s.wait_for_records("a", 5))
    await asyncio.sleep(0)
    s.apply_records([("b", rec(0))], None)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    s.apply_records([("a", rec(1))], None)
    await asyncio.wait_for(waiter, 1)


async def test_readers_that_time_out_or_go_away_leave_and_the_others_stay_parked():
    s = state_with([])
    quick = asyncio.create_task(s.wait_for_records("a", 0.01))
    gone = asyncio.create_task(s.wait_for_records("a", 5))
    staying = [asyncio.create_task(s.wait_for_records("a", 5)) for _ in range(3)]
    await asyncio.sleep(0)
    assert s.parked_readers("a") == 5
    await asyncio.wait_for(quick, 1)  # its time ran out: it returns, without a record
    gone.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert s.parked_readers("a") == 3 and not any(t.done() for t in staying)
    s.apply_records([("a", rec(0))], None)
    await asyncio.wait_for(asyncio.gather(*staying), 1)
    assert s.parked_readers("a") == 0


async def test_wait_indexed_returns_when_the_offset_is_indexed_or_times_out():
    s = state_with([("a", rec(0))])
    assert await s.wait_indexed(0, 0.01)
    assert not await s.wait_indexed(3, 0.01)
    later = asyncio.create_task(s.wait_indexed(3, 5))
    await asyncio.sleep(0)
    s.apply_records([("a", rec(3))], None)
    assert await asyncio.wait_for(later, 1)


async def test_revocation_waits_for_offset_writes_in_flight():
    s = state_with([])
    with s.writing():
        assert not await s.wait_writes(0.01)
    assert await s.wait_writes(0.01)


async def test_keyed_locks_serialise_one_key_and_are_dropped_when_free():
    locks = KeyedLocks()
    order = []

    async def work(key, tag, hold_s):
        async with locks.hold(key):
            order.append(f"{tag}+")
            await asyncio.sleep(hold_s)
            order.append(f"{tag}-")

    await asyncio.gather(work("k", "a", 0.02), work("k", "b", 0), work("other", "c", 0))
    assert order.index("a-") < order.index("b+")  # same key: one after the other
    assert order.index("c+") < order.index("a-")  # another key: not blocked
    assert len(locks) == 0


def test_the_queue_map_behaves_as_a_dict_of_queues():
    from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap

    m, d = QueueMap(), {}
    for i in range(3 * QUEUE_SHARDS):
        m[f"q{i}"] = d[f"q{i}"] = QueueIndex()
    assert len(m) == len(d) and set(m) == set(d) and m == d
    assert m.get("q1") is d["q1"] and m.get("nope") is None and "q2" in m and 7 not in m  # type: ignore[comparison-overlap]  # a non-str key
    assert m.pop("q1") is d.pop("q1") and m.pop("q1", None) is None
    with pytest.raises(KeyError):
        m.pop("q1")
    del m["q2"]
    assert "q2" not in m and len(m) == len(d) - 1
    assert sorted(n for s in range(QUEUE_SHARDS) for n in m.shard_names(s)) == sorted(m)


def test_a_queue_is_a_bare_array_until_it_gets_a_consumer_or_a_deletion_floor():
    import sys
    from array import array

    from vqueues.state.queue_index import StatefulQueueIndex

    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", Record(0, 1, b"x", ())), ("b", Record(1, 1, b"y", ())),
                     ("a", Record(2, 1, b"z", ()))], None)
    a = s.queues["a"]
    assert type(a) is QueueIndex and a.deleted_before == 0 and a.consumers == {}
    assert sys.getsizeof(QueueIndex()) == sys.getsizeof(array("q"))  # no slots
    s.apply_offset_entries([ConsumerAcked("a", "c", 1, 5), QueueDeleted("b", 2)])
    a, b = s.queues["a"], s.queues["b"]
    assert type(a) is StatefulQueueIndex and list(a) == [0, 2] and a.consumers == {"c": (1, 5)}
    assert type(b) is StatefulQueueIndex and b.deleted_before == 2
    s.apply_records([("a", Record(3, 1, b"w", ()))], None)
    assert list(s.queues["a"]) == [0, 2, 3]  # the replacement gets what comes next


async def test_a_revoked_partition_is_freed_a_shard_at_a_time():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"q{i}", Record(i, 1, b"v", ())) for i in range(3000)], None)
    s.tags["q1"] = {"t": s.queues["q1"].offsets}
    s.idempotency.add(7, Seen(1, 0, now_ms()), now_ms())
    held = [weakref.ref(q) for q in s.queues.values()]
    s.revoke()
    steps = s.dismantle()
    next(steps)
    # The state is empty for anyone who still holds it; the old index is freed step by step.
    assert len(s.queues) == 0 and list(s.names) == [] and s.tags == {}
    assert len(s.idempotency) == 0 and all(r() is not None for r in held)
    assert 1 + sum(1 for _ in steps) >= QUEUE_SHARDS
    assert all(r() is None for r in held)


async def test_keyed_locks_hand_a_key_to_waiters_in_order_and_survive_cancelled_waiters():
    locks = KeyedLocks()
    order = []
    gate = asyncio.Event()

    async def work(tag):
        async with locks.hold("k"):
            order.append(tag)
            if tag == "a":
                await gate.wait()

    first = asyncio.ensure_future(work("a"))
    await asyncio.sleep(0)
    waiters = [asyncio.ensure_future(work(t)) for t in "bcd"]
    await asyncio.sleep(0)
    waiters[0].cancel()  # b gives up while waiting
    await asyncio.sleep(0)
    assert locks.held("k") and order == ["a"]
    gate.set()
    await asyncio.gather(first, *waiters[1:])
    assert order == ["a", "c", "d"] and len(locks) == 0 and not locks.held("k")


async def test_a_keyed_lock_handed_to_a_waiter_cancelled_before_it_runs_is_released():
    locks = KeyedLocks()
    release = asyncio.Event()
    waiting: list[asyncio.Future[None]] = []

    async def holder():
        async with locks.hold("k"):
            await release.wait()
        waiting[0].cancel()  # the key was just handed over; the waiter has not run yet

    async def waiter():
        async with locks.hold("k"):
            raise AssertionError("a cancelled waiter must not run")

    h = asyncio.ensure_future(holder())
    await asyncio.sleep(0)
    waiting.append(asyncio.ensure_future(waiter()))
    await asyncio.sleep(0)
    release.set()
    await h
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    assert len(locks) == 0
    async with locks.hold("k"):  # free again
        pass


@pytest.mark.parametrize("seed", range(20))
async def test_a_cut_keeps_exactly_the_records_below_its_marker_whatever_arrives_meanwhile(
        seed: int) -> None:
    """Records the tail or this node's own writes bring while the marker is being written are
    held, then only those below the marker are indexed (ADR 19): what a child adopts never
    holds a late record, which is forwarded instead."""
    import random
    rnd = random.Random(seed)
    s = PartitionState(0, RecordCache(1 << 20))
    s.mark_offsets_replayed()
    s.apply_records([("a", rec(0))], high_watermark=1)
    s.skip_to(1)
    assert s.ready.is_set()
    s.start_cut()
    assert not s.ready.is_set() and s.cut.cutting
    marker = rnd.randrange(3, 12)
    records = [o for o in range(1, 20) if o != marker]  # the marker is keyless: skipped
    own = sorted(rnd.sample(records, rnd.randrange(len(records))))
    seen = rnd.randrange(len(records) + 1)  # how far the tail got before the marker is known
    for o in own:  # delivery reports, some ahead of the tail
        if rnd.random() < 0.5:
            s.apply_own("a", [rec(o)])
    s.apply_records([("a", rec(o)) for o in records[:seen]], None)
    s.set_cut(marker)
    s.apply_records([("a", rec(o)) for o in records[seen:]], None)
    s.skip_to(20)
    assert s.queues["a"].offsets.tolist() == list(range(marker))
    assert s.next_offset == 20 and not s.ready.is_set()
