"""The recent-record cache: FIFO within its byte budget, honest about what it holds, and out of
the garbage collector's way."""

import gc
import tracemalloc

import pytest

from tests.narrow import known
from vqueues.records import Record
from vqueues.state.cache import BLOCK, ENTRY_OVERHEAD_BYTES, RecordCache


def make(i: int, value_bytes: int, headers: int) -> Record:
    # Fresh objects per record, as the tail hands them over (keys are not interned).
    hs = tuple((f"header-{k}-{i % 7}"[:9], f"v{i}".encode()) for k in range(headers))
    return Record(1_000_000_000 + i, 1_700_000_000_000 + i, bytes(value_bytes) + b"%d" % i, hs)


@pytest.mark.parametrize(("value_bytes", "headers"), [(100, 0), (100, 2), (1000, 1), (10, 0)])
def test_the_configured_bytes_are_within_20_percent_of_what_the_cache_really_takes(
        value_bytes, headers):
    cache = RecordCache(1 << 40)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20_000):
        cache.put(3, make(i, value_bytes, headers))  # the cache alone keeps what it needs
    gc.collect()
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert abs(cache.bytes - real) / real < 0.2, (cache.bytes, real)


def test_the_oldest_records_go_first_and_the_budget_holds():
    cache = RecordCache(5_000)
    for i in range(100):
        cache.put(0, make(i, 100, 0))
    assert cache.bytes <= 5_000 and len(cache) < 100
    assert cache.get(0, 1_000_000_000) is None
    newest = cache.get(0, 1_000_000_099)
    assert newest is not None and known(newest.value).endswith(b"99")


def test_no_entry_of_the_cache_is_tracked_by_the_garbage_collector():
    """Not even before a collection: tracked entries would be walked by every full collection
    (110-190 ms at 750,000 records under load, measured with tuple keys). The rings are lists
    (always tracked) holding only untracked records, and the order is one run per batch."""
    cache = RecordCache(1 << 30)
    for i in range(1000):
        cache.put(i % 3, make(i, 10, 1))
    assert len(cache.entries()) == 1000
    assert not any(gc.is_tracked(e) for e in cache.entries())
    assert not any(gc.is_tracked(r) for ring in cache._rings.values()
                   for block in ring.blocks for r in block)
    assert cache.get(1, 1_000_000_001) is not None and cache.get(0, 1_000_000_001) is None
    runs = RecordCache(1 << 30)
    for b in range(30):
        runs.put_run(b % 3, [make(b * 100 + i, 10, 0) for i in range(100)])
    assert len(runs._order) == 30 and len(runs) == 3000


@pytest.mark.parametrize("queues", [3, 1])  # one queue: a run across the line
def test_a_replay_caches_only_what_would_still_be_cached_at_its_end(queues):
    from vqueues.state.partition_state import PartitionState

    cache = RecordCache(100 * ENTRY_OVERHEAD_BYTES)  # it can never hold more than 100 records
    put = []
    real_put, real_run = cache.put, cache.put_run
    cache.put = lambda p, rec: (put.append(rec.offset), real_put(p, rec))  # type: ignore
    cache.put_run = lambda p, recs: (put.extend(r.offset for r in recs),  # type: ignore
                                     real_run(p, recs))
    s = PartitionState(0, cache)
    s.apply_records([(f"q{i % queues}", Record(i, 1, b"v", ())) for i in range(1000)],
                    high_watermark=1000)
    assert put == list(range(900, 1000))  # not the 900 that would be evicted anyway
    s.reached_end(1000)
    s.mark_offsets_replayed()
    s.apply_records([("q0", Record(1000, 1, b"v", ()))], None)  # ready: every record
    assert put[-1] == 1000 and cache.get(0, 1000) is not None


