"""The queue rules: enqueue, read, ack, inspect and delete. HTTP calls these; they call down to
the owned partitions' state and the storage seams (vqueues/storage.py). Every function returns a
typed result (vqueues/results.py)."""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Sequence

from vqueues.errors import BadRequest, Conflict, NotFound
from vqueues.hashing import partition_for
from vqueues.locks import KeyedLocks
from vqueues.ownership.ownership import Ownership
from vqueues.queues.entry_writer import EntryWriter
from vqueues.queues.keyed_enqueue import KeyedEnqueue
from vqueues.queues.record_reader import RecordReader
from vqueues.records import (
    ConsumerAcked,
    NewRecord,
    OffsetEntry,
    QueueDeleted,
    Record,
    now_ms,
)
from vqueues.results import (
    AckResult,
    ConsumerDeletion,
    ConsumerInfo,
    EnqueueResult,
    QueueDeletion,
    QueueInfo,
    QueueList,
    QueueSummary,
    ReadResult,
    ScheduledCancellation,
)
from vqueues.settings import Settings
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import CURSOR, LEASE, configured
from vqueues.state.idempotency import key_of
from vqueues.state.partition_state import PartitionState
from vqueues.state.schedule import CANCEL_HEADER
from vqueues.storage import Delivered, Log, OffsetLog, RecordFetcher

log = logging.getLogger(__name__)


def _select(state: PartitionState, queue: str, tag: str | None, start: int, limit: int
            ) -> list[int]:
    """The offsets a read answers with: up to `limit` from `start`, those carrying `tag` if
    one is given."""
    if tag is None:
        return state.select(queue, start, limit)
    return state.select_tagged(queue, tag, start, limit)


