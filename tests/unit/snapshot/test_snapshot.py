"""Index snapshots: loaded state plus the tail equals a full replay; bad snapshots are refused."""

import asyncio
import itertools
import random
from array import array

import pytest

from tests.narrow import known
from tests.unit.partitions import history, observe, rec
from vqueues.snapshot import build as build_module
from vqueues.snapshot import capture as capture_module
from vqueues.snapshot import columns, wire
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import CAPTURE_OFFSETS, capture
from vqueues.snapshot.columns import (
    _run_sums,
    decode_offsets,
    decode_queues,
    encode_offset_parts,
    encode_offsets,
)
from vqueues.snapshot.format import MAGIC, SnapshotError, chunk_key, manifest_key
from vqueues.snapshot.image import Snapshot
from vqueues.snapshot.wire import _deflate, _inflate, _names, encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_index import QueueIndex


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


# long_queue 2: most queues are decoded as long ones; capture_offsets 2: a queue's offsets are
# copied a slice per turn, with history (appends, trims, deletions) running between slices.
@pytest.mark.parametrize(("long_queue", "capture_offsets"), [(4096, 262_144), (2, 2), (4096, 3)])
@pytest.mark.parametrize("seed", range(40))
async def test_a_snapshot_plus_the_tail_equals_a_full_replay(seed, long_queue, capture_offsets,
                                                              monkeypatch):
    # Many chunks, history running between them:
    monkeypatch.setattr(capture_module, "CAPTURE_CHUNK", 3)
    monkeypatch.setattr(build_module, "LONG_QUEUE", long_queue)
    monkeypatch.setattr(capture_module, "CAPTURE_OFFSETS", capture_offsets)
    monkeypatch.setattr(columns, "SUM_WINDOW", 5)  # queues' gap sums over many windows
    rnd = random.Random(seed)
    events, end = history(seed, queues=15, steps=500)
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

    capturing = asyncio.create_task(capture(owner, offsets_position))
    while not capturing.done():
        await history_goes_on()
        await asyncio.sleep(0)
    image = capturing.result()
    chunks, manifest = encode(image, snapshot_id=7)
    loaded = latest(0, [*chunks, (manifest_key(0), manifest)])
    assert loaded is not None
    # The new owner: the snapshot, then the data from P and the offset entries from O.
    fresh = PartitionState(0, RecordCache(1 << 20))
    restore(fresh, loaded, build(loaded))
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


async def test_a_loaded_map_builds_a_queue_on_first_lookup_and_acts_as_a_dict(monkeypatch):
    """Every QueueMap method on a map whose queues are still the snapshot's columns answers as
    the built map does: a lookup builds the one queue, a walk of a shard the shard."""
    from vqueues.records import ConsumerAcked, QueueDeleted
    from vqueues.state.queue_index import QueueIndex, StatefulQueueIndex
    from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap

    monkeypatch.setattr(build_module, "LONG_QUEUE", 3)  # some queues decoded into their own arrays
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"q{i % 900}", rec(i)) for i in range(2700 + 450)], None)
    s.apply_offset_entries([ConsumerAcked("q5", "c", 2, 9), QueueDeleted("q6", 300),
                            QueueDeleted("q7", 10_000)])
    chunks, manifest = encode(await capture(s, 0), 1)
    image = known(latest(0, [*chunks, (manifest_key(0), manifest)]))

    def loaded():
        queues, _ = build(image)
        assert queues.cold == 900 - 2  # q5 was built for its consumer, q7 (unlisted) at once
        return queues

    want = {n: list(q) for n, q in s.queues.items()}
    m = loaded()
    assert len(m) == len(want) == 900  # q7 holds no record but its deletion floor
    assert dict((n, list(q)) for n, q in m.items()) == want
    assert m.cold == 0 and m._cold is None
    m = loaded()
    cold = m.cold
    assert m.get("q1") is not None and list(m["q1"]) == want["q1"] and m.cold == cold - 1
    assert "q2" in m and "nope" not in m and 7 not in m and m.get("nope") is None
    assert type(m["q6"]) is StatefulQueueIndex and m["q6"].deleted_before == 300
    assert type(m["q8"]) is QueueIndex and m["q5"].consumers == {"c": (2, 9)}
    assert list(m.pop("q3")) == want["q3"] and m.pop("q3", None) is None
    del m["q4"]
    m["new"] = QueueIndex()
    assert len(m) == 900 - 2 + 1
    gone = QueueMap.shard_of("q9")
    m.clear_shard(gone)
    assert "q9" not in m and all(QueueMap.shard_of(n) != gone for n in m)
    names = sorted(n for shard in range(QUEUE_SHARDS) for n in m.shard_names(shard))
    assert names == sorted(m) and len(names) == len(m) and m.cold == 0
    m = loaded()
    while m.warm_next():
        pass
    assert m.cold == 0 and dict((n, list(q)) for n, q in m.items()) == want
    # What was replaced, deleted or taken from a cold shard stays so when the shard is built.
    m = loaded()
    m["q10"] = QueueIndex()
    del m["q11"]
    m.pop("q12")
    held = m["q13"]
    held.append(10**6)
    shard = QueueMap.shard_of("q14")
    assert m.shard_names(shard) and m.cold < 900 - 2 - 4
    while m.warm_next():
        pass
    assert list(m["q10"]) == [] and "q11" not in m and "q12" not in m and m["q13"] is held
    assert len(m) == 900 - 2 and m.cold == 0


