"""Building the queue index a loaded snapshot describes, off the loop (its queues stay columns
until first used), and handing it to a fresh partition state (ADR 7)."""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_left
from itertools import compress, islice
from typing import Any

import numpy as np
from sortedcontainers import SortedList

from vqueues import memory
from vqueues.records import now_ms
from vqueues.snapshot.columns import decode_queues
from vqueues.snapshot.image import Snapshot
from vqueues.snapshot.wire import NAMES_STEP
from vqueues.state.idempotency import IdempotencyWindow
from vqueues.state.partition_index import PartitionIndex
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_index import NO_CONSUMERS, QueueIndex, StatefulQueueIndex
from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap
from vqueues.state.tag_index import TagIndex

LONG_QUEUE = 4096  # offsets from which `build` decodes a queue straight into its own array


def build(snapshot: Snapshot) -> tuple[QueueMap, SortedList]:
    """The queue index and the sorted names a snapshot describes. Blocking and pure: run it off
    the loop (the fresh state it is for is not touched by anyone until `restore`).

    The queues stay columns (`_Columns`): each is built into its object on its first lookup,
    a shard's rest when something walks the shard, the others by `QueueMap.warm_next` once the
    partition serves: building every queue's object here would be most of a takeover's time,
    spent on queues nobody touches in the first second."""
    with memory.long_lived():
        return _build(snapshot)


def _build(snapshot: Snapshot) -> tuple[QueueMap, SortedList]:
    if snapshot.column is not None:
        offsets, long = decode_queues(snapshot.column, snapshot.counts, LONG_QUEUE)
    else:
        offsets, long = snapshot.decoded_offsets(), {}
    cold = _Columns(snapshot, offsets, long)
    queues = QueueMap(cold=cold)
    for number in range(cold.ordered, len(snapshot.names)):
        # Queues the capture found off the sorted walk (deletion markers, queues listed
        # meanwhile): few, and bisect needs order, so they are built now.
        queues[snapshot.names[number]] = cold.make(number)
    listed = list(compress(snapshot.names, snapshot.counts))
    for index, consumer, offset, acked_at in snapshot.consumers:
        name = snapshot.names[index]
        q = queues[name]
        if q.consumers is NO_CONSUMERS:
            q = queues.stateful(name, q)
            q.consumers = {}
            if not q.offsets:
                listed.append(name)
        q.consumers[consumer] = (offset, acked_at)
    return queues, SortedList(listed)


def _ordered_prefix(names: list[str]) -> int:
    """How many of `names`, from the first, are in strictly ascending order (a step of
    NAMES_STEP comparisons per C call)."""
    for i in range(0, len(names) - 1, NAMES_STEP):
        step = names[i:i + NAMES_STEP + 1]
        ascending = list(map(operator.lt, step, islice(step, 1, None)))
        if False in ascending:
            return i + ascending.index(False) + 1
    return len(names)


