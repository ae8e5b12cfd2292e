"""The done records of a lease consumer's window above its low-water mark, as ranges (ADR 8)."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator


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

    def add_many(self, offsets: list[int], queue_offsets: array[int]) -> None:
        """Mark ascending `offsets` done: each run of adjacent records of the queue as one
        range (a lease's records, completed together, are usually one run)."""
        n = len(queue_offsets)
        i = 0
        while i < len(offsets):
            first = offsets[i]
            pos = bisect_left(queue_offsets, first)
            if pos >= n or queue_offsets[pos] != first or first in self:
                self.add(first, queue_offsets)
                i += 1
                continue
            j = i + 1
            while (j < len(offsets) and pos + j - i < n
                   and queue_offsets[pos + j - i] == offsets[j] and offsets[j] not in self):
                j += 1
            if j == i + 1:
                self.add(first, queue_offsets)
            else:
                self._add_run(first, offsets[j - 1], pos, pos + j - i - 1, queue_offsets)
            i = j

    def _add_run(self, first: int, last: int, pos_first: int, pos_last: int,
                 queue_offsets: array[int]) -> None:
        """Records `first`..`last` (adjacent in the queue, none done yet) are done."""
        i = bisect_right(self.starts, first)
        if i < len(self.starts) and self.starts[i] <= last:  # overlaps a range: one by one
            for k in range(pos_first, pos_last + 1):
                self.add(queue_offsets[k], queue_offsets)
            return
        starts, ends = self.starts, self.ends
        merge_left = i > 0 and pos_first > 0 and ends[i - 1] == queue_offsets[pos_first - 1] + 1
        merge_right = (i < len(starts) and pos_last + 1 < len(queue_offsets)
                       and starts[i] == queue_offsets[pos_last + 1])
        if merge_left and merge_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif merge_left:
            ends[i - 1] = last + 1
        elif merge_right:
            starts[i] = first
        else:
            starts.insert(i, first)
            ends.insert(i, last + 1)

    def drop_below(self, offset: int) -> None:
        """Forget everything below `offset` (the low-water mark moved there)."""
        i = bisect_right(self.starts, offset)
        if i and self.ends[i - 1] > offset:
            self.starts[i - 1] = offset
            i -= 1
        del self.starts[:i], self.ends[:i]

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def end_of_run(self, offset: int) -> int:
        """The end of the done range holding `offset`, or `offset` if it is not done."""
        i = bisect_right(self.starts, offset) - 1
        return self.ends[i] if i >= 0 and offset < self.ends[i] else offset

    def count(self, queue_offsets: array[int]) -> int:
        """How many of the queue's records are done."""
        return sum(bisect_left(queue_offsets, e) - bisect_left(queue_offsets, s)
                   for s, e in self.ranges())