async def test_queues_the_capture_found_out_of_order_are_built_at_once():
    """A snapshot whose names are not in order after some point (queues the capture found
    off its sorted walk) loads every queue, the unordered ones built at the load."""
    from array import array

    names = ["b", "d", "f", "c", "a", "e"]  # ordered up to "f"
    image = Snapshot(0, 100, 0, 0, names, array("q", [1, 2, 0, 1, 1, 0]),
                     array("q", [0, 0, 5, 0, 0, 9]), array("q", [1, 2, 3, 4, 5]))
    chunks, manifest = encode(image, 1)
    queues, listed = build(known(latest(0, [*chunks, (manifest_key(0), manifest)])))
    assert queues.cold == 3 and list(listed) == ["a", "b", "c", "d"]
    assert list(queues["d"]) == [2, 3] and queues["c"] is queues.get("c") and queues.cold == 2
    assert {n: (list(q), q.deleted_before) for n, q in queues.items()} == {
        "b": ([1], 0), "d": ([2, 3], 0), "f": ([], 5), "c": ([4], 0), "a": ([5], 0),
        "e": ([], 9)}


async def test_a_large_snapshot_is_chunked_below_the_message_limit(monkeypatch):
    monkeypatch.setattr(wire, "CHUNK_BYTES", 1000)
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"queue-{i % 700}", rec(i * 3)) for i in range(20_000)], None)
    image = await capture(s, 0)
    chunks, manifest = encode(image, 1)
    assert len(chunks) > 1 and all(len(v) <= 1000 + len(MAGIC) for _, v in chunks)
    loaded = latest(0, [*chunks, (manifest_key(0), manifest)])
    assert loaded is not None and loaded.records == 20_000


async def test_a_partial_or_corrupt_snapshot_is_refused_and_the_newest_complete_one_wins():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", rec(i)) for i in range(100)], None)
    image = await capture(s, 0)
    old_chunks, old_manifest = encode(image, 1)
    s.apply_records([("q", rec(100))], None)
    new_chunks, new_manifest = encode(await capture(s, 0), 2)
    m0 = (manifest_key(0), old_manifest)
    m1 = (manifest_key(0), new_manifest)
    assert known(latest(0, [*old_chunks, m0, *new_chunks, m1])).data_position == 101
    # No manifest yet:
    assert known(latest(0, [*old_chunks, m0, *new_chunks])).data_position == 100
    assert latest(0, []) is None
    with pytest.raises(SnapshotError):
        latest(0, [*old_chunks, m0, m1])  # the manifest came, its chunks did not
    key, value = new_chunks[0]
    with pytest.raises(SnapshotError):
        latest(0, [(key, value[:-1] + b"x"), m1])  # a changed byte
    with pytest.raises(SnapshotError):
        latest(0, [*new_chunks, (manifest_key(0), b"{not json")])


async def test_queues_without_consumers_share_one_empty_dict_that_nobody_writes_to():
    from vqueues.records import ConsumerAcked, QueueDeleted
    from vqueues.state.queue_index import NO_CONSUMERS

    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", rec(0)), ("b", rec(1))], None)
    assert s.queues["a"].consumers is NO_CONSUMERS is s.queues["b"].consumers
    s.apply_offset_entries([ConsumerAcked("a", "c", 1, 5), QueueDeleted("a", 2)])
    chunks, manifest = encode(await capture(s, 0), 1)
    queues, _ = build(known(latest(0, [*chunks, (manifest_key(0), manifest)])))
    assert queues["b"].consumers is NO_CONSUMERS
    assert NO_CONSUMERS == {}


