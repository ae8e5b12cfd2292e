"""A partition's queue index: every queue's retained offsets, deletion floor and consumers'
committed offsets (`queues`), the listed queues' names in order (`names`), and the log start.

A queue is listed while it holds a record or a consumer. An entry without either stays only
while its deletion floor lies above the log start (it still hides older records). The snapshot
carries this index column by column (`snapshot.py`); the other parts of a partition's state
(tags, schedule, idempotency window, lease windows) keep their own sections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from sortedcontainers import SortedList

from vqueues.records import Record
from vqueues.state import committed_offsets
from vqueues.state.committed_offsets import QueueStats
from vqueues.state.queue_index import NO_CONSUMERS, QueueIndex, StatefulQueueIndex
from vqueues.state.queue_map import QueueMap


class PartitionIndex:
    """The queue map, the sorted listed names and the log start of one partition."""

    __slots__ = ("log_start", "names", "queues")

    def __init__(self, queues: QueueMap | None = None, names: SortedList | None = None,
                 log_start: int = 0) -> None:
        self.queues = queues if queues is not None else QueueMap()
        self.names = names if names is not None else SortedList()
        self.log_start = log_start  # the data partition's first retained offset, as last learnt

    def queue(self, name: str) -> QueueIndex:
        """`name`'s entry, made empty if it has none."""
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueIndex()
        return q

    def append(self, queue: str, records: Sequence[Record]) -> Sequence[Record]:
        """Add one queue's `records` (ascending, above its last) and list it; the records kept:
        those below its deletion floor are dropped."""
        q = self.queues.get(queue)
        if q is None:
            q = self.queues[queue] = QueueIndex()
        elif records[0].offset < q.deleted_before:
            floor = q.deleted_before
            records = [rec for rec in records if rec.offset >= floor]
            if not records:
                return records
        if not q.offsets and not q.consumers:
            self.names.add(queue)
        if len(records) == 1:
            q.offsets.append(records[0].offset)
        else:
            q.offsets.extend([rec.offset for rec in records])
        return records

    # Committed offsets -----------------------------------------------------------------------

    def commit(self, queue: str, consumer: str, offset: int, acked_at_ms: int) -> None:
        q = self.queue(queue)
        if not q.listed:
            self.names.add(queue)
        committed_offsets.commit(self.queues, queue, q, consumer, offset, acked_at_ms)

    def delete_consumer(self, queue: str, consumer: str) -> None:
        known = self.queues.get(queue)
        if known is not None and known.consumers.pop(consumer, None) is not None:
            self.forget_if_empty(queue, known)

    def committed(self, queue: str, consumer: str) -> int | None:
        return committed_offsets.committed(self.queues.get(queue), consumer)

    def consumers_in_shard(self, shard: int, above: int, acked_before_ms: int | None
                           ) -> committed_offsets.ConsumerWalk:
        """One shard's consumers (`committed_offsets.walk`): a maintenance pass's step."""
        return committed_offsets.walk(self.queues.shard_items(shard), above, acked_before_ms)

    # Reads -----------------------------------------------------------------------------------

    def select(self, queue: str, start: int, limit: int, near: int | None = None) -> list[int]:
        """Offsets of up to `limit` records of `queue` at or after `start` (`near`: see
        `QueueIndex.position`)."""
        q = self.queues.get(queue)
        if q is None:
            return []
        i = q.position(max(start, q.deleted_before), near)
        return q.offsets[i : i + limit].tolist()

    def end_of(self, queue: str, start: int) -> int:
        """The offset after the queue's last record (at least `start`)."""
        q = self.queues.get(queue)
        return max(start, q.offsets[-1] + 1) if q is not None and q.offsets else start

    def first_offset(self, queue: str) -> int:
        """Where a consumer with no committed offset starts: the first retained record."""
        q = self.queues.get(queue)
        if q is None:
            return 0
        return q.offsets[0] if q.offsets else max(q.deleted_before, 0)

    def stats(self, queue: str) -> QueueStats | None:
        q = self.queues.get(queue)
        if q is None or not q.listed:
            return None
        return committed_offsets.stats(queue, q)

    def queue_names(self, start: str = "", after: str | None = None) -> Iterator[str]:
        """Listed queue names in order, from `start` (inclusive) or after `after`."""
        names: Iterator[str]
        if after is not None and after >= start:
            names = self.names.irange(minimum=after, inclusive=(False, True))
        else:
            names = self.names.irange(minimum=start)
        return names

    # Deletion floors and retention -----------------------------------------------------------

    def delete(self, queue: str, deleted_before: int) -> int:
        """Delete the queue's records below `deleted_before` and its consumers; its deletion
        floor (the highest ever given) is returned."""
        q = self.queue(queue)
        if deleted_before > q.deleted_before:
            q = self.queues.stateful(queue, q)
            q.deleted_before = deleted_before
        q.trim_before(q.deleted_before)
        if isinstance(q, StatefulQueueIndex):
            q.consumers = NO_CONSUMERS
        self.forget_if_empty(queue, q)
        return q.deleted_before

    def forget_if_empty(self, queue: str, q: QueueIndex) -> None:
        """Unlist a queue with no record and no consumer; drop its entry unless a deletion
        floor above the log start still has to hide older records."""
        if q.listed:
            return
        self.names.discard(queue)
        if q.deleted_before <= self.log_start:
            self.queues.pop(queue, None)

    def trim(self, log_start: int, names: Iterable[str],
             trimmed: Callable[[str, int], None]) -> int:
        """Retention: drop the offsets below `log_start` of the queues `names` (a chunk of
        them, so a caller can spread a million queues over many loop passes), telling
        `trimmed` of each queue trimmed; a queue left with no record and no consumer leaves the
        index. Returns how many queues were dropped."""
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
            trimmed(name, log_start)
            if not q.listed:
                self.forget_if_empty(name, q)
                dropped += name not in self.queues
        return dropped
