"""Indexing a partition's data records: each record once to its queue, from the tail or as this
node's own write at its delivery report, in offset order whatever order those come in, a gap
the tail skips releasing the writes above it, and waiting readers woken once per batch."""

import asyncio
from typing import Any

import pytest

from tests.unit.partitions import rec, state_with
from vqueues.records import QueueDeleted, Record, now_ms
from vqueues.state.cache import ENTRY_OVERHEAD_BYTES, RecordCache
from vqueues.state.partition_state import PartitionState


async def test_records_are_indexed_per_queue_and_selected_from_a_start():
    s = state_with([("a", rec(0)), ("b", rec(1)), ("a", rec(2)), ("a", rec(5))])
    assert s.select("a", 0, 10) == [0, 2, 5]
    assert s.select("a", 1, 10) == [2, 5]
    assert s.select("a", 0, 2) == [0, 2]
    assert s.select("nobody", 0, 10) == []
    assert s.next_offset == 6 and s.first_offset("a") == 0 and s.first_offset("b") == 1


async def test_a_refetched_record_is_not_indexed_twice():
    s = state_with([("a", rec(0)), ("a", rec(1))])
    s.apply_records([("a", rec(1)), ("a", rec(2))], None)
    assert s.select("a", 0, 10) == [0, 1, 2]


async def test_own_writes_are_readable_at_their_ack_and_the_tail_does_not_index_them_again():
    s = state_with([("a", rec(0))])
    s.apply_own("a", [rec(1), rec(2)])
    assert s.select("a", 0, 10) == [0, 1, 2] and s.next_offset == 3 and s.tail_offset == 1
    s.apply_records([("a", rec(1)), ("a", rec(2)), ("b", rec(3))], None)
    assert s.select("a", 0, 10) == [0, 1, 2] and s.select("b", 0, 10) == [3]
    assert s.tail_offset == s.next_offset == 4 and not s.own_indexed


async def test_own_writes_the_tail_skipped_leave_the_set_the_group_thread_holds():
    """The group thread does not hand over records it finds in `own_indexed`; the tail's
    position passing them drops them, from the same set object (the thread keeps it)."""
    s = state_with([("a", rec(0))])
    held = s.own_indexed
    s.apply_own("a", [rec(1), rec(2), rec(3)])
    assert held == {1, 2, 3}
    s.skip_to(3)  # the tail passed 1 and 2 without delivering them
    assert s.own_indexed is held and held == {3}
    s.apply_records([("b", rec(4))], None)  # 3 skipped too, then a foreign record,
    s.skip_to(5)  # and the batch's position, as the ownership hands over
    assert held == set() and s.select("a", 0, 10) == [0, 1, 2, 3]
    assert s.select("b", 0, 10) == [4]


