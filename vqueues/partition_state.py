"""What a node knows about one data partition it owns: every queue's offsets and consumers.

A `PartitionState` is built by replay (the offset partition's entries and the data partition's
records from the beginning) and then kept current by the tail. It lives on the event loop only:
the Kafka threads hand it batches, it never blocks, and it wakes waiting readers.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from sortedcontainers import SortedList

from vqueues import memory
from vqueues.cache import RecordCache
from vqueues.idempotency import (
    IdempotencyWindow,
    Seen,
    fingerprint,
    key_of,
    payload_fingerprint,
)
from vqueues.leases import LEASE, ConsumerConfig, Delivery, WorkState
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigCleared,
    ConsumerConfigured,
    ConsumerDeleted,
    DeliveryCleared,
    DeliveryUpdated,
    OffsetEntry,
    OwnerFenced,
    QueueDeleted,
    Record,
    now_ms,
)
from vqueues.schedule import Schedule, control_of
from vqueues.tags import tags_of

# Shared by every queue without consumers (most of them): one dict, never written to; a queue
# gets its own on its first consumer. Saves 64 B per queue.
NO_CONSUMERS: dict[str, tuple[int, int]] = {}

_T = TypeVar("_T")


def _resolve(fut: asyncio.Future[_T], value: _T) -> None:
    """A waiter's timer ran out: resolve `fut` with `value` unless something did first."""
    if not fut.done():
        fut.set_result(value)


if TYPE_CHECKING:
    _OffsetArray = array[int]
else:
    _OffsetArray = array  # not subscriptable at run time before Python 3.12


class QueueIndex(_OffsetArray):
    """One queue in one partition: its retained record offsets (ascending; the object is that
    array, so a queue costs one object, not two: 40 B less per queue, measured) and its
    consumers (name -> (committed offset, last ack at, UTC epoch ms)).

    Most queues have no consumer and were never deleted: they are this bare array, with no
    slots (16 B less per queue than with two: 80 B instead of 96, measured). `consumers` and
    `deleted_before` then read the class's defaults; a queue that gets a consumer or a
    deletion floor is replaced in its map by a `StatefulQueueIndex`
    (`QueueMap.stateful`). Nothing holds a queue's index across an await, so the
    replacement is never missed.

    An array's truth and equality are its contents': test `is None`, never `if q`."""

    __slots__ = ()
    consumers: dict[str, tuple[int, int]] = NO_CONSUMERS  # never written to on this class
    deleted_before: int = 0  # records below this offset were deleted with the queue

    def __new__(cls, offsets: array[int] | None = None) -> QueueIndex:
        return cast(QueueIndex, array.__new__(cls, "q", offsets if offsets is not None else ()))

    @property
    def offsets(self) -> array[int]:
        """The retained record offsets, ascending (the index itself)."""
        return self

    @property
    def listed(self) -> bool:
        """A queue exists for its users while it holds a record or a consumer."""
        return bool(self.offsets) or bool(self.consumers)

    def position(self, offset: int) -> int:
        """Index of the first record at or after `offset`."""
        return bisect_left(self.offsets, offset)

    def trim_before(self, offset: int) -> None:
        cut = self.position(offset)
        if cut:
            del self.offsets[:cut]


class StatefulQueueIndex(QueueIndex):
    """A queue with consumers or a deletion floor: the same array, with the two as slots."""

    __slots__ = ("consumers", "deleted_before")

    def __new__(cls, offsets: array[int] | None = None) -> StatefulQueueIndex:
        q = cast(StatefulQueueIndex,
                 array.__new__(cls, "q", offsets if offsets is not None else ()))
        q.deleted_before = 0
        q.consumers = NO_CONSUMERS
        return q


QUEUE_SHARDS = 256  # a power of two: a queue's shard is its name's hash's low bits
DISMANTLE_STEP = 4096  # entries freed per loop turn when a revoked partition's state is freed


