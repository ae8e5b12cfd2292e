"""The recent-record cache: the newest records of the owned partitions, bounded in bytes.

Kafka records never change once written, so a cached (partition, offset) stays right as long as
the topic exists; entries of a partition given up simply age out.

No entry of the cache is tracked by CPython's cyclic garbage collector, so a full collection
never walks its dicts: the entries are the Records themselves (msgspec Structs made
untracked), keyed by one int (`offset << 32 | partition`: Kafka's partition ids are int32). A
dict holding only untracked keys and values stays untracked. With (partition, offset) tuples as
keys every insert tracked its dict again, and each full collection under load walked the whole
cache: 110-190 ms at 750,000 records (measured; issue 8 had measured 418 ms pauses with tracked
entries). What a full collection still walks is the order deque: 8-11 ms at 750,000 records.
Keeping the order in untracked arrays instead took that to 0.02 ms but cost 1.1-1.5 us more per
record cached (an int and a tuple made per eviction; measured), more than it saves.
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
from collections.abc import Sequence

from vqueues.records import Record

# Measured per entry (tracemalloc, CPython 3.11): the Record, its two ints, the key int, the
# shard's slot, the deque's slot, and the value's bytes object header.
ENTRY_OVERHEAD_BYTES = 232  # 260 with a key tuple and an entry tuple
_PARTITION_BITS = 32
_PARTITION_MASK = (1 << _PARTITION_BITS) - 1
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
        self._shards: list[dict[int, Record]] = [{} for _ in range(SHARDS)]
        self._order: deque[int] = deque()

    def put(self, partition: int, record: Record) -> None:
        """Cache `record`, evicting the oldest entries over the budget. The same record again
        keeps its place in the order."""
        self.put_run(partition, (record,))

    def put_run(self, partition: int, records: Sequence[Record]) -> None:
        """`put` each of `records` (in offset order), evicting once at the end. For records
        new to the cache (an own write's, at the frontier) the same entries stay as with `put`
        one by one: the oldest go first either way."""
        shards, order, max_bytes = self._shards, self._order, self.max_bytes
        added = 0
        for record in records:
            value, headers = record.value, record.headers
            size = (entry_size(value, headers) if headers
                    else ENTRY_OVERHEAD_BYTES + (len(value) if value else 0))
            if size > max_bytes:
                continue
            offset = record.offset
            key = offset << _PARTITION_BITS | partition
            shard = shards[hash((partition, offset)) & (SHARDS - 1)]
            old = shard.get(key)
            if old is None:
                order.append(key)
            else:
                added -= entry_size(old.value, old.headers)
            shard[key] = record
            added += size
        self.bytes += added
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes:
            oldest = self._order.popleft()
            gone = self._shards[hash((oldest & _PARTITION_MASK, oldest >> _PARTITION_BITS))
                                & (SHARDS - 1)].pop(oldest)
            self.bytes -= entry_size(gone.value, gone.headers)

    def get(self, partition: int, offset: int) -> Record | None:
        return self._shards[hash((partition, offset)) & (SHARDS - 1)].get(
            offset << _PARTITION_BITS | partition)

    def entries(self) -> list[Record]:
        """Every cached record (for tests and diagnostics: a copy)."""
        return [r for shard in self._shards for r in shard.values()]

    def clear(self) -> None:
        for shard in self._shards:
            shard.clear()
        self._order.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._order)
