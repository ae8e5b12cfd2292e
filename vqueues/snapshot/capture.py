"""Capturing a snapshot: a partition's state copied as of a cut, a chunk per loop pass (ADR 7).

A snapshot holds, as of a **cut** (data position P, offset-topic position O), every queue's
retained offsets, deletion floor and consumers, the consumers' settings, the lease consumers'
windows (ADR 8) and the partition's fence. It is captured in chunks across loop passes;
changes made meanwhile may leak into later chunks, which is harmless: records are only ever
appended at or above P (the capture keeps offsets below P), retention only trims what a loader
trims too, and every offset-topic entry is last-writer-wins, so replaying the entries from O on
top of the snapshot yields the state a full replay builds (tested with random histories).
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left
from itertools import islice

from vqueues.snapshot.format import SnapshotError
from vqueues.snapshot.image import Snapshot
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_index import QueueIndex
from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap

# Queues copied per loop pass: few enough that requests served meanwhile
# keep their latency.
CAPTURE_CHUNK = 1000
# Offsets copied per loop pass (2 MB), a long queue a slice per
# iteration, for the same reason.
CAPTURE_OFFSETS = 262_144


async def capture(state: PartitionState, offsets_position: int) -> Snapshot:
    """Copy `state` as of now (the cut), a chunk of queues per loop pass. The caller makes sure
    no offset-topic write is in flight at the cut, so `offsets_position` matches the state.
    Listed queues come in name order (from the state's sorted names), so a loader builds its
    sorted list without sorting."""
    image = Snapshot(state.partition, state.next_offset, offsets_position, state.log_start,
                     fence=state.fence)
    # Each part's own section. Consumer settings and lease windows are small (bounded per
    # consumer): copied at the cut; the schedule and the tags keep what lies below it.
    image.configs, image.windows = state.lease_windows.capture()
    cut = image.data_position
    image.scheduled = state.schedule.capture(cut)
    image.tags = state.tags.capture(cut)
    keys = state.idempotency.capture(cut)  # the window's order is copied here, at the cut
    # The queues listed at the cut, in name order (a loader then builds its sorted list without
    # sorting), then every other queue the index holds (deletion markers, and whatever the
    # history running meanwhile added), each copied once. Both are walked a chunk per iteration
    # of the event loop, never copied whole (a million names at once stall the loop). Names listed
    # after the cut, behind the walk, are missed: a queue
    # listed after the cut holds nothing below P and its entries are at or after O, which the
    # loader replays. `copied` is split like the queue map, so no one set grows huge.
    copied: list[set[str]] = [set() for _ in range(QUEUE_SHARDS)]
    image.pieces.append(array("q"))
    share = _LoopShare(state)
    after: str | None = None
    while True:
        names = (state.names if after is None
                 else state.names.irange(after, None, inclusive=(False, True)))
        chunk = list(islice(names, CAPTURE_CHUNK))
        if not chunk:
            break
        await _copy(state, image, chunk, share)
        for name in chunk:
            copied[QueueMap.shard_of(name)].add(name)
        after = chunk[-1]
        await share.next()
    for shard in range(QUEUE_SHARDS):
        done = copied[shard]
        rest = [n for n in state.queues.shard_names(shard) if n not in done]
        for i in range(0, len(rest), CAPTURE_CHUNK):
            await _copy(state, image, rest[i:i + CAPTURE_CHUNK], share)
            await share.next()
        await share.next()
    for section in keys:
        if section is not None:
            image.keys = section
        await share.next()
    return image


class _LoopShare:
    """A capture's share of one loop pass: it yields the loop between chunks
    of queues, and within a chunk once it copied CAPTURE_OFFSETS offsets."""

    __slots__ = ("offsets", "state")

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.offsets = 0

    async def next(self) -> None:
        """End this share: let the loop serve others, then go on unless the partition is gone."""
        self.offsets = 0
        await asyncio.sleep(0)
        if self.state.revoked:
            raise SnapshotError("partition revoked during the capture")


async def _copy(state: PartitionState, image: Snapshot, names: list[str], share: _LoopShare
                ) -> None:
    cut = image.data_position
    pieces = image.pieces  # each at most CAPTURE_OFFSETS long: a queue's offsets, or several
    consumers = image.consumers
    for name in names:
        q = state.queues.get(name)
        if q is None:
            continue
        if q.consumers:
            index = len(image.names)
            consumers.extend((index, c, off, at) for c, (off, at) in q.consumers.items())
        image.names.append(name)
        image.deleted.append(q.deleted_before)
        offsets = q.offsets
        n = len(offsets)
        if not n or (offsets[-1] < cut and n <= CAPTURE_OFFSETS - len(pieces[-1])):
            # The common case, a short queue below the cut: whole, into the current piece.
            if n:
                pieces[-1].extend(offsets)
            image.counts.append(n)
        else:
            image.counts.append(await _copy_long(q, cut, pieces, share))
        share.offsets += n
        if share.offsets >= CAPTURE_OFFSETS:
            await share.next()


async def _copy_long(q: QueueIndex, cut: int, pieces: list[array[int]], share: _LoopShare) -> int:
    """Copy q's offsets below `cut` a slice per share; how many it copied. Between shares q may
    get records (at or after the cut: not copied), be trimmed at the front, or be replaced in
    the map by a stateful copy (`QueueMap.stateful`): the slices go by offset value, not by
    position, and keep to the object they started with, which holds the same offsets."""
    count = 0
    start = 0  # the lowest offset not copied yet
    while True:
        offsets = q.offsets
        lo = bisect_left(offsets, start) if start else 0
        hi = bisect_left(offsets, cut, lo)
        end = min(hi, lo + CAPTURE_OFFSETS)
        if end > lo:
            if len(pieces[-1]) + end - lo <= CAPTURE_OFFSETS:
                pieces[-1].extend(offsets[lo:end])
            else:
                pieces.append(offsets[lo:end])
            count += end - lo
            start = offsets[end - 1] + 1
        if end >= hi:
            return count
        await share.next()
