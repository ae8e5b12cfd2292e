"""The queue rules through in-memory logs: the service takes the storage seams, not Kafka."""

import asyncio

import pytest

from vqueues.errors import VQError
from vqueues.records import Record, now_ms

PARTITIONS = 2


async def test_enqueued_records_are_read_back_and_acked(service):
    res = await service.enqueue("jobs", [(b"a", []), (b"b", [("h", b"1")])])
    assert res.offsets == [0, 1]
    page = await service.read("jobs", "w", None, 10, 0)
    assert [r.value for r in page.records] == [b"a", b"b"] and page.next_offset == 2
    ack = await service.ack("jobs", "w", 1, allow_rewind=False)
    assert (ack.offset, ack.previous_offset) == (1, None)
    assert [r.value for r in (await service.read("jobs", "w", None, 10, 0)).records] == [b"b"]
    with pytest.raises(VQError) as err:
        await service.ack("jobs", "w", 0, allow_rewind=False)
    assert err.value.code == "rewind_not_allowed"
    info = service.queue_info("jobs")
    assert (info.records, info.consumers[0].lag) == (2, 1)


async def test_records_older_than_the_cache_are_fetched_by_offset(service):
    service.cache.max_bytes = 0  # nothing stays cached
    service.cache.clear()
    await service.enqueue("old", [(b"x", []), (b"y", [])])
    page = await service.read("old", None, None, 10, 0)
    assert [r.value for r in page.records] == [b"x", b"y"]
    assert service.reader._fetcher.calls == 1  # one pass for both


async def test_a_failed_offset_write_changes_nothing(service):
    await service.enqueue("q", [(b"x", [])])
    service._offsets.fail_next = VQError("broker_timeout")
    with pytest.raises(VQError):
        await service.ack("q", "c", 1, allow_rewind=False)
    assert (await service.read("q", "c", None, 10, 0)).records[0].value == b"x"


async def test_deleting_a_queue_hides_its_records_and_consumers(service):
    await service.enqueue("gone", [(b"x", [])])
    await service.ack("gone", "c", 0, allow_rewind=False)
    deletion = await service.delete_queue("gone")
    assert (deletion.records, deletion.consumers) == (1, ["c"])
    with pytest.raises(VQError) as err:
        service.queue_info("gone")
    assert err.value.code == "queue_not_found"
    assert (await service.read("gone", None, 0, 10, 0)).records == []


async def test_a_long_poll_returns_when_a_record_arrives(service):
    reader = asyncio.create_task(service.read("lp", None, None, 10, 5000))
    await asyncio.sleep(0.02)
    assert not reader.done()
    await service.enqueue("lp", [(b"hi", [])])
    page = await asyncio.wait_for(reader, 1)
    assert [r.value for r in page.records] == [b"hi"]


async def test_listing_pages_by_name(service):
    for name in ("l/c", "l/a", "l/b", "other"):
        await service.enqueue(name, [(b"x", [])])
    first = service.list_queues("l/", None, 2)
    assert (first.queues, first.next_after) == (["l/a", "l/b"], "l/b")
    assert service.list_queues("l/", "l/b", 2).queues == ["l/c"]


def test_far_apart_offsets_are_split_into_runs_read_side_by_side():
    from vqueues.queues.record_reader import _split
    from vqueues.storage import runs

    assert runs([1, 2, 300, 301, 10_000]) == [[1, 2], [300, 301], [10_000]]
    assert _split(runs(list(range(0, 5000, 1000))), 2) == [[0, 1000, 2000], [3000, 4000]]
    assert _split([[1], [500]], 4) == [[1], [500]]


async def test_a_sparse_queues_uncached_records_are_fetched_in_parallel_runs(service):
    service.cache.max_bytes = 0
    service.cache.clear()
    for i in range(3):
        await service.enqueue("sparse", [(f"s{i}".encode(), [])])
        other = next(f"o{j}" for j in range(10**4)
                     if service.partition_of(f"o{j}") == service.partition_of("sparse"))
        await service.enqueue(other, [(b"x", [])] * 300)
    service.reader._fetcher.calls = 0
    page = await service.read("sparse", None, None, 10, 0)
    assert [r.value for r in page.records] == [b"s0", b"s1", b"s2"]
    assert service.reader._fetcher.calls == 3  # one per run, issued together


@pytest.mark.parametrize("tail_got", [1, 3])  # of the 3 records: some, all
async def test_records_the_tail_indexed_before_their_delivery_report_are_indexed_once(
        service, tail_got):
    """Under load the tail often brings an own write back before its delivery report reaches
    the loop: the report then indexes only what the tail has not, and the answer and the
    queue hold each record once, in order."""
    log = service._data

    async def tail_first(partition, records):
        tail, log.tail = log.tail, None
        try:
            delivered = log._write(partition, records)
        finally:
            log.tail = tail
        first = delivered[0][0]
        tail.consumed([(partition, key, Record(first + i, log.timestamp, value, ()))
                       for i, (key, value, _) in enumerate(records[:tail_got])],
                      {partition: first + tail_got}, {partition: first + tail_got})
        state = service.ownership.states[partition]
        for _ in range(50):  # the tail's batch is applied on the loop first
            if state.next_offset == first + tail_got:
                break
            await asyncio.sleep(0)
        assert state.next_offset == first + tail_got
        return delivered

    await service.enqueue("tf", [(b"before", [])])
    log.append = tail_first
    res = await service.enqueue("tf", [(b"a", []), (b"b", []), (b"c", [])])
    assert res.offsets == [1, 2, 3]
    page = await service.read("tf", None, 0, 10, 0)
    assert [(r.offset, r.value) for r in page.records] == [
        (0, b"before"), (1, b"a"), (2, b"b"), (3, b"c")]
    p = service.partition_of("tf")
    assert service.ownership.states[p].next_offset == 4


async def test_a_keyed_write_stored_without_its_offsets_answers_them_from_the_tail(service):
    """A batch resent after a lost connection can come back stored with no offsets (-1): the
    keyed enqueue waits for the tail to index it and answers the keys' offsets from the window,
    and the same key sent again writes nothing (the fault tier found this answered 500)."""
    log = service._data
    log.timestamp = now_ms()  # inside the idempotency window
    plain = log.append

    async def unreported(partition, records):
        delivered = await plain(partition, records)
        return [(-1, ts) for _, ts in delivered]

    log.append = unreported
    keyed = [("vq-idempotency-key", b"k1")]
    first = await service.enqueue("kq", [(b"a", keyed), (b"b", [("vq-idempotency-key", b"k2")])])
    assert first.offsets == [0, 1]
    log.append = plain
    again = await service.enqueue("kq", [(b"a", keyed)])
    assert again.offsets == [0]
    assert len(log.partitions[service.partition_of("kq")]) == 2  # nothing written again
    log.append = unreported
    mixed = await service.enqueue("kq", [(b"c", [("vq-idempotency-key", b"k3")]), (b"d", [])])
    assert mixed.offsets is None  # a record without a key: its offset is unknown
    log.append = plain
    assert (await service.enqueue("kq", [(b"c", [("vq-idempotency-key", b"k3")])])).offsets \
        == [2]
