"""A partition's consumer settings and lease windows: `ConsumerConfig` and `WorkState` by
(queue, consumer), as the offset topic's entries make them (ADR 8). The rules that decide the
entries are the work service's; this is what replay and the owner's own writes apply, and what
a snapshot carries."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from vqueues.leases import LEASE, ConsumerConfig, Delivery, WorkState
from vqueues.records import ConsumerConfigured, DeliveryCleared, DeliveryUpdated

# A snapshot's rows: (queue, consumer, mode, max_attempts, dead_letter_queue, visibility_ms)
ConfigRow = tuple[str, str, str, int, str | None, int]
# (queue, consumer, frontier, dead_lettered, done starts, done ends,
#  [(offset, attempts, until, leased, order_key, reason)])
WorkRow = tuple[str, str, int, int, list[int], list[int],
                list[tuple[int, int, int, bool, str | None, str | None]]]


class LeaseWindows:
    """Consumers with settings (`configs`) and the lease consumers' windows (`work`)."""

    __slots__ = ("configs", "work")

    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], ConsumerConfig] = {}
        self.work: dict[tuple[str, str], WorkState] = {}

    # Replay: one method per offset-topic entry that touches them ------------------------------

    def acked(self, queue: str, consumer: str, offset: int, dead_lettered: int) -> None:
        """The consumer's committed offset moved: for a lease consumer, its low-water mark."""
        work = self.work.get((queue, consumer))
        if work is not None:
            work.frontier = max(work.frontier, offset)
            work.settle_below(offset)
            work.dead_lettered = dead_lettered

    def forget(self, queue: str, consumer: str) -> None:
        """The consumer was deleted, or its settings cleared."""
        self.configs.pop((queue, consumer), None)
        self.work.pop((queue, consumer), None)

    def configured(self, e: ConsumerConfigured, committed: int | None) -> None:
        """New settings; a consumer that becomes a lease consumer starts its window at its
        committed offset, one that becomes a cursor loses its window."""
        key = (e.queue, e.consumer)
        self.configs[key] = ConsumerConfig(e.mode, e.max_attempts, e.dead_letter_queue,
                                           e.visibility_ms)
        if e.mode == LEASE:
            if key not in self.work:
                self.work[key] = WorkState(committed or 0)
        else:
            self.work.pop(key, None)

    def delivery_updated(self, e: DeliveryUpdated, committed: int,
                         offsets_of: Callable[[str], array[int]]) -> None:
        """A record of a window was leased, retried, extended or completed. `offsets_of`
        gives the queue's offsets (asked only for a completion)."""
        key = (e.queue, e.consumer)
        work = self.work.get(key)
        if work is None:
            work = self.work[key] = WorkState(0)
        if e.offset < committed:
            return  # settled already (its tombstone may not have been written)
        work.frontier = max(work.frontier, e.offset + 1)
        if e.done:
            work.deliveries.pop(e.offset, None)
            work.done.add(e.offset, offsets_of(e.queue))
        else:
            work.deliveries[e.offset] = Delivery(e.attempts, e.until_ms, e.leased,
                                                 e.order_key, e.reason)

    def delivery_cleared(self, e: DeliveryCleared) -> None:
        work = self.work.get((e.queue, e.consumer))
        if work is not None:
            work.deliveries.pop(e.offset, None)

    def drop_queue(self, queue: str) -> None:
        """The queue was deleted: its consumers' settings and windows go with it."""
        for key in [k for k in self.configs if k[0] == queue]:
            del self.configs[key]
        for key in [k for k in self.work if k[0] == queue]:
            del self.work[key]

    # Queries ---------------------------------------------------------------------------------

    def tombstones(self, queue: str, consumer: str, queue_offsets: array[int] | None,
                   committed: int) -> list[DeliveryCleared]:
        """Tombstones for every delivery-state key the lease consumer may have written."""
        work = self.work.get((queue, consumer))
        if work is None:
            return []
        window = work.window(queue_offsets, committed) if queue_offsets is not None else ()
        offsets = set(work.deliveries) | set(window)
        return [DeliveryCleared(queue, consumer, o) for o in sorted(offsets)]

    # The snapshot's section ----------------------------------------------------------------

    def capture(self) -> tuple[list[ConfigRow], list[WorkRow]]:
        """Every consumer's settings and every window, as rows (small: bounded per consumer)."""
        configs = [(q, c, k.mode, k.max_attempts, k.dead_letter_queue, k.visibility_ms)
                   for (q, c), k in self.configs.items()]
        work = [(q, c, w.frontier, w.dead_lettered, list(w.done.starts), list(w.done.ends),
                 [(o, d.attempts, d.until, d.leased, d.order_key, d.reason)
                  for o, d in w.deliveries.items()])
                for (q, c), w in self.work.items()]
        return configs, work

    def restore(self, configs: Sequence[ConfigRow], work: Sequence[WorkRow]) -> None:
        """Replace everything with what `capture` described."""
        self.configs = {(q, c): ConsumerConfig(mode, attempts, dlq, visibility)
                        for q, c, mode, attempts, dlq, visibility in configs}
        self.work = {}
        for q, c, frontier, dead, starts, ends, deliveries in work:
            w = self.work[(q, c)] = WorkState(frontier)
            w.dead_lettered = dead
            w.done.starts, w.done.ends = list(starts), list(ends)
            w.deliveries = {o: Delivery(a, u, leased, k, why)
                            for o, a, u, leased, k, why in deliveries}
