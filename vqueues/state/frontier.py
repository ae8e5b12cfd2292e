"""The frontier of a partition's index: the order in which records are indexed.

Two paths index records, and both do it at the **frontier** (`next_offset`), in offset order,
so every queue's offsets stay sorted and no record is indexed twice:
- the tail (`tail`) delivers every record of the partition in order; `tail_offset` is the next
  offset it will deliver;
- the node's own writes (`own`) are indexed as soon as the broker acknowledged them, if every
  offset below them is known; otherwise they wait (in `waiting`) until the tail fills the gap
  (another producer's record, or one not yet fetched), and a tail that gets there first indexes
  them itself. Own writes indexed ahead of the tail are remembered (`own_indexed`) so the tail
  skips them when it confirms them.

What indexing a record means is the partition state's (`index_one`, `index_many`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from vqueues.records import Record

IndexOne = Callable[[str, Record, set[str]], None]
IndexMany = Callable[[str, Sequence[Record], set[str]], None]


class Frontier:
    """Where indexing stands, and the own writes ahead of or behind the tail."""

    __slots__ = ("_index_many", "_index_one", "next_offset", "own_indexed",
                 "own_order", "tail_offset", "waiting")

    def __init__(self, index_one: IndexOne, index_many: IndexMany) -> None:
        self._index_one = index_one  # index one record (its headers too), waking into a set
        self._index_many = index_many  # index one queue's run of consecutive records
        self.next_offset = 0  # every offset below it is indexed or not a record
        self.tail_offset = 0  # the next data offset the tail will deliver
        self.waiting: dict[int, tuple[str, Record]] = {}  # own writes waiting for the frontier
        self.own_indexed: set[int] = set()  # own writes indexed ahead of the tail
        # The same offsets in the order they were indexed (ascending: at the frontier), so the
        # tail passing them drops them from the left; the set stays the same object, which the
        # group thread holds.
        self.own_order: deque[int] = deque()

    def start_at(self, offset: int) -> None:
        """Everything below `offset` is indexed already (a snapshot's position)."""
        self.next_offset = self.tail_offset = offset

    def tail(self, records: Iterable[tuple[str, Record]], woken: set[str]) -> None:
        """Index records the tail consumed from the data partition (in offset order)."""
        tail = self.tail_offset
        own, own_indexed = self.waiting, self.own_indexed
        index_many = self._index_many
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
                # come as one).
                if run and queue == run_queue:
                    run.append(rec)
                else:
                    if run:
                        index_many(run_queue, run, woken)
                    run, run_queue = [rec], queue
        if run:
            index_many(run_queue, run, woken)
        self.tail_offset = tail
        self._forget_own_below(tail)
        self._drain_own(woken)

    def own(self, queue: str, records: Sequence[Record], woken: set[str]) -> None:
        """Index records this node wrote, from their delivery reports (offset order): each at
        once if the frontier is there, else once it gets there."""
        for rec in records:
            if rec.offset >= self.next_offset:
                self.waiting[rec.offset] = (queue, rec)
        self._drain_own(woken)

    def at_run(self, records: Sequence[Record]) -> bool:
        """Whether `records` are the common own write that can be indexed as one run: at the
        frontier, consecutive, with no other own write waiting."""
        n = len(records)
        if n < 2 or self.waiting:
            return False
        first = records[0].offset
        return first == self.next_offset and records[-1].offset == first + n - 1

    def ran(self, first: int, last: int) -> None:
        """Own writes `first`..`last` (an `at_run` run) were indexed."""
        run = range(first, last + 1)
        self.own_indexed.update(run)
        self.own_order.extend(run)
        self.next_offset = last + 1

    def skip_to(self, next_offset: int, woken: set[str]) -> bool:
        """The tail passed `next_offset`: records it did not deliver below that are not queue
        records (no key, misrouted) or own writes indexed already. False if it was there."""
        if next_offset <= self.tail_offset:
            return False
        self.tail_offset = next_offset
        self._forget_own_below(next_offset)
        if next_offset > self.next_offset:
            self.next_offset = next_offset
            self._drain_own(woken)
        return True

    def _drain_own(self, woken: set[str]) -> None:
        """Index the own writes the frontier has reached."""
        own = self.waiting
        while self.next_offset in own:
            offset = self.next_offset
            queue, rec = own.pop(offset)
            self._index_one(queue, rec, woken)
            self.own_indexed.add(offset)
            self.own_order.append(offset)
            self.next_offset = offset + 1

    def _forget_own_below(self, tail: int) -> None:
        """The tail passed `tail`: own writes below it, delivered or skipped by the group
        thread, need no confirming any more."""
        order, own_indexed = self.own_order, self.own_indexed
        while order and order[0] < tail:
            own_indexed.discard(order.popleft())
