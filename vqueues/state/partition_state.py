"""What a node knows about one data partition it owns, and the coordinator over its parts.

A `PartitionState` is built by replay (the offset partition's entries and the data partition's
records from the beginning, or from a snapshot on) and then kept current by the tail. It lives
on the event loop only: the Kafka threads hand it batches, it never blocks, and it wakes
waiting readers. Each kind of state is a part of its own, named after it:

- `index` (`partition_index.PartitionIndex`), the queue index: `queues`
  (`queue_map.QueueMap` of `queue_index.QueueIndex`: a queue's offsets, its consumers'
  committed offsets and its deletion floor), `names` (listed queues, in order) and
  `log_start`, with deletion floors and retention; committed offsets through
  `committed_offsets`;
- `frontier` (`frontier.Frontier`): the order records are indexed in;
- `tags` (`tag_index.TagIndex`), `schedule` (`schedule.Schedule`), `idempotency`
  (`idempotency.IdempotencyWindow`): what records' headers ask the index to remember;
- `leases` (`lease_windows.LeaseWindows`): consumer settings and lease windows;
- `waiters` (`waiters.Waiters`) and `writes` (`writes_in_flight.WritesInFlight`).

This class keeps the frontier (records are indexed into the parts by `record_indexing`),
hands offset-topic entries to the parts they concern, and answers whether the partition is
ready. Snapshots (`snapshot.py`) capture and
restore each part through the part's own `capture`/`restore`.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedList

from vqueues.errors import Unavailable
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
    WindowDelta,
    WindowKeyCleared,
    now_ms,
)
from vqueues.state import committed_offsets
from vqueues.state.cache import RecordCache
from vqueues.state.committed_offsets import ConsumerWalk, QueueStats
from vqueues.state.consumer_config import ConsumerConfig
from vqueues.state.frontier import Frontier
from vqueues.state.idempotency import IdempotencyWindow
from vqueues.state.layout_cut_gate import LayoutCutGate
from vqueues.state.lease_windows import LeaseWindows
from vqueues.state.partition_index import PartitionIndex
from vqueues.state.prefix_consumers import PrefixConsumers
from vqueues.state.queue_index import QueueIndex
from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap
from vqueues.state.ready_queues import ReadyQueues
from vqueues.state.record_indexing import RecordIndexer
from vqueues.state.schedule import Schedule
from vqueues.state.tag_index import TagIndex
from vqueues.state.waiters import Waiters
from vqueues.state.window import LeaseWindow
from vqueues.state.writes_in_flight import WritesInFlight

DISMANTLE_STEP = 4096  # entries freed per loop pass when a revoked partition's state is freed


class PartitionState:
    """One owned partition's parts, its frontier (`frontier.Frontier`: the order records are
    indexed in) and its readiness."""

    def __init__(self, partition: int, cache: RecordCache,
                 idempotency_window_ms: int = 600_000,
                 prefixes: PrefixConsumers | None = None) -> None:
        self.partition = partition
        self.cache = cache
        self.index = PartitionIndex()
        self.tags = TagIndex()
        self.schedule = Schedule()  # records to deliver later
        self.idempotency = IdempotencyWindow(idempotency_window_ms)
        self.lease_windows = LeaseWindows()
        self.waiters = Waiters()
        self.writes = WritesInFlight()
        self.prefixes = prefixes  # the cluster's prefix consumers (node-wide)
        self.ready_queues = ReadyQueues(prefixes.wake if prefixes is not None else None)
        self.indexer = RecordIndexer(self)
        # Late-bound, so what indexes a record can be swapped in a test of the runs.
        self.frontier = Frontier(lambda q, rec, woken: self.indexer.index(q, rec, woken),
                                 lambda q, recs, woken: self.indexer.index_records(q, recs, woken))
        self.offsets_position = 0  # every offset-topic entry below it is applied
        self.replay_target: int | None = None  # the end seen at assignment
        self.data_replayed = False
        self.offsets_replayed = False
        self.revoked = False
        self.ready = asyncio.Event()
        self.fence = 0  # the highest owner generation fenced in the offset partition
        self.generation = 0  # this owner's generation (its fence), carried by every write
        self.fenced_entries = 0  # entries replay ignored: written by a fenced-off owner
        self.cut = LayoutCutGate()  # leaving for a new layout (ADR 19)

    @property
    def queues(self) -> QueueMap:
        """Every queue's offsets, deletion floor and consumers (`PartitionIndex`)."""
        return self.index.queues

    @property
    def names(self) -> SortedList:
        """The listed queues' names, in order."""
        return self.index.names

    @property
    def log_start(self) -> int:
        """The data partition's first retained offset, as last learnt."""
        return self.index.log_start

    @property
    def next_offset(self) -> int:
        """The frontier: every offset below it is indexed or not a record."""
        return self.frontier.next_offset

    @property
    def tail_offset(self) -> int:
        """The next data offset the tail will deliver."""
        return self.frontier.tail_offset

    @property
    def own_indexed(self) -> set[int]:
        """Own writes indexed ahead of the tail (the group thread reads it: `Frontier`)."""
        return self.frontier.own_indexed

    @property
    def configs(self) -> dict[tuple[str, str], ConsumerConfig]:
        """Consumers with settings, by (queue, consumer)."""
        return self.lease_windows.configs

    @property
    def windows(self) -> dict[tuple[str, str], LeaseWindow]:
        """The lease consumers' windows, by (queue, consumer)."""
        return self.lease_windows.windows

    # Indexing records at the frontier ----------------------------------------------------------

    def _after_indexing(self, woken: set[str]) -> None:
        for queue in woken:
            self.waiters.wake(queue)
        self.waiters.indexed_below(self.frontier.next_offset)

    def start_cut(self) -> None:
        """Stop serving for a layout cut (readers answer with what they have); indexing waits
        for the marker (`set_cut`)."""
        self.cut.cutting = True
        self.ready.clear()
        self.waiters.wake_all()

    def set_cut(self, marker: int) -> None:
        self.cut.set(marker)

    def apply_records(self, records: Iterable[tuple[str, Record]], high_watermark: int | None
                      ) -> None:
        """Index records the tail consumed from the data partition (in offset order)."""
        if self.cut.cutting:
            kept = list(records)
            if self.cut.hold(lambda: self.apply_records(kept, high_watermark)):
                return
            records = self.cut.below(kept)
        if high_watermark is not None and self.replay_target is None:
            self.replay_target = high_watermark  # the end seen at assignment
            # While replaying, a record more than a cache's worth below that end would be
            # evicted before the replay ends: not caching it saves most of the indexing work
            # (ADR 15). Reset once ready.
            self.indexer.uncached_below = max(0, high_watermark - self.cache.capacity)
        woken: set[str] = set()
        self.frontier.tail(records, woken)
        self._check_data_replayed()
        self._after_indexing(woken)

    def apply_own(self, queue: str, records: Sequence[Record]) -> None:
        """Index records this node wrote, at once, from their delivery reports (offset order)."""
        if self.cut.cutting:
            if self.cut.hold(lambda: self.apply_own(queue, records)):
                return
            records = [r for _, r in self.cut.below((queue, r) for r in records)]
            if not records:
                return
        woken: set[str] = set()
        if not self._index_run(queue, records, woken):
            self.frontier.own(queue, records, woken)
        self._after_indexing(woken)

    def _index_run(self, queue: str, records: Sequence[Record], woken: set[str]) -> bool:
        """The common own write (`Frontier.at_run`) at once, as one run: what indexing each
        record on its own does, done per run, which costs the loop less per record. False,
        touching nothing, for any other write."""
        if not self.frontier.at_run(records):
            return False
        self.indexer.index_records(queue, records, woken)  # below a deletion floor: dropped
        self.frontier.ran(records[0].offset, records[-1].offset)
        return True

    def skip_to(self, next_offset: int) -> None:
        """The tail passed `next_offset` (`Frontier.skip_to`)."""
        if self.cut.hold(lambda: self.skip_to(next_offset)):
            return
        woken: set[str] = set()
        if self.frontier.skip_to(next_offset, woken):
            self._check_data_replayed()
            self._after_indexing(woken)

    def reached_end(self, next_offset: int) -> None:
        """The tail reached the partition's end."""
        self.skip_to(next_offset)
        if not self.data_replayed:
            self.data_replayed = True
            self._update_ready()

    # Offset-topic entries, each to the parts it concerns -------------------------------------

    def apply_logged(self, entries: Iterable[tuple[int, OffsetEntry]]) -> None:
        """Apply replayed (writer generation, entry) pairs in log order, ignoring what an owner
        wrote after a newer owner fenced it off (a zombie's late write)."""
        for generation, e in entries:
            if isinstance(e, OwnerFenced):
                self.fence = max(self.fence, e.generation)
            elif generation < self.fence:
                self.fenced_entries += 1
                self.lease_windows.fenced(e)
            else:
                self.apply_offset_entries((e,))

    def apply_offset_entries(self, entries: Iterable[OffsetEntry], own: bool = False) -> None:
        """Apply offset-topic entries in log order (replay, or our own writes: `own`, whose
        window writes were partly applied by their writer: `WindowWrite`)."""
        leases = self.lease_windows
        for e in entries:
            if isinstance(e, WindowDelta):
                if e.low_water is not None:
                    self.index.commit(e.queue, e.consumer, e.low_water, e.ts or now_ms())
                leases.window_written(e, own, self._offsets_of)
                if own:
                    self._window_changed(e.queue, e.consumer)
            elif isinstance(e, WindowKeyCleared):
                leases.key_cleared(e)
            elif isinstance(e, ConsumerAcked):
                self.index.commit(e.queue, e.consumer, e.offset, e.acked_at_ms)
                leases.acked(e.queue, e.consumer, e.offset, e.dead_lettered)
            elif isinstance(e, ConsumerDeleted):
                leases.forget(e.queue, e.consumer)
                self.index.delete_consumer(e.queue, e.consumer)
            elif isinstance(e, QueueDeleted):
                self.delete_queue(e.queue, e.deleted_before)
            elif isinstance(e, ConsumerConfigured):
                leases.configured(e, self.committed(e.queue, e.consumer))
            elif isinstance(e, ConsumerConfigCleared):
                leases.forget(e.queue, e.consumer)
            elif isinstance(e, DeliveryUpdated):
                leases.delivery_updated(e, self.committed(e.queue, e.consumer) or 0,
                                        self._offsets_of)
            elif isinstance(e, DeliveryCleared):
                leases.delivery_cleared(e)
            elif isinstance(e, OwnerFenced):
                self.fence = max(self.fence, e.generation)

    def _window_changed(self, queue: str, consumer: str) -> None:
        """A lease window changed (records completed, given back, keys freed): if a prefix
        consumer leases from it, the queue takes its turn again if it has a record to lease
        (ADR 13)."""
        pc = self.prefixes.by_name.get(consumer) if self.prefixes is not None else None
        if pc is not None and pc.covers(queue):
            self.recheck_queue(consumer, queue)

    def recheck_queue(self, consumer: str, queue: str) -> None:
        """`queue` takes its turn for prefix consumer `consumer` if a lease may find a record
        of it now; if not, it is timed for when one of its leases runs out or a retry falls
        due. A queue whose records are all in flight or done stays out of the turns: a turn
        that finds nothing still costs a lease decision, and a pool that emptied many queues
        would leave each in turn, to be found empty by the next leases."""
        if self.may_lease(consumer, queue):
            self.ready_queues.add(consumer, queue)
            return
        work = self.lease_windows.windows.get((queue, consumer))
        at = work.next_change(now_ms()) if work is not None else None
        if at is not None:
            self.ready_queues.later(consumer, queue, at)
        else:
            self.ready_queues.untime(consumer, queue)

    def may_lease(self, consumer: str, queue: str) -> bool:
        """Whether a lease by `consumer` may find a record of `queue` now: one never looked at
        (past its window's frontier), or one of its window's available now."""
        q = self.queues.get(queue)
        if q is None or not q.offsets:
            return False
        work = self.lease_windows.windows.get((queue, consumer))
        return work is None or q.offsets[-1] >= work.frontier or work.may_lease(now_ms())

    def _offsets_of(self, queue: str) -> array[int]:
        return self.index.queue(queue).offsets

    # Readiness ---------------------------------------------------------------------------------

    def mark_offsets_replayed(self) -> None:
        self.offsets_replayed = True
        self._update_ready()

    def _check_data_replayed(self) -> None:
        if (not self.data_replayed and self.replay_target is not None
                and self.tail_offset >= self.replay_target):
            self.data_replayed = True
            self._update_ready()

    def _update_ready(self) -> None:
        if self.data_replayed and self.offsets_replayed and not self.revoked \
                and not self.cut.cutting:
            self.indexer.uncached_below = 0
            self.ready.set()

    def revoke(self) -> None:
        """The partition was given up: wake everybody so they find out."""
        self.revoked = True
        self.ready.clear()
        self.waiters.release_all()

    def dismantle(self) -> Iterator[None]:
        """Free a revoked partition's index a step at a time; the caller yields the loop
        between steps, since a million queues dropped at once would hold the loop (ADR 15).
        A step frees one shard of the queue map or DISMANTLE_STEP entries of the tag index or
        the idempotency window."""
        queues, tags, window = self.queues, self.tags, self.idempotency
        self.index, self.tags = PartitionIndex(), TagIndex()
        self.idempotency = IdempotencyWindow(window.window_ms)
        # The sorted list of names goes first, whole: the map still holds every name, so that
        # frees only the list; after the map it would free the names' strings too, in one step.
        yield
        for shard in range(QUEUE_SHARDS):
            queues.clear_shard(shard)
            yield
        yield from tags.drain(DISMANTLE_STEP)
        yield from window.drain(DISMANTLE_STEP)

    # Queries and changes: the index's (`PartitionIndex`), and what spans the parts -------

    def queue(self, name: str) -> QueueIndex:
        return self.index.queue(name)

    def select(self, queue: str, start: int, limit: int, near: int | None = None) -> list[int]:
        return self.index.select(queue, start, limit, near)

    def select_tagged(self, queue: str, tag: str, start: int, limit: int) -> list[int]:
        """Offsets of up to `limit` records of `queue` carrying `tag`, at or after `start`,
        from the tag index (never a scan of the queue)."""
        q = self.queues.get(queue)
        if q is None:
            return []
        return self.tags.select(queue, tag, max(start, q.deleted_before), limit)

    def end_of(self, queue: str, start: int) -> int:
        return self.index.end_of(queue, start)

    def first_offset(self, queue: str) -> int:
        return self.index.first_offset(queue)

    def committed(self, queue: str, consumer: str) -> int | None:
        return self.index.committed(queue, consumer)

    def idle(self, queue: str, consumer: str, acked_before_ms: int) -> bool:
        """Whether `consumer` of `queue` exists, last acked before `acked_before_ms`, and may
        expire: one whose settings carry attributes (an SQS queue's) never does."""
        return committed_offsets.idle(self.queues.get(queue), consumer, acked_before_ms) \
            and not self._kept_forever(queue, consumer)

    def _kept_forever(self, queue: str, consumer: str) -> bool:
        config = self.lease_windows.configs.get((queue, consumer))
        return config is not None and bool(config.attributes)

    def stats(self, queue: str) -> QueueStats | None:
        return self.index.stats(queue)

    def consumers_in_shard(self, shard: int, above: int, acked_before_ms: int | None
                           ) -> ConsumerWalk:
        found = self.index.consumers_in_shard(shard, above, acked_before_ms)
        if found.idle:
            found.idle = [(q, c) for q, c in found.idle if not self._kept_forever(q, c)]
        return found

    def queue_names(self, start: str = "", after: str | None = None) -> Iterator[str]:
        return self.index.queue_names(start, after)

    def window_tombstones(self, queue: str, consumer: str) -> list[OffsetEntry]:
        """Tombstones for every delivery-state key a lease consumer may have written."""
        q = self.queues.get(queue)
        return list(self.lease_windows.tombstones(queue, consumer, None if q is None else q.offsets,
                                           self.committed(queue, consumer) or 0))

    def consumer_tombstones(self, queue: str, consumer: str) -> list[OffsetEntry]:
        """Everything a deleted consumer leaves in the offset topic, as tombstones: its
        committed offset, its settings and its window."""
        entries: list[OffsetEntry] = [ConsumerDeleted(queue, consumer)]
        if (queue, consumer) in self.lease_windows.configs:
            entries.append(ConsumerConfigCleared(queue, consumer))
        return entries + self.window_tombstones(queue, consumer)

    def delete_queue(self, queue: str, deleted_before: int) -> None:
        """The queue's records below `deleted_before` and its consumers are gone, from every
        part."""
        floor = self.index.delete(queue, deleted_before)
        self.tags.trim(queue, floor)
        self.schedule.drop_below(queue, floor)
        self.lease_windows.drop_queue(queue)

    def trim_schedule(self, log_start: int) -> int:
        """Scheduled records retention removed before their time: they are gone (the longest
        delay is meant to stay below the retention). Returns how many."""
        return self.schedule.drop_below(None, log_start)

    def trim(self, log_start: int, names: Iterable[str]) -> int:
        """Retention (`PartitionIndex.trim`), the tag index following the queues."""
        return self.index.trim(log_start, names, self.tags.trim)

    # Waiting (`waiters`) and writes in flight (`writes`) ---------------------------------------

    def writing(self) -> contextlib.AbstractContextManager[None]:
        """An offset-topic write in flight while inside (a revocation waits for it)."""
        return self.writes.writing()

    def appending(self) -> contextlib.AbstractContextManager[None]:
        """A data write of its own in flight while inside: refused during a cut (ADR 19),
        whose final snapshot holds every write answered; the cut waits for those begun."""
        self.refuse_if_cutting()
        return self.writes.writing()

    def refuse_if_cutting(self) -> None:
        if self.cut.cutting:
            raise Unavailable("partition_replaying", f"partition {self.partition} is moving "
                              "to a new layout (docs/growing.md); retry shortly",
                              partition=self.partition)

    async def wait_writes(self, timeout_s: float) -> bool:
        return await self.writes.wait(timeout_s)

    def wake(self, queue: str) -> None:
        """Wake the readers and leasers parked on `queue` (its consumers' state changed)."""
        self.waiters.wake(queue)

    def wake_all(self) -> None:
        """Wake every parked reader (shutdown: they answer with what they have)."""
        self.waiters.wake_all()

    def wait_for_records(self, queue: str, timeout_s: float) -> Coroutine[Any, Any, None]:
        """Return when a record of `queue` is indexed, the partition is revoked, or on timeout.
        The waiters' coroutine itself, not one awaiting it: every collection scans what a
        parked reader holds (docs/api.md, Limits: long polls)."""
        return self.waiters.records(queue, timeout_s)

    def parked_readers(self, queue: str) -> int:
        """How many reads of `queue` wait for a record (long polls)."""
        return self.waiters.parked(queue)

    async def wait_indexed(self, offset: int, timeout_s: float) -> bool:
        """Wait until the record at `offset` is indexed (read-your-writes); False on timeout."""
        if self.next_offset > offset or self.revoked:
            return True
        return await self.waiters.position(offset, timeout_s)
