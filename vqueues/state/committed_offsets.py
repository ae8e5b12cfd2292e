"""Consumers' committed offsets, held in their queue's index entry (`QueueIndex.consumers`:
consumer -> (committed offset, last ack at, UTC ms)), with the deletion floor applied: a
committed offset below the floor reads as the floor."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vqueues.state.queue_index import NO_CONSUMERS, QueueIndex
from vqueues.state.queue_map import QueueMap


@dataclass(slots=True)
class QueueStats:
    queue: str
    records: int
    first_offset: int | None
    last_offset: int | None
    consumers: dict[str, tuple[int, int]]  # name -> (offset, lag in records)


def committed(q: QueueIndex | None, consumer: str) -> int | None:
    """The consumer's committed offset, or None if `q` has no such consumer."""
    if q is None:
        return None
    entry = q.consumers.get(consumer)
    return None if entry is None else max(entry[0], q.deleted_before)


def commit(queues: QueueMap, queue: str, q: QueueIndex, consumer: str, offset: int,
           acked_at_ms: int) -> None:
    """Set the consumer's committed offset (`q` is `queue`'s entry in `queues`; it is replaced
    by a stateful one on its first consumer)."""
    if q.consumers is NO_CONSUMERS:
        q = queues.stateful(queue, q)
        q.consumers = {}
    q.consumers[consumer] = (offset, acked_at_ms)


def idle(q: QueueIndex | None, consumer: str, acked_before_ms: int) -> bool:
    """Whether the consumer exists and last acked before `acked_before_ms`."""
    entry = None if q is None else q.consumers.get(consumer)
    return entry is not None and entry[1] < acked_before_ms


@dataclass(slots=True)
class ConsumerWalk:
    """What one walk over queues' consumers found (`walk`)."""

    lags: list[tuple[int, str, str]]  # (lag in records, queue, consumer) over `above`
    idle: list[tuple[str, str]]  # (queue, consumer) last acked before `acked_before_ms`
    oldest_ack: int | None  # the earliest last ack (None: not asked, or no consumer)


def walk(queues: Iterable[tuple[str, QueueIndex]], above: int, acked_before_ms: int | None
         ) -> ConsumerWalk:
    """The consumers of `queues` (name, entry), in one walk: those more than `above` records
    behind, and with `acked_before_ms` those idle since before it and the earliest last ack.
    A top-N pass passes its Nth lag as `above`: most consumers then cost no tuple."""
    out = ConsumerWalk([], [], None)
    oldest = None
    for name, q in queues:
        consumers = q.consumers
        if not consumers:
            continue
        n = len(q.offsets)
        for c, (off, at) in consumers.items():
            if n > above:
                lag = n - q.position(max(off, q.deleted_before))
                if lag > above:
                    out.lags.append((lag, name, c))
            if acked_before_ms is not None:
                if at < acked_before_ms:
                    out.idle.append((name, c))
                if oldest is None or at < oldest:
                    oldest = at
    out.oldest_ack = oldest
    return out


def stats(queue: str, q: QueueIndex) -> QueueStats:
    """The queue's records, first and last offset, and each consumer's offset and lag."""
    n = len(q.offsets)
    consumers = {}
    for name, (off, _) in sorted(q.consumers.items()):
        off = max(off, q.deleted_before)
        consumers[name] = (off, n - q.position(off))
    return QueueStats(queue, n, q.offsets[0] if n else None, q.offsets[-1] if n else None,
                      consumers)
