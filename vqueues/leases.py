"""A lease consumer's state on one queue: which records are leased, waiting for a retry, or done
above the low-water mark (docs/work-queues.md, ADR 8).

The **committed offset** of a lease consumer is its low-water mark: every record of the queue
below it is done. The **window** is the queue's records from there up to the **frontier** (the
first record never looked at). Inside the window a record is either done (kept as ranges, not one
object per record), or has a `Delivery` (its attempts, lease deadline or retry time, ordering
key), or is new (never delivered: skipped because its ordering key was busy). The window holds at
most the consumer's window limit of records; beyond it, leasing waits. Pure state: no I/O here.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

CURSOR = "cursor"
LEASE = "lease"
MODES = (CURSOR, LEASE)
ORDER_KEY_HEADER = "vq-ordering-key"
# The headers a dead-lettered record carries (beside its own).
DLQ_HEADERS = ("vq-dlq-source-queue", "vq-dlq-source-offset", "vq-dlq-consumer",
               "vq-dlq-attempts", "vq-dlq-reason")


@dataclass(slots=True, frozen=True)
class ConsumerConfig:
    """A consumer's settings (PUT /v1/queues/{queue}/consumers/{consumer})."""

    mode: str
    max_attempts: int
    dead_letter_queue: str | None
    visibility_ms: int


class Delivery:
    """One record of the window that is not done and was looked at."""

    __slots__ = ("attempts", "leased", "order_key", "reason", "until")

    def __init__(self, attempts: int, until: int, leased: bool, order_key: str | None,
                 reason: str | None = None) -> None:
        self.attempts = attempts  # deliveries so far (0: never delivered)
        self.until = until  # leased: the deadline; waiting: not available before (UTC ms)
        self.leased = leased
        self.order_key = order_key
        self.reason = reason

    def available(self, now: int) -> bool:
        return self.until <= now

    def in_flight(self, now: int) -> bool:
        return self.leased and self.until > now


class DoneRanges:
    """Done offsets above the low-water mark as [start, end) ranges of partition offsets. Two
    ranges merge when no record of the queue lies between them, so a run of completions costs
    one range whatever other queues wrote in between."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.ends[i]

    def add(self, offset: int, queue_offsets: array[int]) -> None:
        """Mark `offset` done; `queue_offsets` (the queue's records) tell what is adjacent."""
        if offset in self:
            return
        pos = bisect_left(queue_offsets, offset)
        i = bisect_right(self.starts, offset)  # ranges before i start at or below offset
        if pos >= len(queue_offsets) or queue_offsets[pos] != offset:  # not a record: alone
            self.starts.insert(i, offset)
            self.ends.insert(i, offset + 1)
            return
        prev_rec = queue_offsets[pos - 1] if pos > 0 else None
        next_rec = queue_offsets[pos + 1] if pos + 1 < len(queue_offsets) else None
        merge_left = i > 0 and prev_rec is not None and self.ends[i - 1] == prev_rec + 1
        merge_right = (i < len(self.starts) and next_rec is not None
                       and self.starts[i] == next_rec)
        if merge_left and merge_right:
            self.ends[i - 1] = self.ends[i]
            del self.starts[i], self.ends[i]
        elif merge_left:
            self.ends[i - 1] = offset + 1
        elif merge_right:
            self.starts[i] = offset
        else:
            self.starts.insert(i, offset)
            self.ends.insert(i, offset + 1)

    def drop_below(self, offset: int) -> None:
        """Forget everything below `offset` (the low-water mark moved there)."""
        i = bisect_right(self.starts, offset)
        if i and self.ends[i - 1] > offset:
            self.starts[i - 1] = offset
            i -= 1
        del self.starts[:i], self.ends[:i]

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def count(self, queue_offsets: array[int]) -> int:
        """How many of the queue's records are done."""
        return sum(bisect_left(queue_offsets, e) - bisect_left(queue_offsets, s)
                   for s, e in self.ranges())


class WorkState:
    """A lease consumer's window on one queue (its low-water mark lives with the queue's
    consumers, as any consumer's committed offset does)."""

    __slots__ = ("dead_lettered", "deliveries", "done", "frontier")

    def __init__(self, frontier: int) -> None:
        self.frontier = frontier
        self.deliveries: dict[int, Delivery] = {}
        self.done = DoneRanges()
        self.dead_lettered = 0

    def window(self, queue_offsets: array[int], committed: int) -> array[int]:
        """The queue's records in the window: from the low-water mark to the frontier."""
        return queue_offsets[bisect_left(queue_offsets, committed):
                             bisect_left(queue_offsets, self.frontier)]

    def low_water(self, queue_offsets: array[int], committed: int) -> int:
        """Where the low-water mark belongs: the first record of the window that is not done,
        or the frontier when all are."""
        for off in self.window(queue_offsets, committed):
            if off not in self.done:
                return off
        return max(committed, self.frontier)

    def settle_below(self, committed: int) -> list[int]:
        """The low-water mark moved to `committed`: drop what lies below it; return the offsets
        whose deliveries were dropped (their entries get tombstones)."""
        self.done.drop_below(committed)
        gone = [o for o in self.deliveries if o < committed]
        for o in gone:
            del self.deliveries[o]
        return gone

    def counts(self, queue_offsets: array[int], committed: int, now: int
               ) -> tuple[int, int, int]:
        """(in flight, delayed, available) records of the queue for this consumer."""
        in_flight = delayed = 0
        for off, d in self.deliveries.items():
            if off < committed:
                continue
            if d.in_flight(now):
                in_flight += 1
            elif not d.available(now):
                delayed += 1
        total = len(queue_offsets) - bisect_left(queue_offsets, committed)
        return in_flight, delayed, max(0, total - self.done.count(queue_offsets)
                                       - in_flight - delayed)

    def next_change(self, now: int) -> int | None:
        """The earliest time a lease expires or a retry falls due (UTC ms), if any."""
        times = [d.until for d in self.deliveries.values() if d.until > now]
        return min(times) if times else None


def token(offset: int, attempt: int) -> str:
    """A lease token: names the record and the delivery it was handed out with."""
    return f"{offset}.{attempt}"


def parse_token(text: object) -> tuple[int, int] | None:
    """(offset, attempt) of a token, or None if it is not one."""
    if not isinstance(text, str):
        return None
    head, sep, tail = text.partition(".")
    if not sep or not head.isdigit() or not tail.isdigit():
        return None
    return int(head), int(tail)