class _Columns:
    """A loaded snapshot's queues as its columns: `QueueMap`'s `ColdShards`. A queue becomes
    an object when the map is first asked for it (`take_one`: a bisect in the names), and a
    shard's remaining queues when the map needs them all (`take`). Only the names the capture
    walked in order (`ordered`, the listed queues: nearly all) are kept so; `_build` makes the
    others at once."""

    __slots__ = ("_bounds", "_counts", "_floors", "_left", "_long", "_names", "_offsets",
                 "_order", "_starts", "_taken", "_waiting", "ordered")

    def __init__(self, snapshot: Snapshot, offsets: array[int],
                 long: dict[int, QueueIndex]) -> None:
        names = self._names = snapshot.names
        self.ordered = ordered = _ordered_prefix(names)
        shard_of = np.empty(ordered, dtype=np.uint8)
        for i in range(0, ordered, NAMES_STEP):
            # A step at a time, so no one C call holds the GIL long. Masked in Python, not by
            # numpy: numpy gives the GIL up and takes it back within each call, and the loop's
            # thread, which then never sees the holder wait out its switch interval, never
            # runs.
            step = names[i:min(i + NAMES_STEP, ordered)]
            shard_of[i:i + len(step)] = [h & (QUEUE_SHARDS - 1) for h in map(hash, step)]
        self._order = np.argsort(shard_of, kind="stable")  # queue numbers, shard by shard
        self._bounds = np.concatenate(([0], np.cumsum(np.bincount(
            shard_of, minlength=QUEUE_SHARDS)))).tolist()
        self._waiting: list[int] = np.diff(self._bounds).tolist()  # per shard, not taken
        self._taken = bytearray(ordered)
        self._left = ordered
        # A queue decoded as a long one holds its own array; the others' offsets follow one
        # another in `offsets`.
        sizes = np.frombuffer(snapshot.counts, dtype=np.int64)
        short = np.ones(len(names), dtype=bool)
        if long:
            short[np.fromiter(long, np.int64, len(long))] = False
        runs = np.where(short, sizes, 0)
        self._starts = array("q", (np.cumsum(runs) - runs).tobytes())
        self._counts, self._floors = snapshot.counts, snapshot.deleted
        self._offsets, self._long = offsets, long

    def make(self, number: int) -> QueueIndex:
        """Queue `number`'s index, from its columns."""
        return self._make(number, self._starts[number], self._counts[number],
                          self._floors[number])

    def _make(self, number: int, start: int, size: int, deleted_before: int) -> QueueIndex:
        q = self._long.get(number) if self._long else None
        if q is None:
            new: Any = array.__new__  # QueueIndex.__new__'s work without its Python frame
            q = new(StatefulQueueIndex if deleted_before else QueueIndex, "q",
                    self._offsets[start:start + size])
        elif deleted_before:
            q = StatefulQueueIndex(q)
        if deleted_before:
            q.deleted_before = deleted_before
            q.consumers = NO_CONSUMERS
        return q

    def pending(self, shard: int) -> bool:
        return self._waiting[shard] > 0

    def left(self) -> int:
        return self._left

    def take_one(self, shard: int, name: str) -> QueueIndex | None:
        if not self._waiting[shard]:
            return None
        i = bisect_left(self._names, name, 0, self.ordered)
        if i == self.ordered or self._names[i] != name or self._taken[i]:
            return None
        self._taken[i] = 1
        self._forget(shard, 1)
        return self.make(i)

    def take(self, shard: int, into: dict[str, QueueIndex]) -> None:
        if not self._waiting[shard]:
            return
        numbers = self._order[self._bounds[shard]:self._bounds[shard + 1]]
        numbers = numbers[np.frombuffer(self._taken, dtype=np.uint8)[numbers] == 0]
        # The shard's columns read through numpy views at once, faster than an item at a time.
        columns = (np.frombuffer(c, dtype=np.int64)[numbers].tolist()
                   for c in (self._starts, self._counts, self._floors))
        names, make = self._names, self._make
        for number, start, size, deleted_before in zip(numbers.tolist(), *columns,
                                                       strict=True):
            into[names[number]] = make(number, start, size, deleted_before)
        self.drop(shard)

    def drop(self, shard: int) -> None:
        self._forget(shard, self._waiting[shard])

    def _forget(self, shard: int, count: int) -> None:
        self._waiting[shard] -= count
        self._left -= count


def restore(state: PartitionState, snapshot: Snapshot, built: tuple[QueueMap, SortedList],
            window: IdempotencyWindow | None = None) -> None:
    """Hand a fresh `state` what `build` made of `snapshot`, and the idempotency `window`
    restored from it (made here if not given: `IdempotencyWindow.restore` off the loop for
    many keys); the tail then continues at `snapshot.data_position` and the offset replay at
    `snapshot.offsets_position`."""
    if window is None:
        window = IdempotencyWindow.restore(state.idempotency.window_ms, snapshot.keys, now_ms())
    state.idempotency = window
    state.index = PartitionIndex(*built, snapshot.log_start)
    state.fence = snapshot.fence
    state.lease_windows.restore(snapshot.configs, snapshot.windows)
    state.schedule.restore(snapshot.scheduled)
    state.tags = TagIndex.restore(snapshot.tags)
    state.frontier.start_at(snapshot.data_position)
    state.offsets_position = snapshot.offsets_position
