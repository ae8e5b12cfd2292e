"""Reading records of every layout a partition's index refers to (ADR 19).

A partition of layout n holds, besides its own records, the records its queues had in earlier
layouts (adopted from its parent's final snapshot), named by offsets tagged with their layout.
Each is read from its own layout's data topic, in the partition the queue had there.
"""

from __future__ import annotations

from collections.abc import Sequence

from vqueues.layouts import Layout, layout_of, tag
from vqueues.records import Record
from vqueues.storage import RecordFetcher


class LayeredFetcher:
    """A `RecordFetcher` over the current layout's data topic and the older layouts'."""

    def __init__(self, fetchers: dict[int, tuple[Layout, RecordFetcher]], current: int) -> None:
        self._fetchers = fetchers
        self._current = current
        self._base = tag(current, 0)

    def _of(self, layout: int, partition: int) -> tuple[RecordFetcher, int]:
        found = self._fetchers.get(layout)
        if found is None:
            raise KeyError(f"no data topic known for layout {layout}")
        held, fetcher = found
        return fetcher, partition % held.partitions

    def fetch(self, partition: int, offsets: Sequence[int]) -> dict[int, Record]:
        if offsets and layout_of(offsets[0]) == layout_of(offsets[-1]):
            fetcher, p = self._of(layout_of(offsets[0]), partition)
            return fetcher.fetch(p, offsets)
        found: dict[int, Record] = {}
        start = 0
        while start < len(offsets):  # ascending: each layout's offsets are one run
            layout = layout_of(offsets[start])
            end = start
            while end < len(offsets) and layout_of(offsets[end]) == layout:
                end += 1
            fetcher, p = self._of(layout, partition)
            found.update(fetcher.fetch(p, offsets[start:end]))
            start = end
        return found

    def home(self, partition: int, offset: int) -> int:
        """The partition, in its own layout, of the record at `offset` of `partition`."""
        if offset >= self._base:
            return partition
        held = self._fetchers.get(layout_of(offset))
        return partition % held[0].partitions if held is not None else partition

    def high_watermark(self, partition: int) -> int:
        fetcher, p = self._of(self._current, partition)
        return fetcher.high_watermark(p)

    def log_start(self, partition: int) -> int:
        """The first retained record across the layouts, oldest first: an older layout's
        partition counts while it holds anything (retention of the newer layout waits)."""
        for layout in sorted(self._fetchers):
            if layout >= self._current:
                break
            fetcher, p = self._of(layout, partition)
            low = fetcher.log_start(p)
            if low < fetcher.high_watermark(p):
                return low
        fetcher, p = self._of(self._current, partition)
        return fetcher.log_start(p)