async def test_two_own_writes_whose_reports_arrive_out_of_order_stay_in_offset_order():
    """Overlapping sends may take the two data producers (ADR 6), whose poll threads report
    independently: the later write's report can come first. It waits for the earlier one, and
    so does its writer's answer (read-your-writes), never longer."""
    s = state_with([("a", rec(0))])
    s.apply_own("a", [rec(3), rec(4)])  # the second send's report first
    assert s.select("a", 0, 10) == [0] and s.next_offset == 1
    waiting = asyncio.ensure_future(s.wait_indexed(4, 5.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    s.apply_own("a", [rec(1), rec(2)])  # then the first send's
    assert await waiting is True
    assert s.select("a", 0, 10) == [0, 1, 2, 3, 4] and s.next_offset == 5
    s.apply_records([("a", rec(i)) for i in range(1, 5)], None)  # the tail confirms all four
    s.skip_to(5)
    assert s.select("a", 0, 10) == [0, 1, 2, 3, 4] and not s.own_indexed


async def test_the_tail_may_deliver_own_writes_before_their_delivery_report():
    s = state_with([])
    s.apply_records([("a", rec(0)), ("a", rec(1))], None)
    s.apply_own("a", [rec(0), rec(1)])  # late reports change nothing
    assert s.select("a", 0, 10) == [0, 1] and not s.frontier.waiting and not s.own_indexed


async def test_an_own_write_above_an_unknown_offset_waits_for_the_tail_to_fill_the_gap():
    # Another producer wrote offset 1 (queue a); our write got offset 2.
    s = state_with([("a", rec(0))])
    s.apply_own("a", [rec(2)])
    assert s.select("a", 0, 10) == [0]  # not before 1 is known: a reader must not skip it
    assert s.next_offset == 1
    s.apply_records([("a", rec(1))], None)
    assert s.select("a", 0, 10) == [0, 1, 2] and s.next_offset == 3
    s.apply_records([("a", rec(2))], None)  # the tail confirms ours
    assert s.select("a", 0, 10) == [0, 1, 2] and not s.own_indexed


async def test_a_gap_the_tail_skips_releases_waiting_own_writes():
    s = state_with([("a", rec(0))])
    s.apply_own("a", [rec(3)])
    s.skip_to(3)  # offsets 1 and 2 were keyless records
    assert s.select("a", 0, 10) == [0, 3]


async def test_own_writes_wake_a_waiting_reader_once_per_batch():
    s = state_with([])
    waiter = asyncio.create_task(s.wait_for_records("a", 5))
    await asyncio.sleep(0)
    s.apply_own("a", [rec(0), rec(1), rec(2)])
    await asyncio.wait_for(waiter, 1)
    assert await s.wait_indexed(2, 0)


@pytest.mark.parametrize("seed", range(6))
async def test_own_writes_indexed_as_a_run_leave_the_state_indexing_them_one_by_one_leaves(  # noqa: C901
        seed, monkeypatch):
    """Own writes (consecutive, at the frontier) and the tail's records (a queue's
    consecutive ones) are indexed as runs, scheduled records and cancellations set aside;
    random histories of own writes (runs, tags, idempotency keys, scheduled records, their
    moved copies and cancellations, gaps another writer left, reports out of order or after
    the tail), tail records, a replay crossing the cache's line, readers and deleted queues
    end in the same state as indexing every record on its own leaves."""
    import random

    from vqueues.state.idempotency import KEY_HEADER
    from vqueues.state.schedule import CANCEL_HEADER, DELIVER_AT_HEADER, FROM_HEADER
    from vqueues.state.tags import TAGS_HEADER

    rng = random.Random(seed)
    runs = PartitionState(0, RecordCache(30 * 300))
    ones = PartitionState(0, RecordCache(30 * 300))
    monkeypatch.setattr(ones, "_index_run", lambda *_: False)
    def index_one_by_one(queue, recs, woken):
        for r in recs:
            ones.indexer.index(queue, r, woken)

    monkeypatch.setattr(ones.indexer, "index_records", index_one_by_one)

    scheduled = []

    def headers(offset):
        roll = rng.random()
        if roll < 0.1:
            return ((TAGS_HEADER, b"t"),)
        if roll < 0.2:
            return ((KEY_HEADER, b"k%d" % rng.randrange(20)),)
        if roll < 0.25:
            scheduled.append(offset)
            return ((DELIVER_AT_HEADER, b"%d" % (10**13 + offset)),)
        if roll < 0.3:  # a moved copy of an earlier scheduled record (or of none)
            return ((FROM_HEADER, b"%d" % rng.randrange(max(1, offset))),)
        if roll < 0.33 and scheduled:  # a cancellation of an earlier scheduled record
            return ((CANCEL_HEADER, b"%d" % rng.choice(scheduled)),)
        return ()
    taken: list[bool] = []
    original = runs._index_run

    def index_run_noted(*a):
        taken.append(original(*a))
        return taken[-1]

    monkeypatch.setattr(runs, "_index_run", index_run_noted)
    replay = [(rng.choice("abcd"), Record(i, 1, b"r", ())) for i in range(150)]
    held_at_most = 30 * 300 // (ENTRY_OVERHEAD_BYTES + 1)
    assert held_at_most < 150
    for s in (runs, ones):  # the replay caches only the last records the cache can hold
        s.apply_records(replay, high_watermark=150)
    assert runs.cache.bytes == ones.cache.bytes and len(runs.cache) == held_at_most
    offset, woken = 150, 0
    held: list[Any] = []
    log: list[Any] = []
    for _ in range(200):
        waiters = [asyncio.ensure_future(s.wait_for_records("a", 5)) for s in (runs, ones)]
        await asyncio.sleep(0)  # parked
        queue = rng.choice("abcd")
        roll = rng.random()
        if roll < 0.6:  # an own write, reported now or held back (the other producer's)
            batch = []
            for _ in range(rng.randint(1, 6)):
                batch.append(Record(offset, now_ms(), b"v%d" % offset, headers(offset)))
                offset += 1
            log.extend((queue, r) for r in batch)
            if rng.random() < 0.2:
                held.append((queue, batch))
            else:
                for s in (runs, ones):
                    s.apply_own(queue, batch)
        elif roll < 0.7:  # another producer's record: only the tail brings it
            log.append((queue, Record(offset, 1, b"x", ())))
            offset += 1
        elif roll < 0.8 and held:  # a held-back report arrives
            q, batch = held.pop(0)
            for s in (runs, ones):
                s.apply_own(q, batch)
        elif roll < 0.95 and log:  # the tail catches up a little
            cut = rng.randint(0, len(log))
            for s in (runs, ones):
                s.apply_records(log[:cut], None)
            log = log[cut:]
        else:
            entry = QueueDeleted(queue, offset)
            for s in (runs, ones):
                s.apply_offset_entries([entry])
        for _ in range(5):  # a woken wait_for_records returns a few loop turns later
            await asyncio.sleep(0)
        assert waiters[0].done() == waiters[1].done()  # woken alike
        woken += waiters[0].done()
        for w in waiters:
            w.cancel()
        for q in "abcd":
            assert runs.select(q, 0, 1000) == ones.select(q, 0, 1000)
        assert ({n: (list(q), q.deleted_before) for n, q in runs.queues.items()}
                == {n: (list(q), q.deleted_before) for n, q in ones.queues.items()})
        assert list(runs.names) == list(ones.names)
        assert (runs.next_offset, runs.tail_offset) == (ones.next_offset, ones.tail_offset)
        assert runs.own_indexed == ones.own_indexed
        assert list(runs.frontier.own_order) == list(ones.frontier.own_order)
        assert runs.cache.bytes == ones.cache.bytes
        assert list(runs.cache._order) == list(ones.cache._order)
        assert runs.tags == ones.tags
        assert runs.schedule.by_queue == ones.schedule.by_queue
        assert runs.idempotency._seen == ones.idempotency._seen
    assert any(taken) and not all(taken) and woken  # both paths were taken, readers woken
    assert scheduled and len(runs.idempotency)  # both kinds of header came


@pytest.mark.parametrize("as_run", [True, False])
async def test_an_own_write_reported_after_its_queue_was_deleted_above_it_is_not_indexed(
        as_run, monkeypatch):

    s = state_with([("a", rec(0))])
    if not as_run:
        monkeypatch.setattr(s, "_index_run", lambda *_: False)
    s.apply_offset_entries([QueueDeleted("a", 5)])  # the deletion saw offsets up to 4
    s.apply_own("a", [rec(1), rec(2), rec(3)])  # acknowledged before it, reported after
    assert list(s.queues["a"]) == [] and s.next_offset == 4 and s.own_indexed == {1, 2, 3}
    s.apply_own("a", [rec(4), rec(5)])
    assert list(s.queues["a"]) == [5] and s.select("a", 0, 10) == [5]
