"""Idempotent enqueue through the in-memory logs: one write per key within the window, the
first offset answered, a reused key refused, the window rebuilt by a new owner, and bounded."""

import asyncio
import gc
import sys
import time

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import work_node
from vqueues.errors import Unavailable, VQError
from vqueues.records import Record
from vqueues.settings import Settings
from vqueues.state.idempotency import (
    KEY_HEADER,
    IdempotencyWindow,
    Seen,
    fingerprint,
    payload_fingerprint,
)

pytestmark = pytest.mark.unit


def keyed(value: bytes, key: str, **headers: str):
    return (value, [*((k, v.encode()) for k, v in headers.items()), (KEY_HEADER, key.encode())])


@pytest.fixture
async def node():
    data_log, offset_log = MemoryLog(), MemoryLog()
    data_log.timestamp = int(time.time() * 1000)  # records written now, inside the window
    svc, _ = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    yield svc, data_log, offset_log
    svc.close()


async def test_a_key_seen_in_the_window_answers_the_first_offset_and_writes_nothing(node):
    svc, data_log, _ = node
    first = await svc.enqueue("q", [keyed(b"a", "k1"), (b"plain", [])])
    again = await svc.enqueue("q", [keyed(b"a", "k1")])
    assert again.offsets == first.offsets[:1]
    p = svc.partition_of("q")
    assert data_log.end(p) == 2
    # Another queue's key space is its own.
    other = await svc.enqueue("other", [keyed(b"a", "k1")])
    assert other.offsets is not None


async def _retried(svc, queue, records):
    """Sent again as it was until it is answered, as the API asks of a client."""
    for _ in range(50):
        try:
            return await svc.enqueue(queue, records)
        except VQError as exc:
            assert exc.retriable
    raise AssertionError("never answered")


async def test_a_write_stored_though_it_failed_answers_its_offset_and_no_retry_stores_it_again(
        node):
    svc, data_log, _ = node
    p = svc.partition_of("sf")
    data_log.store_then_fail = Unavailable("broker_timeout", "Kafka (delivery): timed out")
    got = await _retried(svc, "sf", [keyed(b"a", "k1"), keyed(b"b", "k2")])
    assert data_log.end(p) == 2  # stored once: the node looked at the log before answering
    assert got.offsets == [0, 1]
    again = await _retried(svc, "sf", [keyed(b"a", "k1"), keyed(b"b", "k2")])
    assert again.offsets == [0, 1] and data_log.end(p) == 2


async def test_keys_of_a_failed_write_are_held_while_it_cannot_be_told_whether_it_was_stored(
        node):
    svc, data_log, _ = node
    p = svc.partition_of("sd")
    fetcher = svc.reader._fetcher
    ends = fetcher.high_watermark

    def unreachable(partition):
        raise Unavailable("broker_timeout", "Kafka (watermarks): timed out")

    fetcher.high_watermark = unreachable  # the broker does not answer for a while
    data_log.store_then_fail = Unavailable("broker_timeout", "Kafka (delivery): timed out")
    data_log.late_tail_s = 0.3
    with pytest.raises(VQError) as failed:
        await svc.enqueue("sd", [keyed(b"a", "k1")])
    assert failed.value.code == "broker_timeout"
    retry = asyncio.ensure_future(_retried(svc, "sd", [keyed(b"a", "k1")]))
    await asyncio.sleep(0.1)
    assert not retry.done()  # waits for the key, which is in doubt
    fetcher.high_watermark = ends  # the broker answers again: the record was stored
    assert (await asyncio.wait_for(retry, 5)).offsets == [0]
    assert data_log.end(p) == 1


