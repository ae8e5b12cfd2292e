"""Tags through the in-memory logs: filtered reads from the tag index (no scan), a cursor that
reads with a filter moves past what it skipped, filtered leases, retention, snapshots, memory."""

import pytest

from tests.narrow import known
from tests.unit.fakes import MemoryLog
from tests.unit.nodes import work_node
from vqueues.records import Record
from vqueues.settings import Settings
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.state.tags import TAGS_HEADER, check_tag, tags_of

pytestmark = pytest.mark.unit


def tagged(value: bytes, *tags: str):
    return (value, [(TAGS_HEADER, ",".join(tags).encode())] if tags else [])


@pytest.fixture
async def node():
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    yield svc, work
    svc.close()


async def test_a_filtered_read_returns_only_tagged_records_and_moves_past_the_rest(node):
    svc, _ = node
    offsets = (await svc.enqueue("t", [tagged(b"a", "red"), tagged(b"b"),
                                       tagged(b"c", "blue", "red"), tagged(b"d", "blue")])).offsets
    page = await svc.read("t", None, None, 10, 0, tag="red")
    assert [r.value for r in page.records] == [b"a", b"c"]
    assert page.next_offset == offsets[2] + 1
    empty = await svc.read("t", None, page.next_offset, 10, 0, tag="red")
    assert empty.records == [] and empty.next_offset == offsets[3] + 1  # skipped "d"
    # A cursor consumer that acks the filtered read's next offset moved past the skipped ones.
    await svc.ack("t", "c", empty.next_offset, allow_rewind=False)
    assert svc.queue_info("t").consumers[0].lag == 0


async def test_a_filtered_read_never_scans_the_queue(node, monkeypatch):
    svc, _ = node
    await svc.enqueue("big", [tagged(b"x")] * 500 + [tagged(b"needle", "rare")])
    state = svc.ownership.require(svc.partition_of("big"))
    monkeypatch.setattr(state, "select", lambda *a: pytest.fail("scanned the queue"))
    page = await svc.read("big", None, None, 10, 0, tag="rare")
    assert [r.value for r in page.records] == [b"needle"]


async def test_a_filtered_long_poll_wakes_for_a_matching_record_only(node):
    import asyncio
    svc, _ = node
    reader = asyncio.create_task(svc.read("lp", None, 0, 10, 3000, tag="go"))
    await svc.enqueue("lp", [tagged(b"no")])
    await asyncio.sleep(0.05)
    assert not reader.done()
    await svc.enqueue("lp", [tagged(b"yes", "go")])
    page = await asyncio.wait_for(reader, 2)
    assert [r.value for r in page.records] == [b"yes"]


async def test_a_filtered_lease_completes_the_records_it_skips(node):
    svc, work = node
    offsets = (await svc.enqueue("l", [tagged(b"a"), tagged(b"b", "mine"), tagged(b"c"),
                                       tagged(b"d", "mine")])).offsets
    got = await work.lease("l", "w", 10, 1000, 0, tag="mine")
    assert [r.record.value for r in got.records] == [b"b", b"d"]
    await work.complete("l", "w", [r.token for r in got.records])
    info = svc.queue_info("l").consumers[0]
    assert (info.offset, info.lag) == (offsets[-1] + 1, 0)


def test_retention_and_deletion_trim_the_tag_index():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", Record(i, 0, b"v", ((TAGS_HEADER, b"a"),))) for i in range(10)],
                    None)
    s.trim(6, ["q"])
    assert s.select_tagged("q", "a", 0, 100) == [6, 7, 8, 9]
    s.delete_queue("q", 8)
    assert s.select_tagged("q", "a", 0, 100) == [8, 9]
    s.delete_queue("q", 10)
    assert "q" not in s.tags


async def test_a_snapshot_carries_the_tag_index():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", Record(i, 0, b"v", ((TAGS_HEADER, b"a,b"),) if i % 3 == 0 else ()))
                     for i in range(30)], None)
    image = await capture(s, 0)
    chunks, manifest = encode(image, 1)
    loaded = known(latest(0, [*chunks, (manifest_key(0), manifest)]))
    fresh = PartitionState(0, RecordCache(1 << 20))
    restore(fresh, loaded, build(loaded))
    assert fresh.select_tagged("q", "b", 0, 100) == list(range(0, 30, 3))


def test_tags_are_few_short_strings():
    assert tags_of([(TAGS_HEADER, b"a, b,,a")]) == ["a", "b"]
    assert tags_of([("other", b"a")]) == []
    assert check_tag("ok") is None
    for bad in ("", "a,b", " a", "x" * 65):
        assert check_tag(bad) is not None


def test_what_a_tagged_record_costs_in_the_index():
    """Documented in docs/api.md: 8 bytes per tag per record, plus one array per queue and tag."""
    import tracemalloc
    s = PartitionState(0, RecordCache(1 << 20))
    recs = [("q", Record(i, 0, None, ((TAGS_HEADER, b"t"),))) for i in range(50_000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    s.tags.clear()
    for _, rec in recs:
        s.indexer.headers("q", rec)
    per_record = (tracemalloc.get_traced_memory()[0] - before) / len(recs)
    tracemalloc.stop()
    assert per_record < 10, per_record
