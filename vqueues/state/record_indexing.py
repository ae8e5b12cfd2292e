"""Indexing a partition's data records at the frontier (`frontier.Frontier` decides when):
each record to the parts of `PartitionState` it concerns, one queue's run at once.

A record joins its queue in the queue index and the record cache, wakes the queue's parked
readers, and gives each prefix consumer covering the queue a turn of it (`ReadyQueues`);
its headers may ask the schedule (a record to deliver later, a cancellation, a moved copy),
the tag index and the idempotency window to remember it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from vqueues.records import Record, now_ms
from vqueues.state.cache import RecordCache
from vqueues.state.idempotency import IdempotencyWindow
from vqueues.state.partition_index import PartitionIndex
from vqueues.state.prefix_consumers import PrefixConsumers
from vqueues.state.queue_map import QueueMap
from vqueues.state.ready_queues import ReadyQueues
from vqueues.state.schedule import Schedule, control_of
from vqueues.state.tag_index import TagIndex
from vqueues.state.tags import tags_of
from vqueues.state.waiters import Waiters


class Parts(Protocol):
    """The parts of a partition's state that indexing writes to
    (`partition_state.PartitionState`)."""

    partition: int
    cache: RecordCache
    index: PartitionIndex
    tags: TagIndex
    schedule: Schedule
    idempotency: IdempotencyWindow
    waiters: Waiters
    prefixes: PrefixConsumers | None
    ready_queues: ReadyQueues
    ready: asyncio.Event

    @property
    def queues(self) -> QueueMap: ...


class RecordIndexer:
    """Indexes records into one partition's parts. The parts are read through the state on
    every call: a revoked partition's are swapped for empty ones (`PartitionState.dismantle`)."""

    def __init__(self, state: Parts) -> None:
        self.state = state
        self.uncached_below = 0  # records below this offset are not cached (replay)

    def index(self, queue: str, rec: Record, woken: set[str]) -> None:
        """Index `rec` at the frontier (its offset is the frontier or past a known gap)."""
        if rec.headers and self._control(queue, rec):
            return
        if self._index_many(queue, (rec,), woken) and rec.headers:
            self.headers(queue, rec)

    def index_records(self, queue: str, records: Sequence[Record], woken: set[str]) -> None:
        """Index one queue's consecutive `records` (at the frontier) as one run: its queue
        records (moved copies of scheduled records included) join the queue at once, and the
        records to deliver later (and cancellations) go to the schedule, each in its place
        among what the headers ask for, so scheduled records do not cut the run (ADR 15)."""
        controls: dict[int, tuple[str, int]] = {}
        for i, rec in enumerate(records):
            if rec.headers:
                ctl = control_of(rec.headers)
                if ctl is not None:
                    controls[i] = ctl
        state = self.state
        if all(kind == "from" for kind, _ in controls.values()):
            for _, number in controls.values():  # moved copies: records of the queue
                state.schedule.remove(queue, number)
            self._index_with_headers(queue, records, woken)
            return
        q = state.queues.get(queue)
        run, cached, effects = _split(records, controls,
                                      q.deleted_before if q is not None else 0)
        kept = self._index_many(queue, run, woken, cached) if run else []
        if not kept:  # nothing of the queue's was indexed, nor cached
            self._cache(cached)
        # What the headers ask for, in log order: a moved copy's after its original's.
        now = now_ms()
        headed = iter([rec for rec in kept if rec.headers])
        nxt = next(headed, None)
        for rec, (kind, number) in effects:
            while nxt is not None and nxt.offset < rec.offset:
                self.headers(queue, nxt, now)
                nxt = next(headed, None)
            if kind == "at":
                state.schedule.add(queue, rec.offset, number)
                state.idempotency.remember(queue, rec, now)  # a repeat must not schedule twice
            else:  # a cancellation, or a moved copy
                state.schedule.remove(queue, number)
        while nxt is not None:
            self.headers(queue, nxt, now)
            nxt = next(headed, None)

    def headers(self, queue: str, rec: Record, now: int = 0) -> None:
        """What a record's headers ask the index to remember: its tags, its idempotency key."""
        state = self.state
        tags = tags_of(rec.headers)
        if tags:
            state.tags.add(queue, rec.offset, tags)
        state.idempotency.remember(queue, rec, now or now_ms())

    def _index_with_headers(self, queue: str, records: Sequence[Record], woken: set[str]
                            ) -> None:
        now = 0
        for rec in self._index_many(queue, records, woken):
            if rec.headers:
                now = now or now_ms()
                self.headers(queue, rec, now)

    def _index_many(self, queue: str, records: Sequence[Record], woken: set[str],
                    cached: Sequence[Record] | None = None) -> Sequence[Record]:
        """Index one queue's `records` (ascending, at the frontier; what their headers ask for
        is the caller's): the queue is looked up, extended, cached and woken once. Records
        below the queue's deletion floor are dropped; returns those kept. `cached`: what to
        cache instead of the records kept (the caller's run holds more)."""
        state = self.state
        records = state.index.append(queue, records)
        if not records:
            return records
        self._cache(records if cached is None else cached)
        if queue in state.waiters.readers:
            woken.add(queue)
        prefixes = state.prefixes
        if prefixes is not None and prefixes.by_name and state.ready.is_set():
            for pc in prefixes.covering(queue):
                state.ready_queues.add(pc.consumer, queue)
        return records

    def _cache(self, records: Sequence[Record]) -> None:
        """Cache `records` (ascending), those not below `uncached_below` (a replay's)."""
        if not records:
            return
        uncached_below = self.uncached_below
        if records[-1].offset >= uncached_below:
            if records[0].offset < uncached_below:  # the run crosses it: once per replay
                records = [rec for rec in records if rec.offset >= uncached_below]
            self.state.cache.put_run(self.state.partition, records)

    def _control(self, queue: str, rec: Record) -> bool:
        """Scheduled records: a record to deliver later goes to the schedule, not the queue; a
        cancellation or a delivered one removes it. True if `rec` is not a queue record."""
        ctl = control_of(rec.headers)
        if ctl is None:
            return False
        state = self.state
        kind, number = ctl
        if kind == "from":
            state.schedule.remove(queue, number)
            return False
        q = state.queues.get(queue)
        if q is not None and rec.offset < q.deleted_before:
            return True
        if kind == "at":
            state.schedule.add(queue, rec.offset, number)
            state.idempotency.remember(queue, rec, now_ms())  # a repeat must not schedule twice
            if rec.offset >= self.uncached_below:
                state.cache.put(state.partition, rec)  # the move reads it back at its due time
        else:
            state.schedule.remove(queue, number)
        return True


