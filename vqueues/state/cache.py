"""The recent-record cache: the newest records of the owned partitions, bounded in bytes.

Kafka records never change once written, so a cached (partition, offset) stays right as long as
the topic exists; entries of a partition given up simply age out.

Records reach the cache in offset order per partition (both indexing paths index at the
frontier, see `PartitionState`), so each partition's records are kept in a **ring**: blocks of
BLOCK records in offset order, the oldest cleared from the head of the first block, which is
dropped once all of it is. A record is found by its offset's distance from the ring's first
(exact unless offsets were skipped: records not cached, such as control records, a deleted
queue's or those over the budget) and by bisection otherwise. The order of eviction across
partitions is a deque of runs (partition, how many): one per batch, not one per record. Rings
rather than dicts keyed by offset: no hashing, no key ints, no dict slots, so a put and a get
cost less and an entry takes fewer bytes (ADR 15).

No entry of the cache is tracked by CPython's cyclic garbage collector: the entries are the
Records themselves (msgspec Structs made untracked), so a full collection under load does not
walk the whole cache; it still visits the blocks' slots (lists are always tracked). No list
the cache holds grows past a block, and it holds no large dict: growing or dropping either
stalls the loop.
`size` is calibrated with tracemalloc against what an entry really holds (tested within 20%).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from operator import attrgetter

from vqueues.records import Record

# Measured per entry (tracemalloc, CPython 3.11): the Record, its two ints, the ring's slot and
# the value's bytes object header.
ENTRY_OVERHEAD_BYTES = 156
HEADERS_OVERHEAD_BYTES = 40  # the headers tuple, when there are headers
HEADER_OVERHEAD_BYTES = 142  # per header: its pair tuple, str and bytes objects
# A ring's blocks hold this many records: no append reallocates more than a block (32 KiB).
BLOCK_BITS = 12
BLOCK = 1 << BLOCK_BITS

_offset_of = attrgetter("offset")


def entry_size(value: bytes | None, headers: tuple[tuple[str, bytes | None], ...]) -> int:
    """The memory a cached record takes, value and headers included."""
    n = ENTRY_OVERHEAD_BYTES + (len(value) if value else 0)
    if headers:
        n += HEADERS_OVERHEAD_BYTES
        for k, v in headers:
            n += HEADER_OVERHEAD_BYTES + len(k) + (len(v) if v else 0)
    return n


class _Ring:
    """One partition's cached records in offset order, in blocks of up to BLOCK; `firsts` holds
    each block's first offset, and the first `head` slots of the first block are evicted."""

    __slots__ = ("blocks", "firsts", "head")

    def __init__(self) -> None:
        self.blocks: list[list[Record | None]] = []
        self.firsts: list[int] = []
        self.head = 0

    def get(self, offset: int) -> Record | None:
        """The record at `offset`, if the ring holds it."""
        firsts = self.firsts
        if not firsts or offset < firsts[0]:
            return None
        # Offsets ascend strictly and every block but the last is full, so a record is no
        # further into the ring than its offset is from the first: exactly there unless
        # offsets were skipped before it (then bisect).
        b = (offset - firsts[0]) >> BLOCK_BITS
        if b >= len(firsts):
            b = len(firsts) - 1
        if firsts[b] > offset:
            b = bisect_right(firsts, offset, 0, b) - 1
        block = self.blocks[b]
        i = offset - firsts[b]
        if i >= len(block):
            i = len(block) - 1
        lo = self.head if b == 0 else 0
        if i < lo:
            return None
        rec = block[i]
        if rec.offset != offset:  # type: ignore[union-attr]  # past head: a Record
            i = bisect_left(block, offset, lo, i, key=_offset_of)
            rec = block[i]
            if rec.offset != offset:  # type: ignore[union-attr]
                return None
        return rec

    def replace(self, record: Record) -> Record | None:
        """Put `record` where the ring holds its offset; the record it replaced, or None if the
        ring does not hold that offset (nothing changes then). Not the hot path: only a
        partition taken again replays records the ring may hold."""
        offset = record.offset
        b = bisect_right(self.firsts, offset) - 1
        if b < 0:
            return None
        block = self.blocks[b]
        i = bisect_left(block, offset, self.head if b == 0 else 0, key=_offset_of)
        if i == len(block) or block[i].offset != offset:  # type: ignore[union-attr]
            return None
        old, block[i] = block[i], record
        return old


