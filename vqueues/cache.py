"""The recent-record cache: the newest records of the owned partitions, bounded in bytes.

Kafka records never change once written, so a cached (partition, offset) stays right as long as
the topic exists; entries of a partition given up simply age out.
"""

from __future__ import annotations

from collections import OrderedDict

from vqueues.records import Record


class RecordCache:
    """FIFO by insertion: records arrive in offset order, so the oldest go first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[int, int], Record] = OrderedDict()

    def put(self, partition: int, record: Record) -> None:
        size = record.size
        if size > self.max_bytes:
            return
        key = (partition, record.offset)
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        self._items[key] = record
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= evicted.size

    def get(self, partition: int, offset: int) -> Record | None:
        return self._items.get((partition, offset))

    def __len__(self) -> int:
        return len(self._items)