class QueueService:
    def __init__(self, settings: Settings, ownership: Ownership, cache: RecordCache,
                 data_log: Log, offset_log: OffsetLog, fetcher: RecordFetcher,
                 home: Callable[[int, int], int] | None = None) -> None:
        self.settings = settings
        self.ownership = ownership
        self.metrics = ownership.metrics
        self.partitions = ownership.partitions
        self.cache = cache
        self._data = data_log
        self._offsets = offset_log
        self.entries = EntryWriter(offset_log)  # every offset-topic write goes through it
        self.reader = RecordReader(settings, cache, fetcher, home)
        self.locks = KeyedLocks()
        self._keyed = KeyedEnqueue(self)
        # Highest offset this node's producer had acknowledged, per partition (for deletions).
        self._produced_max: dict[int, int] = {}

    def partition_of(self, queue: str) -> int:
        return partition_for(queue, self.partitions)

    # Records ---------------------------------------------------------------------------------

    async def enqueue(self, queue: str, records: Sequence[NewRecord],
                      places: Sequence[int] | None = None) -> EnqueueResult:
        """Write records to the queue; answer once the broker acked them.

        The records are indexed from their delivery reports, so a read right after an enqueue
        sees them; if another producer's record sits below them and the tail has not read it
        yet, the answer waits (up to write_visible_timeout_ms) for it. With acks=0 offsets are
        unknown: None (those records become readable through the tail). `places`: each
        record's index in a request that held other queues' records too (errors name them so).
        """
        p = self.partition_of(queue)
        state = self.ownership.require(p)
        keys = [key_of(headers) if headers else None for _, headers in records]
        if not any(keys) or self.settings.producer_acks == "0":
            return await self.append_records(queue, records, state)
        return await self._keyed.enqueue(queue, records, keys, places)

    async def append_records(self, queue: str, records: Sequence[NewRecord],
                             state: PartitionState | None = None,
                             known: Sequence[tuple[int, int] | None] | None = None
                             ) -> EnqueueResult:
        """Write records to `queue`'s partition, owned here (`state`) or not (then the owner's
        tail indexes them, as for any producer: dead letters go this way). `known`: each
        keyed record's key and payload fingerprints, which indexing then need not compute."""
        p = self.partition_of(queue)
        key = queue.encode("utf-8")
        outgoing = [(key, value, headers) for value, headers in records]
        if state is None:
            acked = await self._data.append(p, outgoing)
        else:
            with state.appending():  # a cut waits for it, and none starts during one
                acked = await self._data.append(p, outgoing)
        if not self._acknowledged(p, acked):
            return EnqueueResult(p, None)
        offsets = [o for o, _ in acked]
        if state is None:
            return EnqueueResult(p, offsets)
        _index_own(state, queue, acked, records, known)
        await self._visible(state, offsets[-1])
        return EnqueueResult(p, offsets)

    async def append_queues(self, p: int, state: PartitionState,
                            groups: Sequence[tuple[str, Sequence[NewRecord]]]
                            ) -> list[list[int] | None]:
        """Write several queues' records (none keyed) to partition `p`, owned here, in one
        produce: each queue's records in order. Each queue's offsets (None with acks=0)."""
        with state.appending():
            acked = await self._data.append(p, [(queue.encode("utf-8"), value, headers)
                                                for queue, records in groups
                                                for value, headers in records])
        if not self._acknowledged(p, acked):
            return [None] * len(groups)
        out: list[list[int] | None] = []
        at = 0
        for queue, records in groups:
            mine = acked[at:at + len(records)]
            at += len(records)
            _index_own(state, queue, mine, records, None)
            out.append([o for o, _ in mine])
        await self._visible(state, acked[-1][0])
        return out

    def _acknowledged(self, p: int, acked: Sequence[Delivered]) -> bool:
        """Count a write's records and note its last offset (for deletions); False when the
        offsets are unknown (acks=0, or a resent batch stored without them)."""
        self.metrics.records_enqueued.inc(len(acked))
        if self.settings.producer_acks == "0" or min(o for o, _ in acked) < 0:
            return False
        last = acked[-1][0]
        if last > self._produced_max.get(p, -1):
            self._produced_max[p] = last
        return True

    async def _visible(self, state: PartitionState, last: int) -> None:
        """Wait until the partition is indexed up to `last`: with a gap below this node's
        records (another producer's, not read yet) the tail fills it first."""
        if state.next_offset <= last:
            await state.wait_indexed(last, self.settings.write_visible_timeout_ms / 1000)

    async def read(self, queue: str, consumer: str | None, offset: int | None, limit: int,
                   wait_ms: int, tag: str | None = None) -> ReadResult:
        """Records of `queue` from the explicit offset, the consumer's, or the first retained;
        with `tag`, only those carrying it (from the tag index), and `next_offset` moves past
        the records skipped."""
        p = self.partition_of(queue)
        state = self.ownership.require(p)
        if offset is not None:
            start = offset
        else:
            committed = state.committed(queue, consumer) if consumer else None
            start = committed if committed is not None else state.first_offset(queue)
        # No closure here: its cells and function would be objects every parked read holds,
        # which every garbage collection scans.
        offsets = _select(state, queue, tag, start, limit)
        deadline = time.monotonic() + wait_ms / 1000
        while not offsets:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ownership.draining:
                break
            await state.wait_for_records(queue, remaining)
            state = self.ownership.require(p)
            offsets = _select(state, queue, tag, start, limit)
        records = await self.reader.resolve(p, offsets)
        # Bound the answer's size; always return at least one record so a reader moves on.
        budget = self.settings.max_read_bytes
        kept: list[Record] = []
        for rec in records:
            budget -= len(rec.value) if rec.value else 0
            if kept and budget < 0:
                break
            kept.append(rec)
        self.metrics.records_read.inc(len(kept))
        if kept:
            next_offset = kept[-1].offset + 1
        elif offsets:
            next_offset = offsets[-1] + 1  # all of them are gone (retention)
        elif tag is not None:
            next_offset = state.end_of(queue, start)  # no record up to there carries the tag
        else:
            next_offset = start
        return ReadResult(p, kept, next_offset)

    # Consumers -------------------------------------------------------------------------------

    async def ack(self, queue: str, consumer: str, offset: int, allow_rewind: bool
                  ) -> AckResult:
        """Move the consumer's committed offset (the next offset to read) to `offset`, durably."""
        p = self.partition_of(queue)
        async with self.locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            previous = state.committed(queue, consumer)
            if offset > state.next_offset:
                raise BadRequest("offset_out_of_range",
                                 f"offset {offset} is past the end of partition {p} "
                                 f"({state.next_offset})", partition_end=state.next_offset)
            config = state.configs.get((queue, consumer))
            if config is not None and config.mode == LEASE:
                raise Conflict("consumer_mode_mismatch", f"consumer {consumer!r} is a lease "
                               "consumer: complete its leased records instead of acking",
                               mode=LEASE)
            if previous is not None and offset < previous and not allow_rewind:
                raise Conflict("rewind_not_allowed",
                               f"consumer {consumer!r} is at {previous}; moving it back to "
                               f"{offset} needs allow_rewind", committed_offset=previous)
            await self.entries.write(state, [ConsumerAcked(queue, consumer, offset, now_ms())])
            self.metrics.acks.inc()
        return AckResult(queue, consumer, offset, previous)

    async def delete_consumer(self, queue: str, consumer: str) -> ConsumerDeletion:
        p = self.partition_of(queue)
        async with self.locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            previous = state.committed(queue, consumer)
            if previous is None:
                raise NotFound("consumer_not_found",
                               f"queue {queue!r} has no consumer {consumer!r}")
            await self.entries.write(state, state.consumer_tombstones(queue, consumer))
        return ConsumerDeletion(queue, consumer, True, previous)

    # Queues ----------------------------------------------------------------------------------

    def queue_info(self, queue: str) -> QueueInfo:
        p = self.partition_of(queue)
        state = self.ownership.require(p)
        stats = state.stats(queue)
        scheduled = len(state.schedule.by_queue.get(queue, ()))
        next_due = state.schedule.next_due(queue)
        if stats is None:
            if scheduled:
                return QueueInfo(queue, p, 0, None, None, [], scheduled, next_due)
            raise NotFound("queue_not_found", f"queue {queue!r} has no records and no consumers")
        consumers = []
        now = now_ms()
        offsets = state.queues[queue].offsets
        for name, (off, lag) in stats.consumers.items():
            work = state.windows.get((queue, name))
            if work is None:
                consumers.append(ConsumerInfo(name, off, lag, CURSOR, 0, 0, lag, 0))
                continue
            in_flight, delayed, available = work.counts(offsets, off, now)
            consumers.append(ConsumerInfo(name, off, lag, LEASE, in_flight, delayed, available,
                                          work.dead_lettered))
        return QueueInfo(stats.queue, p, stats.records, stats.first_offset, stats.last_offset,
                         consumers, scheduled, next_due)

    async def cancel_scheduled(self, queue: str, record_id: int) -> ScheduledCancellation:
        """Cancel a scheduled record before it is due: a cancellation record in the data log
        (so every later owner sees it too)."""
        p = self.partition_of(queue)
        state = self.ownership.require(p)
        schedule = state.schedule
        if not schedule.holds(queue, record_id) or record_id in schedule.moving:
            raise NotFound("scheduled_not_found", f"queue {queue!r} has no record {record_id} "
                           "waiting for its due time (delivered, cancelled, or never scheduled)")
        schedule.moving.add(record_id)  # the scheduler leaves it alone meanwhile
        try:
            await self.append_records(queue, [(None, [(CANCEL_HEADER, str(record_id).encode())])],
                                      state)
        finally:
            schedule.moving.discard(record_id)
        schedule.remove(queue, record_id)
        return ScheduledCancellation(queue, record_id, True)

    async def delete_queue(self, queue: str, keep: str | None = None) -> QueueDeletion:
        """Delete the queue and its consumers: a marker in the offset topic hides every record
        below the partition's current end, for this node and every later owner. `keep`: a
        consumer that stays, with its settings, at the new start (an SQS PurgeQueue), in the
        same offset-topic write."""
        p = self.partition_of(queue)
        async with self.locks.hold(("q", queue)), self.locks.hold(("c", queue, keep or "")):
            state = self.ownership.require(p)
            stats = state.stats(queue)
            if stats is None:
                raise NotFound("queue_not_found",
                               f"queue {queue!r} has no records and no consumers")
            # The partition's end: what we indexed, what we wrote, what the broker reports
            # (the last can be low on tansu; the first two are exact for what we know of).
            broker_end = await self.reader.log_end(p)
            before = max(state.next_offset, self._produced_max.get(p, -1) + 1, broker_end)
            entries: list[OffsetEntry] = [QueueDeleted(queue, before)]
            for c in stats.consumers:
                entries += state.consumer_tombstones(queue, c)
            kept = state.configs.get((queue, keep)) if keep is not None else None
            if keep is not None and kept is not None:
                entries += [ConsumerAcked(queue, keep, before, now_ms()),
                            configured(queue, keep, kept)]
            await self.entries.write(state, entries)
            self.metrics.queues_deleted.inc()
        return QueueDeletion(queue, True, p, stats.records, sorted(stats.consumers), before)

    def list_queues(self, prefix: str, after: str | None, limit: int, stats: bool = False
                    ) -> QueueList:
        """A page of the listed queues' names, in order: each ready partition keeps its names
        sorted, so a page merges `limit + 1` names from each, never sorting them all."""
        runs = []
        for state in self.ownership.states.values():
            if state.ready.is_set():
                names = state.queue_names(prefix, after)
                runs.append(itertools.islice(
                    itertools.takewhile(lambda n: n.startswith(prefix), names), limit + 1))
        page = list(itertools.islice(heapq.merge(*runs), limit + 1))
        more = len(page) > limit
        del page[limit:]
        summaries = [self._summary(name) for name in page] if stats else None
        return QueueList(page, page[-1] if more and page else None, summaries)

    def _summary(self, queue: str) -> QueueSummary:
        p = self.partition_of(queue)
        st = self.ownership.states[p].stats(queue)
        if st is None:  # listed by its scheduled records alone
            return QueueSummary(queue, p, 0, None, None, 0, 0)
        return QueueSummary(queue, p, st.records, st.first_offset, st.last_offset,
                            len(st.consumers), max((lag for _, lag in st.consumers.values()),
                                                   default=0))

    async def expire_consumer(self, state: PartitionState, queue: str, consumer: str,
                              acked_before_ms: int) -> bool:
        """Remove a consumer that last acked before `acked_before_ms` (maintenance, past
        `consumer_retention_ms`), durably. Checked again under the consumer's lock: one that
        acked, or was deleted, since the pass found it idle is left as it is (False)."""
        async with self.locks.hold(("c", queue, consumer)):
            if state.revoked or not state.idle(queue, consumer, acked_before_ms):
                return False
            await self.entries.write(state, state.consumer_tombstones(queue, consumer))
            self.metrics.consumers_expired.inc()
            return True

    def close(self) -> None:
        self.reader.close()


def _index_own(state: PartitionState, queue: str, acked: Sequence[Delivered],
               records: Sequence[NewRecord], known: Sequence[tuple[int, int] | None] | None
               ) -> None:
    """Index records this node wrote, from their delivery reports: readable now, as the tail
    would make them (ADR 6). Under load the tail often gets there first: those are not made
    again. `known`: each keyed record's fingerprints."""
    indexed_below = state.next_offset
    if acked[-1][0] < indexed_below:
        return
    memo = state.idempotency.known
    if known:
        memo.update((o, k) for (o, _), k in zip(acked, known, strict=True)
                    if k is not None and o >= indexed_below)
    try:
        state.apply_own(queue, [Record(o, ts, value, tuple(headers))
                                for (o, ts), (value, headers) in zip(acked, records, strict=True)
                                if o >= indexed_below])
    finally:
        memo.clear()  # those behind a gap are indexed later, computing their own
