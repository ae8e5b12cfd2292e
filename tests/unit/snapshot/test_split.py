"""A parent's final snapshot split for its children when a layout grows (ADR 19): each child
gets exactly its queues' state, the union is the parent's, and the positions stay the
parent's. Random parent histories, checked against the parent as a model."""

import asyncio
import time
from array import array
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from tests.narrow import known
from vqueues.hashing import partition_for
from vqueues.layouts import tag
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigured,
    ConsumerDeleted,
    DeliveryGroup,
    DeliveryUpdated,
    OwnerFenced,
    QueueDeleted,
    Record,
    WindowDelta,
)
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.image import Snapshot
from vqueues.snapshot.split import ParentPositions, split
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import CURSOR, LEASE
from vqueues.state.idempotency import KEY_HEADER, KeySection, fingerprint
from vqueues.state.partition_state import PartitionState
from vqueues.state.schedule import CANCEL_HEADER, DELIVER_AT_HEADER, FROM_HEADER
from vqueues.state.tags import TAGS_HEADER

pytestmark = pytest.mark.unit

N, P = 3, 1  # the parent: partition 1 of a layout with 3 partitions
# Queue names that route to P, as every queue of a parent does: ASCII and longer UTF-8 ones,
# so the vectorised murmur2 sees every tail length.
QUEUES = [q for q in [f"q{i}" for i in range(60)] + [f"é-{i}-日本" for i in range(30)]
          + [f"queue/{'x' * (i % 9)}{i}" for i in range(30)] if partition_for(q, N) == P][:16]
CONSUMERS = ["c", "d", "lease"]
KEYS = [b"k1", b"k2", b"k3", b"k4"]
TAGS = ["red", "blue", "green"]
NOW = int(time.time() * 1000)


@pytest.fixture(autouse=True)
def _records_timed_now() -> None:
    """Records are timed as each test starts, not at collection: the idempotency window (10
    minutes of record time against the clock) dropped every key in a suite that reached this
    file more than 10 minutes after collecting it."""
    global NOW
    NOW = int(time.time() * 1000)

queue = st.sampled_from(QUEUES)
consumer = st.sampled_from(CONSUMERS)
key = st.none() | st.sampled_from(KEYS)
pick = st.integers(0, 10**6)  # an index into whatever exists, modulo its size
record = st.tuples(st.just("record"), queue, st.lists(st.sampled_from(TAGS), max_size=2), key)
step = st.one_of(
    record,
    st.tuples(st.just("schedule"), queue, st.integers(1, 10**6), key),
    st.tuples(st.just("cancel"), pick),
    st.tuples(st.just("move"), pick),
    st.tuples(st.just("ack"), queue, consumer, pick),
    st.tuples(st.just("forget"), queue, consumer),
    st.tuples(st.just("delete"), queue),
    st.tuples(st.just("configure"), queue, consumer, st.sampled_from([LEASE, CURSOR]),
              st.none() | queue),
    st.tuples(st.just("lease"), queue, consumer, pick, st.booleans(), st.booleans()),
    st.tuples(st.just("trim"), pick),
    st.tuples(st.just("grow"),),
    st.tuples(st.just("fence"), st.integers(1, 50)),
)
steps = st.lists(st.one_of(step, record), min_size=20, max_size=200)