class ColdShards(Protocol):
    """Queues a snapshot describes that are not built into their shards yet: a `QueueMap`
    builds each on its first lookup (`take_one`) and a shard's rest when it walks the shard
    (`take`), so a takeover serves before a million queues are objects (ADR 7)."""

    def pending(self, shard: int) -> bool:
        """Whether `shard`'s queues are still to be built."""

    def left(self) -> int:
        """How many queues are still to be built, over every shard."""

    def take_one(self, shard: int, name: str) -> QueueIndex | None:
        """Build queue `name` of `shard` (None if it is not among the queues still to be
        built); it is no longer among them."""

    def take(self, shard: int, into: dict[str, QueueIndex]) -> None:
        """Build `shard`'s remaining queues into `into`; the shard is no longer pending."""

    def drop(self, shard: int) -> None:
        """Forget `shard`'s queues unbuilt; the shard is no longer pending."""


class QueueMap(MutableMapping[str, QueueIndex]):
    """Queue name -> QueueIndex, spread over QUEUE_SHARDS dicts. One dict of a million queues
    stalled the loop for 100-150 ms each time it grew (a resize copies the whole table, in
    one C call that holds the GIL; measured during a replay of 1M queues); a shard's resize
    copies a 256th of that.

    A map loaded from a snapshot starts with its queues `cold`: a lookup builds the queue it
    finds there, a walk of a shard (`shard_names`, iteration) builds that shard, and
    `warm_next` builds the rest a shard per call."""

    __slots__ = ("_cold", "_shards")

    def __init__(self, shards: list[dict[str, QueueIndex]] | None = None,
                 cold: ColdShards | None = None) -> None:
        self._shards = shards if shards is not None else [{} for _ in range(QUEUE_SHARDS)]
        self._cold = cold

    @staticmethod
    def shard_of(name: str) -> int:
        """The shard that holds `name` (the methods below inline it: they are hot paths)."""
        return hash(name) & (QUEUE_SHARDS - 1)

    def _warm(self, shard: int) -> None:
        cold = self._cold
        if cold is not None and cold.pending(shard):
            with memory.long_lived():  # 4,000 queues of a million: 3 ms, then frozen (O(1))
                cold.take(shard, self._shards[shard])
            self._forget_if_done(cold)

    def _forget_if_done(self, cold: ColdShards) -> None:
        if not cold.left():
            self._cold = None  # the snapshot's columns are freed with it

    def warm_next(self) -> bool:
        """Build the next shard whose queues are still cold; False once none is."""
        for shard in range(QUEUE_SHARDS):
            if self._cold is None:
                return False
            if self._cold.pending(shard):
                self._warm(shard)
                return self._cold is not None
        return False

    @property
    def cold(self) -> int:
        """How many queues are still to be built from the snapshot."""
        return 0 if self._cold is None else self._cold.left()

    def _take_one(self, shard: int, name: str) -> QueueIndex | None:
        cold = self._cold
        if cold is None:
            return None
        q = cold.take_one(shard, name)
        if q is not None:
            self._shards[shard][name] = q
            self._forget_if_done(cold)
        return q

    def get(self, name: str, default: QueueIndex | None = None) -> QueueIndex | None:  # type: ignore[override]
        shard = hash(name) & (QUEUE_SHARDS - 1)
        q = self._shards[shard].get(name)
        if q is None and self._cold is not None:
            q = self._take_one(shard, name)
        return default if q is None else q

    def __getitem__(self, name: str) -> QueueIndex:
        q = self.get(name)
        if q is None:
            raise KeyError(name)
        return q

    def __setitem__(self, name: str, q: QueueIndex) -> None:
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)  # replaced: never built from the snapshot later
        self._shards[shard][name] = q

    def __delitem__(self, name: str) -> None:
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)
        del self._shards[shard][name]

    def pop(self, name: str, *default: QueueIndex | None) -> QueueIndex | None:  # type: ignore[override]
        """As dict.pop: KeyError for a missing name unless a default is given."""
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)
        return self._shards[shard].pop(name, *default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __len__(self) -> int:
        return sum(map(len, self._shards)) + self.cold

    def __iter__(self) -> Iterator[str]:
        while self.warm_next():
            pass
        return chain.from_iterable(self._shards)

    def stateful(self, name: str, q: QueueIndex) -> StatefulQueueIndex:
        """`name`'s index `q` as one that can hold consumers and a deletion floor (a copy
        that replaces it here, the first time)."""
        if isinstance(q, StatefulQueueIndex):
            return q
        s = self[name] = StatefulQueueIndex(q)
        return s

    def clear_shard(self, shard: int) -> None:
        """Drop every queue of one shard (0 <= shard < QUEUE_SHARDS)."""
        cold = self._cold
        if cold is not None and cold.pending(shard):
            cold.drop(shard)
            self._forget_if_done(cold)
        self._shards[shard].clear()

    def shard_names(self, shard: int) -> list[str]:
        """The names in one shard (0 <= shard < QUEUE_SHARDS): a walk in bounded steps."""
        self._warm(shard)
        return list(self._shards[shard])


@dataclass(slots=True)
class QueueStats:
    queue: str
    records: int
    first_offset: int | None
    last_offset: int | None
    consumers: dict[str, tuple[int, int]]  # name -> (offset, lag in records)


class PartitionState:
    """One owned partition's index, consumers and readiness.

    Two paths index records, and both do it at the **frontier** (`next_offset`), in offset
    order, so every queue's offsets stay sorted and no record is indexed twice:
    - the tail (`apply_records`) delivers every record of the partition in order; `tail_offset`
      is the next offset it will deliver;
    - the node's own writes (`apply_own`) are indexed as soon as the broker acknowledged them,
      if every offset below them is known; otherwise they wait (in `_own`) until the tail fills
      the gap (another producer's record, or one not yet fetched), and a tail that gets there
      first indexes them itself. Own writes indexed ahead of the tail are remembered
      (`own_indexed`) so the tail skips them when it confirms them.
    """

    def __init__(self, partition: int, cache: RecordCache,
                 idempotency_window_ms: int = 600_000) -> None:
        self.partition = partition
        self.cache = cache
        self.idempotency = IdempotencyWindow(idempotency_window_ms)
        self.schedule = Schedule()  # records to deliver later (vqueues/schedule.py)
        # The tag index: queue -> tag -> offsets of its records carrying the tag (ascending).
        self.tags: dict[str, dict[str, array[int]]] = {}
        self.queues = QueueMap()
        self.names = SortedList()  # the listed queues' names, kept ordered as they change
        self.log_start = 0  # the data partition's first retained offset, as last learnt
        self.offsets_position = 0  # every offset-topic entry below it is applied
        self.next_offset = 0  # the frontier: every offset below it is indexed or not a record
        self.tail_offset = 0  # the next data offset the tail will deliver
        self.replay_target: int | None = None  # the end seen at assignment
        self._uncached_below = 0  # records below this offset are not cached (replay)
        self.data_replayed = False
        self.offsets_replayed = False
        self.revoked = False
        self.ready = asyncio.Event()
        self._own: dict[int, tuple[str, Record]] = {}  # own writes waiting for the frontier
        self.own_indexed: set[int] = set()  # own writes indexed ahead of the tail
        # The same offsets in the order they were indexed (ascending: at the frontier), so the
        # tail passing them drops them from the left; the set stays the same object, which the
        # group thread holds.
        self._own_order: deque[int] = deque()
        # Parked readers per queue; a dict of futures, so one leaving is O(1) (3,000 waiting
        # on one queue each copied the list of the others on timeout).
        self._readers: dict[str, dict[asyncio.Future[None], None]] = {}
        self._position_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._writes = 0
        self._writes_done: asyncio.Event | None = None
        # Consumers with settings, and the lease consumers' windows, by (queue, consumer).
        self.configs: dict[tuple[str, str], ConsumerConfig] = {}
        self.work: dict[tuple[str, str], WorkState] = {}
        self.fence = 0  # the highest owner generation fenced in the offset partition
        self.generation = 0  # this owner's generation (its fence), carried by every write
        self.fenced_entries = 0  # entries replay ignored: written by a fenced-off owner

    # Feeding the state -------------------------------------------------------------------------

    def _index(self, queue: str, rec: Record, woken: set[str]) -> None:
        """Index `rec` at the frontier (its offset is the frontier or past a known gap)."""
        if rec.headers and self._control(queue, rec):
            return
        if self._index_many(queue, (rec,), woken) and rec.headers:
            self._index_headers(queue, rec)

    def _control(self, queue: str, rec: Record) -> bool:
        """Scheduled records: a record to deliver later goes to the schedule, not the queue; a
        cancellation or a delivered one removes it. True if `rec` is not a queue record."""
        ctl = control_of(rec.headers)
        if ctl is None:
            return False
        kind, number = ctl
        if kind == "from":
            self.schedule.remove(queue, number)
            return False
        q = self.queues.get(queue)
        if q is not None and rec.offset < q.deleted_before:
            return True
        if kind == "at":
            self.schedule.add(queue, rec.offset, number)
            self._remember_key(queue, rec)  # a repeat must not schedule it twice
            if rec.offset >= self._uncached_below:
                self.cache.put(self.partition, rec)  # the move reads it back at its due time
        else:
            self.schedule.remove(queue, number)
        return True

    def _index_headers(self, queue: str, rec: Record) -> None:
        """What a record's headers ask the index to remember: its tags, its idempotency key."""
        tags = tags_of(rec.headers)
        if tags:
            by_tag = self.tags.get(queue)
            if by_tag is None:
                by_tag = self.tags[queue] = {}
            for tag in tags:
                offsets = by_tag.get(tag)
                if offsets is None:
                    offsets = by_tag[tag] = array("q")
                offsets.append(rec.offset)
        self._remember_key(queue, rec)

    def _remember_key(self, queue: str, rec: Record) -> None:
        key = key_of(rec.headers)
        if key is not None:
            self.idempotency.add(fingerprint(queue, key),
                                 Seen(rec.offset, payload_fingerprint(rec.value, rec.headers),
                                      rec.timestamp), now_ms())

    def _drain_own(self, woken: set[str]) -> None:
        """Index the own writes the frontier has reached."""
        own = self._own
        while self.next_offset in own:
            offset = self.next_offset
            queue, rec = own.pop(offset)
            self._index(queue, rec, woken)
            self.own_indexed.add(offset)
            self._own_order.append(offset)
            self.next_offset = offset + 1

    def _after_indexing(self, woken: set[str]) -> None:
        for queue in woken:
            self._wake(queue)
        self._wake_positions()

    def apply_records(self, records: Iterable[tuple[str, Record]], high_watermark: int | None
                      ) -> None:
        """Index records the tail consumed from the data partition (in offset order)."""
        woken: set[str] = set()
        if high_watermark is not None and self.replay_target is None:
            self.replay_target = high_watermark  # the end seen at assignment
            # While replaying, a record more than a cache's worth below that end would be
            # evicted before the replay ends: not caching it saves two thirds of the indexing
            # work (1.27 -> 0.40 s per million records, measured). Reset once ready.
            self._uncached_below = max(0, high_watermark - self.cache.capacity)
        tail = self.tail_offset
        own, own_indexed = self._own, self.own_indexed
        run: list[Record] = []
        run_queue = ""
        for queue, rec in records:
            offset = rec.offset
            if offset < tail:
                continue  # already seen (a re-fetch after a reassignment)
            tail = offset + 1
            if own_indexed and offset in own_indexed:
                own_indexed.discard(offset)  # our own write, indexed at its ack
                continue
            if own:
                own.pop(offset, None)  # the tail got there before the delivery report
            if offset >= self.next_offset:
                self.next_offset = offset + 1
                # A queue's consecutive records are indexed as a run (a request's records
                # come as one); a record with headers alone, in its place.
                if rec.headers:
                    if run:
                        self._index_many(run_queue, run, woken)
                        run = []
                    self._index(queue, rec, woken)
                elif run and queue == run_queue:
                    run.append(rec)
                else:
                    if run:
                        self._index_many(run_queue, run, woken)
                    run, run_queue = [rec], queue
        if run:
            self._index_many(run_queue, run, woken)
        self.tail_offset = tail
        self._forget_own_below(tail)
        self._drain_own(woken)
        self._check_data_replayed()
        self._after_indexing(woken)

    def _index_run(self, queue: str, records: Sequence[Record], woken: set[str]) -> bool:
        """The common own write, at once: one request's records without headers, at the
        frontier, consecutive, with no other own write waiting. What `_drain_own` and `_index`
        do per record, done per run (0.5 us less of the loop's CPU per enqueued record under
        load, measured). False, touching nothing, when `records` is not such a run."""
        n = len(records)
        if n < 2 or self._own:
            return False
        first = records[0].offset
        last = first + n - 1
        if first != self.next_offset or records[-1].offset != last or any(
                rec.headers for rec in records):
            return False
        self._index_many(queue, records, woken)  # records below a deletion floor: dropped
        run = range(first, last + 1)
        self.own_indexed.update(run)
        self._own_order.extend(run)
        self.next_offset = last + 1
        return True

    def _index_many(self, queue: str, records: Sequence[Record], woken: set[str]) -> bool:
        """Index one queue's `records` (ascending, at the frontier; what their headers ask for
        is the caller's): the queue is looked up, extended, cached and woken once. Records
        below the queue's deletion floor are dropped; False if that left none."""
        q = self.queues.get(queue)
        if q is None:
            q = self.queues[queue] = QueueIndex()
        elif records[0].offset < q.deleted_before:
            floor = q.deleted_before
            records = [rec for rec in records if rec.offset >= floor]
            if not records:
                return False
        if not q.offsets and not q.consumers:
            self.names.add(queue)
        if len(records) == 1:
            q.offsets.append(records[0].offset)
        else:
            q.offsets.extend([rec.offset for rec in records])
        uncached_below = self._uncached_below
        if records[-1].offset >= uncached_below:
            if records[0].offset < uncached_below:  # the run crosses it: once per replay
                records = [rec for rec in records if rec.offset >= uncached_below]
            self.cache.put_run(self.partition, records)
        if queue in self._readers:
            woken.add(queue)
        return True

    def _forget_own_below(self, tail: int) -> None:
        """The tail passed `tail`: own writes below it, delivered or skipped by the group
        thread, need no confirming any more."""
        order, own_indexed = self._own_order, self.own_indexed
        while order and order[0] < tail:
            own_indexed.discard(order.popleft())

    def apply_own(self, queue: str, records: Sequence[Record]) -> None:
        """Index records this node wrote, at once, from their delivery reports (offset order)."""
        woken: set[str] = set()
        if self._index_run(queue, records, woken):
            self._after_indexing(woken)
            return
        for rec in records:
            if rec.offset >= self.next_offset:
                self._own[rec.offset] = (queue, rec)
        self._drain_own(woken)
        self._after_indexing(woken)

    def skip_to(self, next_offset: int) -> None:
        """The tail passed `next_offset`: records it did not deliver below that are not queue
        records (no key, misrouted) or own writes indexed already."""
        if next_offset > self.tail_offset:
            self.tail_offset = next_offset
            self._forget_own_below(next_offset)
            woken: set[str] = set()
            if next_offset > self.next_offset:
                self.next_offset = next_offset
                self._drain_own(woken)
            self._check_data_replayed()
            self._after_indexing(woken)

    def reached_end(self, next_offset: int) -> None:
        """The tail reached the partition's end."""
        self.skip_to(next_offset)
        if not self.data_replayed:
            self.data_replayed = True
            self._update_ready()

    def apply_logged(self, entries: Iterable[tuple[int, OffsetEntry]]) -> None:
        """Apply replayed (writer generation, entry) pairs in log order, ignoring what an owner
        wrote after a newer owner fenced it off (a zombie's late write)."""
        for generation, e in entries:
            if isinstance(e, OwnerFenced):
                self.fence = max(self.fence, e.generation)
            elif generation < self.fence:
                self.fenced_entries += 1
            else:
                self.apply_offset_entries((e,))

    def apply_offset_entries(self, entries: Iterable[OffsetEntry]) -> None:
        """Apply offset-topic entries in log order (replay, or our own writes)."""
        for e in entries:
            if isinstance(e, ConsumerAcked):
                q = self.queue(e.queue)
                if not q.listed:
                    self.names.add(e.queue)
                if q.consumers is NO_CONSUMERS:
                    q = self.queues.stateful(e.queue, q)
                    q.consumers = {}
                q.consumers[e.consumer] = (e.offset, e.acked_at_ms)
                work = self.work.get((e.queue, e.consumer))
                if work is not None:
                    work.frontier = max(work.frontier, e.offset)
                    work.settle_below(e.offset)
                    work.dead_lettered = e.dead_lettered
            elif isinstance(e, ConsumerDeleted):
                self.configs.pop((e.queue, e.consumer), None)
                self.work.pop((e.queue, e.consumer), None)
                known = self.queues.get(e.queue)
                if known is not None and known.consumers.pop(e.consumer, None) is not None:
                    self._forget_if_empty(e.queue, known)
            elif isinstance(e, QueueDeleted):
                self.delete_queue(e.queue, e.deleted_before)
            elif isinstance(e, ConsumerConfigured):
                key = (e.queue, e.consumer)
                self.configs[key] = ConsumerConfig(e.mode, e.max_attempts, e.dead_letter_queue,
                                                   e.visibility_ms)
                if e.mode == LEASE:
                    if key not in self.work:
                        committed = self.committed(e.queue, e.consumer)
                        self.work[key] = WorkState(committed or 0)
                else:
                    self.work.pop(key, None)
            elif isinstance(e, ConsumerConfigCleared):
                self.configs.pop((e.queue, e.consumer), None)
                self.work.pop((e.queue, e.consumer), None)
            elif isinstance(e, DeliveryUpdated):
                self._apply_delivery(e)
            elif isinstance(e, DeliveryCleared):
                work = self.work.get((e.queue, e.consumer))
                if work is not None:
                    work.deliveries.pop(e.offset, None)
            elif isinstance(e, OwnerFenced):
                self.fence = max(self.fence, e.generation)

    def _apply_delivery(self, e: DeliveryUpdated) -> None:
        key = (e.queue, e.consumer)
        work = self.work.get(key)
        if work is None:
            work = self.work[key] = WorkState(0)
        committed = self.committed(e.queue, e.consumer) or 0
        if e.offset < committed:
            return  # settled already (its tombstone may not have been written)
        work.frontier = max(work.frontier, e.offset + 1)
        if e.done:
            work.deliveries.pop(e.offset, None)
            work.done.add(e.offset, self.queue(e.queue).offsets)
        else:
            work.deliveries[e.offset] = Delivery(e.attempts, e.until_ms, e.leased,
                                                 e.order_key, e.reason)

    def mark_offsets_replayed(self) -> None:
        self.offsets_replayed = True
        self._update_ready()

    def _check_data_replayed(self) -> None:
        if (not self.data_replayed and self.replay_target is not None
                and self.tail_offset >= self.replay_target):
            self.data_replayed = True
            self._update_ready()

    def _update_ready(self) -> None:
        if self.data_replayed and self.offsets_replayed and not self.revoked:
            self._uncached_below = 0
            self.ready.set()

    def revoke(self) -> None:
        """The partition was given up: wake everybody so they find out."""
        self.revoked = True
        self.ready.clear()
        for queue in list(self._readers):
            self._wake(queue)
        for _, fut in self._position_waiters:
            if not fut.done():
                fut.set_result(True)
        self._position_waiters.clear()

    def dismantle(self) -> Iterator[None]:
        """Free a revoked partition's index a step at a time; the caller yields the loop
        between steps. A million queues dropped at once held the loop for 245 ms (measured);
        a step here frees one shard of the queue map (1-2 ms at a million queues, 15 ms at
        worst) or DISMANTLE_STEP entries of the tag index or the idempotency window."""
        queues, tags, window = self.queues, self.tags, self.idempotency
        self.queues, self.names, self.tags = QueueMap(), SortedList(), {}
        self.idempotency = IdempotencyWindow(window.window_ms)
        # The sorted list of names goes first, whole: the map still holds every name, so that
        # frees only the list (7 ms at a million). After the map, it freed the names' strings
        # too: 29 ms in one step (measured).
        yield
        for shard in range(QUEUE_SHARDS):
            queues.clear_shard(shard)
            yield
        while tags:
            for _ in range(min(len(tags), DISMANTLE_STEP)):
                tags.popitem()
            yield
        yield from window.drain(DISMANTLE_STEP)

    # Queries and changes -----------------------------------------------------------------------

    def queue(self, name: str) -> QueueIndex:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueIndex()
        return q

    def select(self, queue: str, start: int, limit: int) -> list[int]:
        """Offsets of up to `limit` records of `queue` at or after `start`."""
        q = self.queues.get(queue)
        if q is None:
            return []
        i = q.position(max(start, q.deleted_before))
        return q.offsets[i : i + limit].tolist()

    def select_tagged(self, queue: str, tag: str, start: int, limit: int) -> list[int]:
        """Offsets of up to `limit` records of `queue` carrying `tag`, at or after `start`,
        from the tag index (never a scan of the queue)."""
        q = self.queues.get(queue)
        offsets = self.tags.get(queue, {}).get(tag)
        if q is None or offsets is None:
            return []
        i = bisect_left(offsets, max(start, q.deleted_before))
        return offsets[i:i + limit].tolist()

    def end_of(self, queue: str, start: int) -> int:
        """The offset after the queue's last record (at least `start`): where a filtered
        read that found nothing more has looked up to."""
        q = self.queues.get(queue)
        return max(start, q.offsets[-1] + 1) if q is not None and q.offsets else start

    def _trim_tags(self, queue: str, before: int) -> None:
        by_tag = self.tags.get(queue)
        if by_tag is None:
            return
        for tag in list(by_tag):
            offsets = by_tag[tag]
            cut = bisect_left(offsets, before)
            if cut:
                del offsets[:cut]
            if not offsets:
                del by_tag[tag]
        if not by_tag:
            del self.tags[queue]

    def first_offset(self, queue: str) -> int:
        """Where a consumer with no committed offset starts: the first retained record."""
        q = self.queues.get(queue)
        if q is None:
            return 0
        return q.offsets[0] if q.offsets else max(q.deleted_before, 0)

    def committed(self, queue: str, consumer: str) -> int | None:
        q = self.queues.get(queue)
        if q is None:
            return None
        entry = q.consumers.get(consumer)
        return None if entry is None else max(entry[0], q.deleted_before)

    def idle(self, queue: str, consumer: str, acked_before_ms: int) -> bool:
        """Whether `consumer` of `queue` exists and last acked before `acked_before_ms`."""
        q = self.queues.get(queue)
        entry = None if q is None else q.consumers.get(consumer)
        return entry is not None and entry[1] < acked_before_ms

    def window_tombstones(self, queue: str, consumer: str) -> list[OffsetEntry]:
        """Tombstones for every delivery-state key a lease consumer may have written."""
        work = self.work.get((queue, consumer))
        if work is None:
            return []
        q = self.queues.get(queue)
        window = (work.window(q.offsets, self.committed(queue, consumer) or 0)
                  if q is not None else ())
        offsets = set(work.deliveries) | set(window)
        return [DeliveryCleared(queue, consumer, o) for o in sorted(offsets)]

    def consumer_tombstones(self, queue: str, consumer: str) -> list[OffsetEntry]:
        """Everything a deleted consumer leaves in the offset topic, as tombstones: its
        committed offset, its settings and its window."""
        entries: list[OffsetEntry] = [ConsumerDeleted(queue, consumer)]
        if (queue, consumer) in self.configs:
            entries.append(ConsumerConfigCleared(queue, consumer))
        return entries + self.window_tombstones(queue, consumer)

    def delete_queue(self, queue: str, deleted_before: int) -> None:
        q = self.queue(queue)
        if deleted_before > q.deleted_before:
            q = self.queues.stateful(queue, q)
            q.deleted_before = deleted_before
        q.trim_before(q.deleted_before)
        self._trim_tags(queue, q.deleted_before)
        self.schedule.drop_below(queue, q.deleted_before)
        if isinstance(q, StatefulQueueIndex):
            q.consumers = NO_CONSUMERS
        for key in [k for k in self.configs if k[0] == queue]:
            del self.configs[key]
        for key in [k for k in self.work if k[0] == queue]:
            del self.work[key]
        self._forget_if_empty(queue, q)

    def _forget_if_empty(self, queue: str, q: QueueIndex) -> None:
        """Unlist a queue with no record and no consumer; drop its index entry unless a
        deletion marker above the log start still has to hide older records."""
        if q.listed:
            return
        self.names.discard(queue)
        if q.deleted_before <= self.log_start:
            self.queues.pop(queue, None)

    def trim_schedule(self, log_start: int) -> int:
        """Scheduled records retention removed before their time: they are gone (the longest
        delay is meant to stay below the retention). Returns how many."""
        return self.schedule.drop_below(None, log_start)

    def trim(self, log_start: int, names: Iterable[str]) -> int:
        """Retention: drop the offsets below `log_start` of the queues `names` (a chunk of
        them, so a caller can spread a million queues over many loop turns); a queue left with
        no record and no consumer leaves the index. Returns how many queues were dropped."""
        self.log_start = max(self.log_start, log_start)
        log_start = self.log_start
        dropped = 0
        for name in names:
            q = self.queues.get(name)
            if q is None or not q.offsets or q.offsets[0] >= log_start:
                if q is not None and not q.listed and q.deleted_before <= log_start:
                    self.queues.pop(name, None)
                    dropped += 1
                continue
            q.trim_before(log_start)
            self._trim_tags(name, log_start)
            if not q.listed:
                self._forget_if_empty(name, q)
                dropped += name not in self.queues
        return dropped

    def consumer_lags(self, names: Iterable[str]) -> list[tuple[int, str, str]]:
        """(lag in records, queue, consumer) of the consumers of the queues `names`."""
        out: list[tuple[int, str, str]] = []
        for name in names:
            q = self.queues.get(name)
            if q is not None and q.consumers:
                n = len(q.offsets)
                out.extend((n - q.position(max(off, q.deleted_before)), name, c)
                           for c, (off, _) in q.consumers.items())
        return out

    def expired_consumers(self, acked_before_ms: int, names: Iterable[str]
                          ) -> list[tuple[str, str]]:
        """(queue, consumer) of the consumers among `names` whose last ack is older."""
        out: list[tuple[str, str]] = []
        for name in names:
            q = self.queues.get(name)
            if q is not None and q.consumers:  # most queues have none: one lookup each
                out.extend((name, c) for c, (_, at) in q.consumers.items()
                           if at < acked_before_ms)
        return out

    def stats(self, queue: str) -> QueueStats | None:
        q = self.queues.get(queue)
        if q is None or not q.listed:
            return None
        n = len(q.offsets)
        consumers = {}
        for name, (off, _) in sorted(q.consumers.items()):
            off = max(off, q.deleted_before)
            consumers[name] = (off, n - q.position(off))
        return QueueStats(queue, n, q.offsets[0] if n else None, q.offsets[-1] if n else None,
                          consumers)

    def queue_names(self, start: str = "", after: str | None = None) -> Iterator[str]:
        """Listed queue names in order, from `start` (inclusive) or after `after`."""
        names: Iterator[str]
        if after is not None and after >= start:
            names = self.names.irange(minimum=after, inclusive=(False, True))
        else:
            names = self.names.irange(minimum=start)
        return names

    # Offset-topic writes in flight: a revocation waits for them, so the next owner's replay
    # sees every write this node acknowledged.

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self.begin_write()
        try:
            yield
        finally:
            self.end_write()

    def begin_write(self) -> None:
        self._writes += 1

    def end_write(self) -> None:
        self._writes -= 1
        if self._writes == 0 and self._writes_done is not None:
            self._writes_done.set()

    async def wait_writes(self, timeout_s: float) -> bool:
        if self._writes == 0:
            return True
        self._writes_done = asyncio.Event()
        try:
            await asyncio.wait_for(self._writes_done.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def wake(self, queue: str) -> None:
        """Wake the readers and leasers parked on `queue` (its consumers' state changed)."""
        self._wake(queue)

    def wake_all(self) -> None:
        """Wake every parked reader (shutdown: they answer with what they have)."""
        for queue in list(self._readers):
            self._wake(queue)

    # Waiting -----------------------------------------------------------------------------------

    async def wait_for_records(self, queue: str, timeout_s: float) -> None:
        """Return when a record of `queue` is indexed, the partition is revoked, or on timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._readers.setdefault(queue, {})[fut] = None
        # A timer that resolves the future, not asyncio.wait_for, which makes a coroutine, a
        # second future and a callback per wait: every collection scans what a parked reader
        # holds (3,000 of them: 60 ms per collection, measured).
        timer = loop.call_later(timeout_s, _resolve, fut, None)
        try:
            await fut
        finally:
            timer.cancel()
            waiters = self._readers.get(queue)
            if waiters is not None:
                waiters.pop(fut, None)
                if not waiters:
                    del self._readers[queue]

    def parked_readers(self, queue: str) -> int:
        """How many reads of `queue` wait for a record (long polls)."""
        return len(self._readers.get(queue, ()))

    async def wait_indexed(self, offset: int, timeout_s: float) -> bool:
        """Wait until the record at `offset` is indexed (read-your-writes); False on timeout."""
        if self.next_offset > offset or self.revoked:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._position_waiters.append((offset, fut))
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()

    def _wake(self, queue: str) -> None:
        for fut in self._readers.pop(queue, ()):
            if not fut.done():
                fut.set_result(None)

    def _wake_positions(self) -> None:
        if not self._position_waiters:
            return
        keep = []
        for offset, fut in self._position_waiters:
            if fut.done():
                continue
            if self.next_offset > offset:
                fut.set_result(True)
            else:
                keep.append((offset, fut))
        self._position_waiters = keep