def test_no_list_of_the_cache_grows_past_a_block_and_evicted_blocks_are_dropped():
    """One list of 2M records took 10 ms to grow and 4 ms to drop its evicted half (loop
    stalls): a ring is blocks of BLOCK records, evicted slots are cleared at once (the records
    are freed) and a block is dropped whole once all of it is evicted."""
    cache = RecordCache(3 * BLOCK * (ENTRY_OVERHEAD_BYTES + 1))
    for i in range(20 * BLOCK):
        cache.put(i % 2, Record(i // 2, 1, b"v", ()))
        if i % 97 == 0 or i > 19 * BLOCK:
            for ring in cache._rings.values():
                assert all(len(block) <= BLOCK for block in ring.blocks)
                assert all(r is None for r in ring.blocks[0][:ring.head])
                assert ring.blocks[0][ring.head] is not None
                assert len(ring.blocks) <= 3 * BLOCK // 2 // BLOCK + 2
    assert len(cache) == 3 * BLOCK


def test_gets_find_every_cached_record_across_gaps_and_nothing_else():
    """Offsets a ring skips (control records, other queues' records below the replay line)
    move records away from where their distance to the newest one puts them: gets bisect
    then, and an offset in a gap, evicted, or past the newest is simply absent."""
    import random

    rng = random.Random(11)
    cache = RecordCache(2_000 * (ENTRY_OVERHEAD_BYTES + 3))
    held: dict[tuple[int, int], Record] = {}
    order: list[tuple[int, int]] = []
    next_offset = [0, 0, 0]
    for _ in range(2_000):
        p = rng.randint(0, 2)
        batch = []
        for _ in range(rng.randint(1, 20)):
            next_offset[p] += rng.choice((1, 1, 1, 2, 7))
            batch.append(Record(next_offset[p], 1, b"v%02d" % rng.randint(0, 99), ()))
        cache.put_run(p, batch)
        for r in batch:
            held[(p, r.offset)] = r
            order.append((p, r.offset))
    kept = order[-len(cache):]  # FIFO: the newest len(cache) records
    assert cache.bytes == len(kept) * (ENTRY_OVERHEAD_BYTES + 3) <= cache.max_bytes
    cached = set(kept)
    for p in range(3):
        for off in range(next_offset[p] + 3):
            assert cache.get(p, off) is (held[(p, off)] if (p, off) in cached else None)
    assert sorted(map(id, cache.entries())) == sorted(id(held[k]) for k in kept)


def test_a_record_older_than_the_newest_is_replaced_in_place_or_not_cached():
    """Records reach the cache at the frontier, in offset order; the only older ones are a
    partition taken again and replayed: a record the ring holds is replaced where it is, one
    it no longer holds (evicted, or never cached) stays out."""
    cache = RecordCache(4 * (ENTRY_OVERHEAD_BYTES + 1))
    for i in (0, 1, 2, 4, 5):
        cache.put(0, Record(i, 1, b"v", ()))  # 0 is evicted, 3 was never there
    cache.put_run(0, [Record(0, 1, b"w", ()), Record(2, 1, b"w", ()), Record(3, 1, b"w", ())])
    assert cache.get(0, 0) is None and cache.get(0, 3) is None
    got = cache.get(0, 2)
    assert got is not None and got.value == b"w" and len(cache) == 4
    cache.put(0, Record(6, 1, b"v", ()))
    assert cache.get(0, 1) is None and cache.get(0, 2) is not None  # 2 kept its place


def test_the_same_record_put_twice_is_held_once_and_keeps_its_place():
    cache = RecordCache(3 * (ENTRY_OVERHEAD_BYTES + 1))
    for i in (0, 1, 0, 2):
        cache.put(0, Record(i, 1, b"v", ()))
    assert len(cache) == 3 and cache.bytes == 3 * (ENTRY_OVERHEAD_BYTES + 1)
    cache.put(0, Record(3, 1, b"v", ()))
    assert cache.get(0, 0) is None and cache.get(0, 3) is not None  # 0 was still the oldest


def test_a_run_leaves_the_same_entries_as_its_records_put_one_by_one():
    """`put_run` (an own write's records, new to the cache) evicts once at its end; what it
    leaves is what `put` per record leaves: the same records, bytes and order, oversize
    records and headers included."""
    import random

    rng = random.Random(7)
    one, run = RecordCache(40 * ENTRY_OVERHEAD_BYTES), RecordCache(40 * ENTRY_OVERHEAD_BYTES)
    offset = 0
    for _ in range(300):
        batch = []
        for _ in range(rng.randint(1, 30)):
            at, offset = offset, offset + rng.choice((1, 1, 1, 2))  # gaps: other writers
            size = 50 * ENTRY_OVERHEAD_BYTES if rng.random() < 0.02 else rng.randint(0, 300)
            headers = (("h", b"x"),) if rng.random() < 0.2 else ()
            batch.append(Record(at, 1, bytes(size), headers))
        partition = rng.randint(0, 2)
        for record in batch:
            one.put(partition, record)
        run.put_run(partition, batch)
        assert run.bytes == one.bytes <= one.max_bytes
        assert list(run._order) == list(one._order)
        assert sorted(run.entries(), key=id) == sorted(one.entries(), key=id)
    assert len(one) > 10  # the budget was reached over and over, not left empty


def test_a_record_twice_in_a_run_is_held_once():
    cache = RecordCache(1 << 20)
    cache.put_run(0, [Record(0, 1, b"v", ()), Record(1, 1, b"v", ()), Record(0, 1, b"w", ())])
    assert len(cache) == 2 and cache.bytes == 2 * (ENTRY_OVERHEAD_BYTES + 1)
    got = cache.get(0, 0)
    assert got is not None and got.value == b"w"