class History:
    """A parent partition's state driven by steps, and what it was given (the model)."""

    def __init__(self) -> None:
        self.state = PartitionState(P, RecordCache(1 << 20))
        self.offset = 0
        self.keyed: set[tuple[str, bytes]] = set()
        self.seq = 0
        self.entries = 0

    def record(self, q, headers=()):
        rec = Record(self.offset, NOW, b"v", tuple(headers))
        self.offset += 1
        self.state.apply_records([(q, rec)], None)
        return rec.offset

    def entry(self, *entries):
        self.state.apply_offset_entries(entries)
        self.entries += len(entries)

    def apply(self, s):
        getattr(self, f"do_{s[0]}")(*s[1:])

    def keyed_record(self, q, headers, k):
        if k is not None:
            headers.append((KEY_HEADER, k))
            self.keyed.add((q, k))
        self.record(q, headers)

    def do_record(self, q, tags, k):
        self.keyed_record(q, [(TAGS_HEADER, ",".join(tags).encode())] if tags else [], k)

    def do_schedule(self, q, delay, k):
        self.keyed_record(q, [(DELIVER_AT_HEADER, str(NOW + delay).encode())], k)

    def do_cancel(self, at, header=CANCEL_HEADER):
        pending = self.state.schedule.entries()
        if pending:
            q, record_id, _ = pending[at % len(pending)]
            self.record(q, [(header, str(record_id).encode())])

    def do_move(self, at):
        self.do_cancel(at, FROM_HEADER)

    def do_ack(self, q, c, at):
        state = self.state
        offsets = state.queues[q].offsets if q in state.queues else []
        upto = offsets[at % len(offsets)] if len(offsets) else self.offset
        self.entry(ConsumerAcked(q, c, upto, NOW - at % 1000, at % 3))

    def do_forget(self, q, c):
        self.entry(ConsumerDeleted(q, c))

    def do_delete(self, q):
        self.entry(QueueDeleted(q, self.offset))

    def do_configure(self, q, c, mode, dlq):
        self.entry(ConsumerConfigured(q, c, mode, 3, dlq, 30_000, None,
                                      "q" if c == "lease" else None, c == "d",
                                      (("DelaySeconds", "1"),) if c == "c" else ()))

    def do_trim(self, at):
        state = self.state
        held = sorted(o for q in state.queues.values() for o in q.offsets)
        if held:
            log_start = held[at % len(held)]
            state.trim(log_start, list(state.queues))
            state.trim_schedule(log_start)

    def do_fence(self, generation):  # an owner took the parent over
        self.entry(OwnerFenced(generation))

    def do_grow(self):  # the records from here on are a later layout's
        if self.offset < tag(1, 0):
            self.offset = tag(1, self.offset)

    def do_lease(self, q, c, at, legacy, checkpoint):
        """A lease consumer's window written: ADR 8's per-record entries, or ADR 12's."""
        state = self.state
        offsets = state.queues[q].offsets.tolist() if q in state.queues else []
        chosen = offsets[at % max(len(offsets), 1):][:3]
        if legacy:
            for i, o in enumerate(chosen):
                self.entry(DeliveryUpdated(q, c, o, 1 + i, NOW + at, True, i == 2, "k",
                                           None if i else "timeout"))
            return
        self.seq += 1
        group = DeliveryGroup(True, NOW + at, 1 + at % 3, self.seq, None, chosen[:2])
        self.entry(WindowDelta(q, c, 1, self.seq, [group] if chosen else [], chosen[2:],
                               chosen[0] if chosen and at % 2 else None, at % 4, NOW,
                               checkpoint, chosen[0] if chosen else 0, []))


def parent_of(history_steps):
    h = History()
    for s in history_steps:
        h.apply(s)
    return h


def through_wire(image, partition):
    chunks, manifest = encode(image, 7)
    return known(latest(partition, [*chunks, (manifest_key(partition), manifest)]))


def restored(image):
    fresh = PartitionState(image.partition, RecordCache(1 << 20))
    restore(fresh, image, build(image))
    return fresh


def observed(state, keyed, keep=lambda q: True):
    """Every queue's state a client can observe, for the queues `keep` says."""
    windows = state.lease_windows.capture()[1]
    return {
        "index": {n: (q.offsets.tolist(), dict(q.consumers), q.deleted_before)
                  for n, q in state.queues.items() if keep(n)},
        "names": [n for n in state.names if keep(n)],
        "reads": {q: (state.select(q, 0, 10**6), state.first_offset(q), state.end_of(q, 0),
                      state.stats(q), {t: state.select_tagged(q, t, 0, 10**6) for t in TAGS})
                  for q in QUEUES if keep(q)},
        "configs": {k: v for k, v in state.configs.items() if keep(k[0])},
        "windows": {(r[0], r[1]): r for r in windows if keep(r[0])},
        "tags": {q: {t: o.tolist() for t, o in by.items()} for q, by in state.tags.items()
                 if keep(q)},
        "schedule": {q: dict(p) for q, p in state.schedule.by_queue.items() if keep(q)},
        "keys": {(q, k): state.idempotency.get(fingerprint(q, k), NOW)
                 for q, k in keyed if keep(q)},
    }