@pytest.mark.parametrize("largest_gap", [1, 255, 256, 70_000, 5_000_000_000])
def test_the_offsets_column_round_trips_in_the_narrowest_gap_type(largest_gap):
    rng = random.Random(largest_gap)
    counts, offsets = array("q"), array("q")
    for _ in range(300):
        n = rng.choice([0, 0, 1, 2, 7, 40])
        start = rng.randrange(10**12)  # queues' offsets interleave: jumps go back and forth
        run = [start]
        for _ in range(n - 1):
            run.append(run[-1] + rng.randint(1, largest_gap))
        counts.append(n)
        offsets.extend(run[:n])
    raw = encode_offsets(offsets, counts)
    assert decode_offsets(raw, counts) == offsets
    width = {1: 1, 255: 1, 256: 2, 70_000: 4, 5_000_000_000: 8}[largest_gap]
    jumps = sum(1 for c in counts if c)
    assert len(raw) == 1 + 8 * jumps + width * (len(offsets) - jumps)
    with pytest.raises(SnapshotError):
        decode_offsets(raw[:-1], counts)
    with pytest.raises(SnapshotError):
        decode_offsets(b"\x09" + raw[1:], counts)


@pytest.mark.parametrize("seed", range(20))
def test_the_offsets_column_encodes_the_same_from_parts(seed):
    """A capture's offsets come in pieces, cut anywhere (inside a queue, at its edge, empty)."""
    rng = random.Random(seed)
    counts, offsets = array("q"), array("q")
    for _ in range(rng.randint(0, 60)):
        n = rng.choice([0, 1, 2, 9, 50])
        run = [rng.randrange(10**9)]
        for _ in range(n - 1):
            run.append(run[-1] + rng.randint(1, rng.choice([3, 300, 100_000])))
        counts.append(n)
        offsets.extend(run[:n])
    cuts = sorted(rng.randint(0, len(offsets)) for _ in range(rng.randint(0, 8)))
    parts = [offsets[a:b] for a, b in zip([0, *cuts], [*cuts, len(offsets)], strict=True)]
    joined = b"".join(encode_offset_parts(parts, counts))
    assert joined == encode_offsets(offsets, counts)
    assert decode_offsets(joined, counts) == offsets


