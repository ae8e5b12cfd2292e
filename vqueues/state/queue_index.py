"""One queue's entry in a partition's queue index: its retained record offsets, its consumers'
committed offsets and its deletion floor, in one object (ADR 7 measures what each costs)."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING, cast

# Shared by every queue without consumers (most of them): one dict, never written to; a queue
# gets its own on its first consumer. Saves 64 B per queue.
NO_CONSUMERS: dict[str, tuple[int, int]] = {}

if TYPE_CHECKING:
    _OffsetArray = array[int]
else:
    _OffsetArray = array  # not subscriptable at run time before Python 3.12


def seek(offsets: array[int], offset: int, hint: int) -> int:
    """`bisect_left(offsets, offset)`, looked for first near `hint` (where a nearby offset
    was a moment ago): a bisect over an array boxes every probe, 16 of them at 40,000
    records, where the window moves a few records between calls."""
    n = len(offsets)
    if hint > n:
        hint = n
    if hint and offsets[hint - 1] >= offset:
        return bisect_left(offsets, offset, 0, hint)
    hi = hint + SEEK_SPAN
    if hi < n:
        if offsets[hi] < offset:
            return bisect_left(offsets, offset, hi + 1, n)
        return bisect_left(offsets, offset, hint, hi)
    return bisect_left(offsets, offset, hint, n)


SEEK_SPAN = 256


class QueueIndex(_OffsetArray):
    """One queue in one partition: its retained record offsets (ascending; the object is that
    array, so a queue costs one object, not two) and its
    consumers (name -> (committed offset, last ack at, UTC epoch ms)).

    Most queues have no consumer and were never deleted: they are this bare array, with no
    slots (ADR 15 has the bytes per queue). `consumers` and
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

    def position(self, offset: int, near: int | None = None) -> int:
        """Index of the first record at or after `offset` (searched first `near` an index
        where a nearby offset was)."""
        if near is not None:
            return seek(self.offsets, offset, near)
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