def merged(parts):
    out: dict[str, Any] = {}
    for part in parts:
        for section, values in part.items():
            if isinstance(values, list):
                out[section] = sorted(out.get(section, []) + values)
            else:
                target = out.setdefault(section, {})
                assert not target.keys() & values.keys()  # no queue in two children
                target.update(values)
    return out


def key_rows(section):
    fps = [section.fingerprints[i:i + 16] for i in range(0, len(section.fingerprints), 16)]
    return list(zip(fps, array("q", section.offsets), array("Q", section.payloads),
                    array("q", section.at_ms), strict=True))


def attributable(image):
    """The key offsets the parent still holds a record (or scheduled record) of, by queue."""
    out, at = {}, 0
    offsets = image.decoded_offsets()
    for name, n in zip(image.names, image.counts, strict=True):
        out.update(dict.fromkeys(offsets[at:at + n], name))
        at += n
    out.update({record_id: q for q, record_id, _ in image.scheduled})
    return out


def check_split(h, k, parent_image):
    parent = restored(through_wire(parent_image, P))
    keep_all = observed(parent, h.keyed)
    assert observed(h.state, h.keyed) == keep_all  # the model: the parent as it ran
    children = [P + j * N for j in range(k)]
    splits = {c: split(parent_image, c, k * N) for c in children}
    holder = attributable(parent_image)
    parts, keys = [], []
    for c, part in splits.items():
        image = part.image
        assert part.parent == ParentPositions(P, parent_image.data_position,
                                              parent_image.offsets_position,
                                              parent_image.log_start, parent_image.fence)
        assert (image.partition, image.data_position, image.offsets_position,
                image.log_start, image.fence) == (c, 0, 0, 0, 0)
        # (a) every queue, and every row naming one, is in the child partition_for gives.
        for rows in (image.names, *(
                [r[0] for r in rows] for rows in (image.configs, image.windows,
                                                  image.tags, image.scheduled))):
            assert all(partition_for(q, k * N) == c for q in rows)
        # (d) the image goes through the wire whole.
        loaded = through_wire(image, c)
        if parent_image.column is not None:  # rows decoded alike on both sides
            for field in ("names", "counts", "deleted", "consumers", "configs", "windows",
                          "tags", "scheduled", "keys", "data_position", "offsets_position",
                          "log_start", "fence"):
                assert getattr(loaded, field) == getattr(image, field), field
        assert loaded.decoded_offsets() == image.decoded_offsets()
        # (b) restored, the child's queues are as the parent's were, and it holds nothing of
        # the other queues' (but keys whose record the parent no longer held).
        def mine(q, c=c):
            return partition_for(q, k * N) == c

        child = restored(loaded)
        ours = observed(child, h.keyed, mine)
        assert ours == observed(parent, h.keyed, mine)
        assert sorted(child.lease_windows.last_attempts) == sorted(
            x for x in parent.lease_windows.last_attempts if mine(x[1]))
        theirs = observed(child, h.keyed, lambda q, mine=mine: not mine(q))
        for section in ("index", "names", "configs", "windows", "tags", "schedule"):
            assert not theirs[section], section
        assert all(read == ([], 0, 0, None, {t: [] for t in TAGS})
                   for read in theirs["reads"].values())
        for (q, kb), seen in theirs["keys"].items():
            assert seen is None or (seen.offset not in holder
                                    and seen == keep_all["keys"][(q, kb)])
        parts.append(ours)
        rows = key_rows(image.keys)
        keys.append(rows)
        # A key stays with its record's queue; one whose record is gone, with every child.
        assert rows == [r for r in key_rows(parent_image.keys)
                        if r[1] not in holder or mine(holder[r[1]])]
    # (c) together, the children hold the parent's state, every queue once.
    assert merged(parts) == keep_all
    assert sorted({r for rows in keys for r in rows}) == sorted(key_rows(parent_image.keys))
    assert sorted(n for c in children for n in splits[c].image.names) == sorted(
        parent_image.names)
    assert sum(len(splits[c].image.consumers) for c in children) == len(
        parent_image.consumers)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(history_steps=steps, k=st.sampled_from([2, 4]), wire=st.booleans())