def test_encoding_a_captured_snapshot_never_copies_all_its_offsets_at_once():
    """Joined first, a snapshot of 14.6M offsets took live memory from 220 to 736 MB (and
    stalled the loop 270 ms)."""
    import tracemalloc

    import numpy as np

    queues, per_queue = 100, 40_000
    image = Snapshot(0, queues * per_queue, 0, 0, names=[f"q{i}" for i in range(queues)],
                     counts=array("q", [per_queue] * queues),
                     deleted=array("q", [0] * queues))
    # Queue q holds q, q + 100, q + 200, ...: the round-robin of an enqueue load.
    flat = np.arange(queues * per_queue, dtype=np.int64).reshape(per_queue, queues).T.ravel()
    image.pieces = [array("q", flat[i:i + CAPTURE_OFFSETS].tobytes())
                    for i in range(0, len(flat), CAPTURE_OFFSETS)]
    del flat
    column_bytes = 8 * queues * per_queue  # 32 MB: joined, then diffed, took several times that
    tracemalloc.start()
    try:
        chunks, manifest = encode(image, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < column_bytes / 2
    loaded = latest(0, [*chunks, (manifest_key(0), manifest)])
    assert loaded is not None and loaded.decoded_offsets() == image.decoded_offsets()


def test_evenly_spread_records_cost_almost_nothing_in_a_snapshot():
    """Takeover must not grow with the records: 10 queues round-robin over 200,000 records."""
    s = PartitionState(0, RecordCache(0))
    s.apply_records([(f"queue-{i % 10}", rec(i)) for i in range(200_000)], None)
    image = asyncio.run(capture(s, 0))
    chunks, manifest = encode(image, 1)
    assert sum(len(v) for _, v in chunks) < 5_000  # raw int64 offsets (format 3): 300 kB
    loaded = latest(0, [*chunks, (manifest_key(0), manifest)])
    assert loaded is not None and loaded.decoded_offsets() == image.decoded_offsets()


def test_a_format_3_snapshot_with_raw_offsets_is_still_read():
    import hashlib
    import json
    import zlib

    import msgspec

    meta = msgspec.msgpack.encode([b"ab", array("q", [1, 1]).tobytes(),
                                   array("q", [2, 1]).tobytes(),
                                   array("q", [0, 0]).tobytes(), [], [0, [], [], [], []]])
    body = zlib.compress(len(meta).to_bytes(8, "little") + meta
                         + array("q", [3, 9, 5]).tobytes())
    manifest = json.dumps({"v": 3, "id": 1, "chunks": 1, "data_position": 10,
                           "offsets_position": 0, "log_start": 0,
                           "sha256": hashlib.sha256(body).hexdigest()}).encode()
    loaded = latest(0, [(chunk_key(0, 1, 0), MAGIC + body), (manifest_key(0), manifest)])
    assert loaded is not None
    assert loaded.names == ["a", "b"] and list(loaded.decoded_offsets()) == [3, 9, 5]


@pytest.mark.parametrize("names_step", [2, 16_384])
@pytest.mark.parametrize("step", [1, 2, 3, 7, 1 << 20])
def test_names_and_body_survive_being_decoded_in_small_steps(step, names_step, monkeypatch):
    """Names are decoded a step at a time and cut a few at a time (so no one call holds the GIL
    long): a multi-byte character or a name may straddle two steps."""
    monkeypatch.setattr(wire, "STEP_BYTES", step)
    monkeypatch.setattr(wire, "NAMES_STEP", names_step)
    names = ["a", "é", "日本語", "x" * 10, "🙂z", "q/1", "ü" * 5]
    raw = "".join(names).encode("utf-8", "surrogatepass")
    lengths = array("q", map(len, names))
    assert _names(raw, lengths) == names
    with pytest.raises(SnapshotError):
        _names(raw[:-1], lengths)
    with pytest.raises(SnapshotError):
        _names(raw + b"z", lengths)
    body = _deflate([raw, b"0123456789" * 3])
    assert _inflate(body) == raw + b"0123456789" * 3
    with pytest.raises(SnapshotError):
        _inflate(body[:-2])


@pytest.mark.parametrize("long_from", [1, 2, 3, 40, 10**9])
@pytest.mark.parametrize("largest_gap", [1, 300, 5_000_000_000])
def test_long_queues_decode_straight_into_their_own_arrays(long_from, largest_gap):
    rng = random.Random(long_from * 7 + largest_gap)
    counts, offsets = array("q"), array("q")
    for _ in range(200):
        n = rng.choice([0, 0, 1, 2, 3, 7, 40, 90])
        run = [rng.randrange(10**12)]
        for _ in range(n - 1):
            run.append(run[-1] + rng.randint(1, largest_gap))
        counts.append(n)
        offsets.extend(run[:n])
    raw = encode_offsets(offsets, counts)
    short, long = decode_queues(raw, counts, long_from)
    expected_short, expected_long, pos = array("q"), {}, 0
    for number, n in enumerate(counts):
        if n >= long_from:
            expected_long[number] = list(offsets[pos:pos + n])
        else:
            expected_short.extend(offsets[pos:pos + n])
        pos += n
    assert short == expected_short
    assert {k: list(v) for k, v in long.items()} == expected_long
    assert all(type(q) is QueueIndex for q in long.values())


async def test_a_loaded_snapshot_encodes_again_to_the_same_offsets():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"q{i % 3}", rec(i)) for i in range(50)], None)
    chunks, manifest = encode(await capture(s, 0), 1)
    loaded = known(latest(0, [*chunks, (manifest_key(0), manifest)]))
    chunks, manifest = encode(loaded, 2)  # its offsets still encoded
    again = latest(0, [*chunks, (manifest_key(0), manifest)])
    assert again is not None and again.decoded_offsets() == loaded.decoded_offsets()
    assert again.records == loaded.records == 50


async def test_a_capture_copies_a_long_queue_a_slice_per_loop_turn(monkeypatch):
    """One turn that copied 16M offsets stalled the loop 278 ms: at most CAPTURE_OFFSETS a turn,
    even within one queue."""
    monkeypatch.setattr(capture_module, "CAPTURE_OFFSETS", 1000)
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([(f"q{i % 2}", rec(i)) for i in range(10_500)], None)
    turns = 0
    done = False

    async def count_turns():
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    image = await capture(s, 0)
    done = True
    await counter
    assert image.records == 10_500 and list(image.decoded_offsets()) == [
        *range(0, 10_500, 2), *range(1, 10_500, 2)]
    assert turns >= 10_500 // 1000


@pytest.mark.parametrize("seed", range(30))
def test_run_sums_match_plain_sums_in_any_window(seed, monkeypatch):
    """The queues' gap sums, taken a window at a time (reduceat widens its whole input)."""
    import numpy as np

    rnd = random.Random(seed)
    monkeypatch.setattr(columns, "SUM_WINDOW", rnd.choice([1, 2, 3, 7, 1 << 20]))
    counts = np.array([rnd.choice([0, 0, 1, 2, 3, 9, 20]) for _ in range(rnd.randrange(1, 40))],
                      dtype=np.int64)
    starts = np.cumsum(counts) - counts
    gaps = np.array([rnd.randrange(256) for _ in range(int(counts.sum()))], dtype=np.uint8)
    expected = [int(gaps[a:a + n].astype(np.int64).sum()) for a, n in
                zip(starts, counts, strict=True)]
    assert _run_sums(gaps, starts, counts).tolist() == expected