class RecordCache:
    """FIFO by insertion: records arrive in offset order, so the oldest go first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # The most records it could ever hold (each takes at least ENTRY_OVERHEAD_BYTES).
        self.capacity = max_bytes // ENTRY_OVERHEAD_BYTES
        self.bytes = 0
        self._count = 0
        self._rings: dict[int, _Ring] = {}
        # The insertion order as runs: [partition, entries], oldest first.
        self._order: deque[list[int]] = deque()

    def put(self, partition: int, record: Record) -> None:
        """Cache `record`, evicting the oldest entries over the budget. The same record again
        keeps its place in the order; a record older than the partition's newest cached one
        that the cache does not hold (already evicted) is not cached again."""
        self.put_run(partition, (record,))

    def put_run(self, partition: int, records: Sequence[Record]) -> None:
        """`put` each of `records` (in offset order), evicting once at the end. For records
        new to the cache (an own write's, at the frontier) the same entries stay as with `put`
        one by one: the oldest go first either way."""
        ring = self._rings.get(partition)
        if ring is None:
            ring = self._rings[partition] = _Ring()
        blocks, max_bytes = ring.blocks, self.max_bytes
        block = blocks[-1] if blocks else None
        last = block[-1].offset if block else -1  # type: ignore[union-attr]  # the newest
        added = appended = 0
        for record in records:
            value, headers = record.value, record.headers
            size = (entry_size(value, headers) if headers
                    else ENTRY_OVERHEAD_BYTES + (len(value) if value else 0))
            if size > max_bytes:
                continue
            offset = record.offset
            if offset > last:
                if block is not None and len(block) < BLOCK:
                    block.append(record)
                else:
                    block = [record]
                    blocks.append(block)
                    ring.firsts.append(offset)
                last = offset
                appended += 1
                added += size
                continue
            old = ring.replace(record)
            if old is not None:
                added += size - entry_size(old.value, old.headers)
        if appended:
            order = self._order
            if order and order[-1][0] == partition:
                order[-1][1] += appended
            else:
                order.append([partition, appended])
            self._count += appended
        self.bytes += added
        if self.bytes > max_bytes:
            self._evict()

    def _evict(self) -> None:
        order, rings = self._order, self._rings
        while self.bytes > self.max_bytes:
            run = order[0]
            ring = rings[run[0]]
            block, head = ring.blocks[0], ring.head
            gone = block[head]
            block[head] = None
            head += 1
            if head == len(block):  # all of the block is evicted: drop it
                if len(ring.blocks) == 1:
                    ring.blocks.clear()
                    ring.firsts.clear()
                else:
                    del ring.blocks[0], ring.firsts[0]
                head = 0
            ring.head = head
            run[1] -= 1
            if not run[1]:
                order.popleft()
            self._count -= 1
            self.bytes -= entry_size(gone.value, gone.headers)  # type: ignore[union-attr]

    def get(self, partition: int, offset: int) -> Record | None:
        """The cached record at (`partition`, `offset`), or None."""
        ring = self._rings.get(partition)
        if ring is None:
            return None
        return ring.get(offset)

    def entries(self) -> list[Record]:
        """Every cached record (for tests and diagnostics: a copy)."""
        return [r for ring in self._rings.values() for block in ring.blocks for r in block
                if r is not None]

    def clear(self) -> None:
        self._rings.clear()
        self._order.clear()
        self._count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self._count
