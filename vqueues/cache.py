"""The recent-record cache: the newest records of the owned partitions, bounded in bytes.

Kafka records never change once written, so a cached (partition, offset) stays right as long as
the topic exists; entries of a partition given up simply age out.

Entries are plain tuples of ints, bytes and str, which CPython's cyclic garbage collector stops
tracking after their first collection: a full collection then skips a cache of millions of
records instead of scanning every one (issue 8 measured 418 ms pauses with tracked objects).
`size` is calibrated with tracemalloc against what an entry really holds (tested within 20%).

The entries live in SHARDS small dicts, and their insertion order in a deque: one ordered dict
of half a million entries stalled the loop for 190 ms whenever it resized (measured during a
replay: FIFO deletions leave its table full of dummies, and each rebuild copies it whole). A
shard's rebuild copies a 256th of that; a deque never rebuilds. A record's shard is its key's
hash, not its offset's low bits: consecutive offsets filled the shards so evenly that all of
them resized within the same 64 records, one 20 MB rebuild again, whose fresh pages the
kernel took 60 ms to hand out (measured in a replay of 1M queues; 80 ms loop stalls).
"""

from __future__ import annotations

from collections import deque

from vqueues.records import Record

# (offset, timestamp, value, headers): a Record's fields, untracked by the collector.
_Entry = tuple[int, int, bytes | None, tuple[tuple[str, bytes | None], ...]]

# Measured per entry (tracemalloc, CPython 3.11): the entry tuple, its two ints, the key tuple
# and its ints, the shard's slot, the deque's slot, and the value's bytes object header.
ENTRY_OVERHEAD_BYTES = 260
SHARDS = 256  # a power of two: an entry's shard is its key's hash's low bits
HEADERS_OVERHEAD_BYTES = 40  # the headers tuple, when there are headers
HEADER_OVERHEAD_BYTES = 142  # per header: its pair tuple, str and bytes objects


def entry_size(value: bytes | None, headers: tuple[tuple[str, bytes | None], ...]) -> int:
    """The memory a cached record takes, value and headers included."""
    n = ENTRY_OVERHEAD_BYTES + (len(value) if value else 0)
    if headers:
        n += HEADERS_OVERHEAD_BYTES
        for k, v in headers:
            n += HEADER_OVERHEAD_BYTES + len(k) + (len(v) if v else 0)
    return n


class RecordCache:
    """FIFO by insertion: records arrive in offset order, so the oldest go first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # The most records it could ever hold (each takes at least ENTRY_OVERHEAD_BYTES).
        self.capacity = max_bytes // ENTRY_OVERHEAD_BYTES
        self.bytes = 0
        self._shards: list[dict[tuple[int, int], _Entry]] = [{} for _ in range(SHARDS)]
        self._order: deque[tuple[int, int]] = deque()

    def put(self, partition: int, record: Record) -> None:
        size = entry_size(record.value, record.headers)
        if size > self.max_bytes:
            return
        key = (partition, record.offset)
        shard = self._shards[hash(key) & (SHARDS - 1)]
        old = shard.get(key)
        if old is None:
            self._order.append(key)
        else:  # the same record again: it keeps its place in the order
            self.bytes -= entry_size(old[2], old[3])
        shard[key] = (record.offset, record.timestamp, record.value, record.headers)
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest = self._order.popleft()
            _, _, value, headers = self._shards[hash(oldest) & (SHARDS - 1)].pop(oldest)
            self.bytes -= entry_size(value, headers)

    def get(self, partition: int, offset: int) -> Record | None:
        key = (partition, offset)
        entry = self._shards[hash(key) & (SHARDS - 1)].get(key)
        return None if entry is None else Record(*entry)

    def entries(self) -> list[_Entry]:
        """Every cached entry (for tests and diagnostics: a copy)."""
        return [e for shard in self._shards for e in shard.values()]

    def clear(self) -> None:
        for shard in self._shards:
            shard.clear()
        self._order.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._order)
