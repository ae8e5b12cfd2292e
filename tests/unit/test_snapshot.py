"""Index snapshots: loaded state plus the tail equals a full replay; bad snapshots are refused."""

import asyncio
import itertools
import random

import pytest

from tests.unit.test_retention_state import _history, rec
from tests.unit.test_retention_state import snapshot as observe
from vqueues import snapshot as snap
from vqueues.cache import RecordCache
from vqueues.partition_state import PartitionState


def apply(state, event):
    kind, *rest = event
    if kind == "data":
        state.apply_records([(rest[0], rec(rest[1]))], None)
    else:
        state.apply_offset_entries(rest)


def positions(events, upto):
    """(data position, offset-topic position) after the first `upto` events."""
    data = sum(1 for e in events[:upto] if e[0] == "data")
    entries = sum(1 for e in events[:upto] if e[0] == "entry")
    return data, entries


@pytest.mark.parametrize("seed", range(40))
async def test_a_snapshot_plus_the_tail_equals_a_full_replay(seed, monkeypatch):
    monkeypatch.setattr(snap, "CAPTURE_CHUNK", 3)  # many chunks, history running between them
    rnd = random.Random(seed)
    events, end = _history(seed, queues=15, steps=500)
    cut = rnd.randrange(len(events) + 1)
    # The owner: the history up to the cut, then capture while the rest of it happens.
    owner = PartitionState(0, RecordCache(1 << 20))
    for e in events[:cut]:
        apply(owner, e)
    _, offsets_position = positions(events, cut)
    later = iter(events[cut:])

    async def history_goes_on():
        for e in itertools.islice(later, rnd.randrange(0, 5)):
            apply(owner, e)

    capture = asyncio.create_task(snap.capture(owner, offsets_position))
    while not capture.done():
        await history_goes_on()
        await asyncio.sleep(0)
    image = capture.result()
    chunks, manifest = snap.encode(image, snapshot_id=7)
    loaded = snap.latest(0, [*chunks, (snap.manifest_key(0), manifest)])
    assert loaded is not None
    # The new owner: the snapshot, then the data from P and the offset entries from O.
    fresh = PartitionState(0, RecordCache(1 << 20))
    snap.restore(fresh, loaded, snap.build(loaded))
    data_seen = entry_seen = 0
    for e in events:
        if e[0] == "data":
            if e[2] >= loaded.data_position:
                apply(fresh, e)
            data_seen += 1
        else:
            if entry_seen >= loaded.offsets_position:
                apply(fresh, e)
            entry_seen += 1
    full = PartitionState(0, RecordCache(1 << 20))
    for e in events:
        apply(full, e)
    log_start = rnd.randrange(end + 1)  # and retention, applied to both
    full.trim(log_start, list(full.queues))
    fresh.trim(log_start, list(fresh.queues))
    assert observe(fresh) == observe(full)
    assert fresh.next_offset == full.next_offset


async def test_a_large_snapshot_is_chunked_below_the_message_limit(monkeypatch):
    monkeypatch.setattr(snap, "CHUNK_BYTES", 1000)
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"queue-{i % 700}", rec(i * 3)) for i in range(20_000)], None)
    image = await snap.capture(s, 0)
    chunks, manifest = snap.encode(image, 1)
    assert len(chunks) > 1 and all(len(v) <= 1000 + len(snap.MAGIC) for _, v in chunks)
    loaded = snap.latest(0, [*chunks, (snap.manifest_key(0), manifest)])
    assert loaded is not None and loaded.records == 20_000


async def test_a_partial_or_corrupt_snapshot_is_refused_and_the_newest_complete_one_wins():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", rec(i)) for i in range(100)], None)
    image = await snap.capture(s, 0)
    old_chunks, old_manifest = snap.encode(image, 1)
    s.apply_records([("q", rec(100))], None)
    new_chunks, new_manifest = snap.encode(await snap.capture(s, 0), 2)
    m0 = (snap.manifest_key(0), old_manifest)
    m1 = (snap.manifest_key(0), new_manifest)
    assert snap.latest(0, [*old_chunks, m0, *new_chunks, m1]).data_position == 101
    assert snap.latest(0, [*old_chunks, m0, *new_chunks]).data_position == 100  # no manifest yet
    assert snap.latest(0, []) is None
    with pytest.raises(snap.SnapshotError):
        snap.latest(0, [*old_chunks, m0, m1])  # the manifest came, its chunks did not
    key, value = new_chunks[0]
    with pytest.raises(snap.SnapshotError):
        snap.latest(0, [(key, value[:-1] + b"x"), m1])  # a changed byte
    with pytest.raises(snap.SnapshotError):
        snap.latest(0, [*new_chunks, (snap.manifest_key(0), b"{not json")])


async def test_queues_without_consumers_share_one_empty_dict_that_nobody_writes_to():
    from vqueues.partition_state import NO_CONSUMERS
    from vqueues.records import ConsumerAcked, QueueDeleted

    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", rec(0)), ("b", rec(1))], None)
    assert s.queues["a"].consumers is NO_CONSUMERS is s.queues["b"].consumers
    s.apply_offset_entries([ConsumerAcked("a", "c", 1, 5), QueueDeleted("a", 2)])
    chunks, manifest = snap.encode(await snap.capture(s, 0), 1)
    queues, _ = snap.build(snap.latest(0, [*chunks, (snap.manifest_key(0), manifest)]))
    assert queues["b"].consumers is NO_CONSUMERS
    assert NO_CONSUMERS == {}