async def test_keys_of_a_stored_write_are_held_until_the_tail_indexes_it_however_late(node):
    """A batch the broker stored and librdkafka reported without offsets (resent after a
    dropped connection), which the tail reads only after the request gave up (1 s): the
    retry waits for the key and answers the stored offset; nothing is written twice."""
    svc, data_log, _ = node
    p = svc.partition_of("su")
    data_log.store_unreported = True
    data_log.late_tail_s = 1.6
    with pytest.raises(VQError) as failed:
        await svc.enqueue("su", [keyed(b"a", "k1"), keyed(b"b", "k2")])
    assert failed.value.code == "broker_timeout" and failed.value.retriable
    assert data_log.end(p) == 2
    retry = asyncio.ensure_future(_retried(svc, "su", [keyed(b"a", "k1"), keyed(b"b", "k2")]))
    await asyncio.sleep(0.3)
    assert not retry.done()  # waits for the keys: stored, not indexed yet
    assert (await asyncio.wait_for(retry, 5)).offsets == [0, 1]
    assert data_log.end(p) == 2


async def test_a_retry_waiting_for_a_held_key_answers_503_after_broker_timeout_ms():
    """Keys held longer than a client waits (a stored write the tail has not indexed): the
    retry is answered 503 broker_timeout (retriable) after `broker_timeout_ms`, not never."""
    data_log, offset_log = MemoryLog(), MemoryLog()
    data_log.timestamp = int(time.time() * 1000)
    svc, _ = await work_node(data_log, offset_log,
                         Settings(write_visible_timeout_ms=200, broker_timeout_ms=300))
    try:
        data_log.store_unreported = True
        data_log.late_tail_s = 1.5
        with pytest.raises(VQError):
            await svc.enqueue("sw", [keyed(b"a", "k1")])
        started = time.monotonic()
        with pytest.raises(VQError) as waited:
            await svc.enqueue("sw", [keyed(b"a", "k1")])
        assert waited.value.code == "broker_timeout" and waited.value.retriable
        assert 0.25 < time.monotonic() - started < 1.2
        await asyncio.sleep(1.3)  # the tail reads it: the key is answered, not written again
        assert (await svc.enqueue("sw", [keyed(b"a", "k1")])).offsets == [0]
        assert data_log.end(svc.partition_of("sw")) == 1
    finally:
        svc.close()


async def test_a_failed_keyed_write_that_was_not_stored_is_written_by_the_retry(node):
    svc, data_log, _ = node
    data_log.fail_next = Unavailable("broker_timeout", "Kafka (delivery): timed out")
    got = await _retried(svc, "nf", [keyed(b"a", "k1")])
    assert got.offsets == [0] and data_log.end(svc.partition_of("nf")) == 1


async def test_concurrent_enqueues_of_one_key_write_once(node):
    svc, data_log, _ = node
    results = await asyncio.gather(*(svc.enqueue("c", [keyed(b"x", "same")]) for _ in range(5)))
    assert len({tuple(r.offsets) for r in results}) == 1
    assert data_log.end(svc.partition_of("c")) == 1


async def test_the_same_key_twice_in_one_request_is_written_once(node):
    svc, data_log, _ = node
    res = await svc.enqueue("b", [keyed(b"x", "dup"), (b"y", []), keyed(b"x", "dup")])
    assert res.offsets[0] == res.offsets[2] != res.offsets[1]
    assert data_log.end(svc.partition_of("b")) == 2


async def test_a_key_reused_with_another_payload_is_a_conflict_naming_the_first(node):
    svc, *_ = node
    first = await svc.enqueue("r", [keyed(b"one", "k")])
    for other in (keyed(b"two", "k"), keyed(b"one", "k", h="v")):
        with pytest.raises(VQError) as err:
            await svc.enqueue("r", [other])
        assert (err.value.code, err.value.status) == ("idempotency_key_reused", 409)
        assert err.value.details["first_offset"] == first.offsets[0]


async def test_a_new_owner_rebuilds_the_window_from_the_records(node):
    svc, data_log, offset_log = node
    first = await svc.enqueue("f", [keyed(b"v", "key")])
    svc2, _ = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    assert (await svc2.enqueue("f", [keyed(b"v", "key")])).offsets == first.offsets
    assert data_log.end(svc.partition_of("f")) == 1
    svc2.close()