def test_each_child_gets_exactly_its_queues_state_and_together_the_parents(history_steps, k,
                                                                             wire):
    """Through the wire, as a child loads it (its offsets encoded), or straight from the
    capture (its offsets in pieces)."""
    h = parent_of(history_steps)
    image = asyncio.run(capture(h.state, h.entries))
    check_split(h, k, through_wire(image, P) if wire else image)


def sections(image):
    return {"queues": image.names, "consumers": image.consumers, "configs": image.configs,
            "windows": image.windows, "tags": image.tags, "scheduled": image.scheduled,
            "keys": image.keys.fingerprints, "deletions": [d for d in image.deleted if d],
            "tagged": [o for o in image.decoded_offsets() if o >= tag(1, 0)],
            "fence": image.fence}


def test_the_histories_drawn_reach_every_section():
    """The test above proves little unless its histories fill every section of a snapshot:
    one that does is found, and split."""
    def rich(history_steps):
        h = parent_of(history_steps)
        return all(sections(asyncio.run(capture(h.state, h.entries))).values())

    found = find(steps, rich, settings=settings(max_examples=500, derandomize=True,
                                                database=None, deadline=None,
                                                phases=[Phase.generate]))  # not shrunk
    h = parent_of(found)
    image = asyncio.run(capture(h.state, h.entries))
    for k in (2, 4):
        check_split(h, k, through_wire(image, P))


async def test_offsets_tagged_with_a_later_layout_restore_from_a_child():
    """Offsets past 2**48 (`layouts.tag`): gaps and jumps that need int64, positions, keys,
    tags and schedules at tagged offsets, all kept exact through the split and the wire."""
    s = PartitionState(P, RecordCache(1 << 20))
    records = []
    for i in range(40):
        q = QUEUES[i % 5]
        offset = i if i < 20 else tag(1, i * 1000)
        headers = [(KEY_HEADER, b"k%d" % i), (TAGS_HEADER, b"t")] if i % 3 else []
        records.append((q, Record(offset, NOW, b"v", tuple(headers))))
    records.append((QUEUES[0], Record(tag(1, 99_000), NOW, b"v",
                                      ((DELIVER_AT_HEADER, str(NOW + 5).encode()),))))
    s.apply_records(records, None)
    s.apply_offset_entries([ConsumerAcked(QUEUES[1], "c", tag(1, 21_000), NOW),
                            QueueDeleted(QUEUES[2], tag(1, 30_000))])
    image = through_wire(await capture(s, 0), P)
    assert image.data_position == tag(1, 99_000) + 1
    for c in (P, P + N):
        child = split(image, c, 2 * N)
        assert child.parent.data_position == image.data_position
        fresh = restored(through_wire(child.image, c))
        for q in QUEUES[:5]:
            if partition_for(q, 2 * N) == c:
                assert fresh.select(q, 0, 100) == s.select(q, 0, 100)
                assert fresh.select_tagged(q, "t", tag(1, 0), 100) == \
                    s.select_tagged(q, "t", tag(1, 0), 100)
                assert fresh.committed(q, "c") == s.committed(q, "c")
                assert fresh.schedule.by_queue.get(q) == s.schedule.by_queue.get(q)
                for i in range(40):
                    fp = fingerprint(q, b"k%d" % i)
                    assert fresh.idempotency.get(fp, NOW) == s.idempotency.get(fp, NOW)
            else:
                assert q not in fresh.queues and fresh.select(q, 0, 100) == []
    assert any(o >= tag(1, 0) for o in image.decoded_offsets())


def test_a_child_outside_the_layout_is_refused():
    image = Snapshot(P, 10, 3, 0)
    for child, partitions in ((-1, 6), (6, 6), (0, 0)):
        with pytest.raises(ValueError):
            split(image, child, partitions)


def test_an_empty_parent_splits_into_empty_children():
    part = split(Snapshot(P, 10, 3, 2, fence=5), P + N, 2 * N)
    assert part.parent == ParentPositions(P, 10, 3, 2, 5)
    assert (part.image.data_position, part.image.offsets_position, part.image.log_start,
            part.image.fence) == (0, 0, 0, 0)
    assert part.image.names == [] and part.image.records == 0
    assert part.image.keys == KeySection.empty()