Control = tuple[str, int]


def _split(records: Sequence[Record], controls: dict[int, Control], floor: int
           ) -> tuple[list[Record], list[Record], list[tuple[Record, Control]]]:
    """A run with controls (by position) split into the queue's records (moved copies
    included), what to cache (the partition's records in offset order, scheduled ones in
    their places: the move reads them back; not cancellations) and the controls to apply;
    records below the queue's deletion `floor` are neither cached nor applied."""
    run: list[Record] = []
    cached: list[Record] = []
    effects: list[tuple[Record, Control]] = []
    if records[0].offset >= floor:  # the usual case: slices, not a walk of every record
        at = cut = 0
        for i, ctl in controls.items():
            effects.append((records[i], ctl))
            if ctl[0] == "from":
                continue
            run += records[at:i]
            at = i + 1
            if ctl[0] == "cancel":
                cached += records[cut:i]
                cut = i + 1
        run += records[at:]
        cached += records[cut:]
        return run, cached, effects
    for i, rec in enumerate(records):
        found = controls.get(i)
        if found is None or found[0] == "from":
            run.append(rec)
            if rec.offset >= floor:
                cached.append(rec)
            if found is not None:
                effects.append((rec, found))  # a moved copy ends its original all the same
        elif rec.offset >= floor:
            effects.append((rec, found))
            if found[0] == "at":
                cached.append(rec)
    return run, cached, effects