def test_the_window_forgets_keys_older_than_its_length():
    w = IdempotencyWindow(1000)
    fp = fingerprint("q", b"k")
    w.add(fp, Seen(5, 1, 10_000), now_ms=10_000)
    assert w.get(fp, 10_999) == Seen(5, 1, 10_000)
    assert w.get(fp, 11_001) is None and len(w) == 0
    w.add(fp, Seen(6, 1, 1_000), now_ms=10_000)  # a replayed record already out of the window
    assert len(w) == 0
    off = IdempotencyWindow(0)
    off.add(fp, Seen(1, 1, 10_000), now_ms=10_000)
    assert len(off) == 0


def test_payload_fingerprints_ignore_the_key_and_header_order():
    a = payload_fingerprint(b"v", [("x", b"1"), ("y", b"2"), (KEY_HEADER, b"k1")])
    b = payload_fingerprint(b"v", [("y", b"2"), ("x", b"1"), (KEY_HEADER, b"k2")])
    assert a == b
    assert payload_fingerprint(None, []) != payload_fingerprint(b"", [])
    assert payload_fingerprint(b"v", []) != payload_fingerprint(b"v", [("x", b"1")])


def test_what_the_window_costs_per_key():
    """The documented figure (docs/api.md): about 300 bytes per key held."""
    import tracemalloc

    w = IdempotencyWindow(10**9)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20_000):
        w.add(fingerprint("queue", str(i).encode()), Seen(i, i * 7919, 10**6 + i), 10**6)
    per_key = (tracemalloc.get_traced_memory()[0] - before) / 20_000
    tracemalloc.stop()
    assert 200 < per_key < 400, per_key
    assert sys.getsizeof(fingerprint("q", b"k")) <= 44


def test_the_windows_entries_are_not_tracked_by_the_garbage_collector():
    """A window of a million keys must not be walked by every full collection (as
    NamedTuples its entries were tracked for good)."""
    w = IdempotencyWindow(10**9)
    fp = fingerprint("queue", b"k")
    w.add(fp, Seen(1, 2**63 + 5, 10**6), 10**6)
    seen = w.lookup(fp)
    assert seen == Seen(1, 2**63 + 5, 10**6) and seen.payload == 2**63 + 5
    assert not gc.is_tracked(seen)


def test_a_window_remembers_a_keyed_record_once_and_ignores_one_without_a_key():
    window = IdempotencyWindow(60_000)
    now = int(time.time() * 1000)
    first = Record(5, now, b"v", ((KEY_HEADER, b"k"),))
    window.remember("q", first, now)
    window.remember("q", Record(9, now, b"other", ((KEY_HEADER, b"k"),)), now)
    window.remember("q", Record(7, now, b"v", ()), now)
    seen = window.get(fingerprint("q", b"k"), now)
    assert len(window) == 1 and seen is not None and seen.offset == 5
    assert seen.payload == payload_fingerprint(b"v", first.headers)


async def test_a_multi_queue_enqueue_names_a_refused_record_by_its_place_in_the_request(node):
    """The keyed enqueue of one queue sees only that queue's records; the 409 still names
    the records by their index in the whole request."""
    from vqueues.queues.multi_enqueue import enqueue_many

    svc, _, _ = node
    await svc.enqueue("q7", [keyed(b"first", "k-first")])
    plain: tuple[bytes, list[tuple[str, bytes]]] = (b"plain", [])
    outcomes = await enqueue_many(svc, [
        ("zz", plain), ("q7", keyed(b"x", "k9")), ("zz", plain), ("q7", keyed(b"y", "k9"))])
    within = outcomes[3]
    assert isinstance(within, VQError) and within.code == "idempotency_key_reused"
    assert (within.details["index"], within.details["first_index"]) == (3, 1)
    assert within.message.startswith("records[3]: ") and "records[1] of this request" in \
        within.message
    assert outcomes[1] is within and not isinstance(outcomes[0], VQError)
    outcomes = await enqueue_many(svc, [("zz", plain), ("zz", plain),
                                        ("q7", keyed(b"other", "k-first"))])
    seen = outcomes[2]
    assert isinstance(seen, VQError) and seen.details["index"] == 2
    assert seen.message.startswith("records[2]: idempotency key seen at offset")
