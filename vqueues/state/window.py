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
from bisect import bisect_left, insort
from heapq import heapify, heappop, heappush

from vqueues.state.done_ranges import DoneRanges
from vqueues.state.queue_index import seek


class Delivery:
    """One record of the window that is not done and was looked at."""

    __slots__ = ("attempts", "first", "grant", "leased", "order_key", "reason", "until")

    def __init__(self, attempts: int, until: int, leased: bool, order_key: str | None,
                 reason: str | None = None, grant: int = 0) -> None:
        self.attempts = attempts  # deliveries so far (0: never delivered)
        self.until = until  # leased: the deadline; waiting: not available before (UTC ms)
        self.leased = leased
        self.order_key = order_key
        self.reason = reason
        self.grant = grant  # the lease call that made the last delivery (0: none, or ADR 8's)
        # When this owner first leased it (UTC ms; 0: not yet). In memory only: a replay or
        # a snapshot leaves it 0, so the next lease here sets it.
        self.first = 0

    def available(self, now: int) -> bool:
        return self.until <= now

    def in_flight(self, now: int) -> bool:
        return self.leased and self.until > now



class LeaseWindow:
    """A lease consumer's window on one queue (its low-water mark lives with the queue's
    consumers, as any consumer's committed offset does), and what its window writes left in
    the offset topic (ADR 12).

    Once `ensure_index` has run, the window is indexed for leasing: `ready` holds the records
    a lease may take now, lowest first (available, and first of their ordering key); `timers`
    when a lease expires or a retry falls due; `by_key` each ordering key's records not done.
    A lease then takes the first of `ready` instead of walking the window. Replay leaves the
    index unbuilt (and ordering keys unknown: `needs_keys`); the first lease builds it."""

    __slots__ = ("_by_key", "_exhausted", "_flying", "_front_at", "_low_at", "_ready",
                 "_ready_set", "_timers", "dead_lettered", "deliveries", "deltas_since", "done",
                 "frontier", "indexed", "legacy", "log_keys", "max_attempts", "needs_keys",
                 "seq")

    def __init__(self, frontier: int) -> None:
        self.frontier = frontier
        self.deliveries: dict[int, Delivery] = {}
        self.done = DoneRanges()
        self.dead_lettered = 0
        self.seq = 0  # the number of the last window write
        self.deltas_since = 0  # window writes since the last checkpoint
        # Window keys live in the offset topic, (generation, seq; None for a checkpoint),
        # each superseded by the next checkpoint (which writes their tombstones).
        self.log_keys: dict[tuple[int, int | None], None] = {}
        self.legacy = False  # ADR 8's per-record keys may be live in the offset topic
        self.needs_keys = False  # some deliveries came from replay: ordering keys unknown
        self.indexed = False
        self.max_attempts = 0  # as of the last `ensure_index` / `advance`
        # Records a lease may take now: a heap of offsets and the set of those still in it
        # (an offset leaves the set at once; its heap entry is skipped when it comes up).
        self._ready: list[int] = _NO_READY
        self._ready_set: set[int] = _NO_MEMBERS
        # Where the low-water mark and the frontier were last found among the queue's
        # records: the next search starts there (`seek`).
        self._low_at = self._front_at = 0
        self._timers: list[tuple[int, int]] = _NO_TIMERS  # heap of (until, offset); stale
        self._by_key: dict[str, list[int]] = _NO_KEYS  # ones skipped
        self._exhausted: set[int] = _NO_MEMBERS
        # With an in-flight cap: the records leased now (their lease not run out), counted
        # exactly; None without one (it costs a set entry per leased record).
        self._flying: set[int] | None = None

    # The window --------------------------------------------------------------------------------

    def bounds(self, queue_offsets: array[int], committed: int) -> tuple[int, int]:
        """Where the window starts and ends among the queue's records (positions of the
        low-water mark and of the frontier)."""
        low = self._low_at = seek(queue_offsets, committed, self._low_at)
        front = self._front_at = seek(queue_offsets, self.frontier, self._front_at)
        return low, front

    @property
    def frontier_at(self) -> int:
        """Where the frontier was last found among the queue's records (a search hint)."""
        return self._front_at

    def window(self, queue_offsets: array[int], committed: int) -> array[int]:
        """The queue's records in the window: from the low-water mark to the frontier."""
        low, front = self.bounds(queue_offsets, committed)
        return queue_offsets[low:front]

    def window_size(self, queue_offsets: array[int], committed: int) -> int:
        """How many of the queue's records the window holds (done ones included)."""
        low, front = self.bounds(queue_offsets, committed)
        return max(0, front - low)

    def low_water(self, queue_offsets: array[int], committed: int) -> int:
        """Where the low-water mark belongs: the first record of the window that is not done,
        or the frontier when all are. Jumps over done ranges, never walks them."""
        i, end = self.bounds(queue_offsets, committed)
        while i < end:
            off = queue_offsets[i]
            run_end = self.done.end_of_run(off)
            if run_end == off:
                return off
            i = bisect_left(queue_offsets, run_end, i + 1, end)
        return max(committed, self.frontier)

    def settle_below(self, committed: int) -> list[int]:
        """The low-water mark moved to `committed` from outside the window's own writes (an
        ADR 8 entry, a settings change): drop what lies below it; return the offsets whose
        deliveries were dropped."""
        self.done.drop_below(committed)
        gone = [o for o in self.deliveries if o < committed]
        for o in gone:
            self.drop(o)
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
        if not self.indexed:
            times = [d.until for d in self.deliveries.values() if d.until > now]
            return min(times) if times else None
        timers, deliveries = self._timers, self.deliveries
        while timers:
            until, off = timers[0]
            d = deliveries.get(off)
            if d is not None and d.until == until:
                return until
            heappop(timers)
        return None

    # Changes: the window's own writes and their replay make them ---------------------------

    def put(self, offset: int, leased: bool, until: int, attempts: int, grant: int,
            reason: str | None, now: int) -> None:
        """The record is leased until `until`, or waits for a retry until then."""
        d = self.deliveries.get(offset)
        if d is None:  # replayed: its ordering key is read back from the record later
            d = self.deliveries[offset] = Delivery(attempts, until, leased, None, reason, grant)
            self.needs_keys = True
            self.indexed = False
        else:
            d.attempts, d.until, d.leased, d.reason, d.grant = (attempts, until, leased,
                                                                 reason, grant)
        if offset >= self.frontier:
            self.frontier = offset + 1
        if self.indexed:
            ready = self._ready_set
            if offset in ready:
                ready.remove(offset)
                if len(self._ready) > 1024 and len(self._ready) > 2 * len(ready):
                    # Drop what left: a sorted list is a heap, and a set never shrinks.
                    self._ready = sorted(ready)
                    self._ready_set = set(ready)
            if self._exhausted:
                self._exhausted.discard(offset)
            if self._flying is not None:
                if leased and until > now:
                    self._flying.add(offset)
                else:
                    self._flying.discard(offset)
            self._place(offset, d, now)
            if len(self._timers) > 1024 and len(self._timers) > 2 * len(self.deliveries):
                self._timers = [(d.until, o) for o, d in self.deliveries.items()
                                if d.until > now]
                heapify(self._timers)

    def finish(self, offset: int, queue_offsets: array[int], now: int) -> None:
        """The record is done (completed, skipped by a tag filter, dead-lettered)."""
        self.drop(offset, now)
        self.done.add(offset, queue_offsets)
        if offset >= self.frontier:
            self.frontier = offset + 1

    def finish_many(self, offsets: list[int], queue_offsets: array[int], now: int) -> None:
        """`finish` for ascending `offsets`, the done ranges made run by run."""
        for off in offsets:
            self.drop(off, now)
        self.done.add_many(offsets, queue_offsets)
        if offsets and offsets[-1] >= self.frontier:
            self.frontier = offsets[-1] + 1

    def join(self, offset: int, order_key: str | None, now: int, take: bool = False) -> bool:
        """A record past the frontier joins the window, never delivered; True if a lease may
        take it now (no earlier record of its ordering key is pending). With `take`, such a
        record is the caller's to lease at once: it is not put among the ready ones."""
        self.deliveries[offset] = Delivery(0, 0, False, order_key)
        self.frontier = offset + 1
        if not self.indexed:
            return order_key is None
        if order_key is not None:
            pending = self._by_key.get(order_key)
            if pending is None:
                self._by_key[order_key] = [offset]
            else:
                insort(pending, offset)
                if pending[0] != offset:
                    return False
        if take:
            return True
        self._make_ready(offset)
        return True

    def reset(self, frontier: int, dead_lettered: int, done_ranges: list[int]) -> None:
        """Replace the window with a checkpoint's (its deliveries follow through `put`)."""
        self.frontier = frontier
        self.dead_lettered = dead_lettered
        self.deliveries = {}
        self.done = DoneRanges()
        self.done.starts = done_ranges[0::2]
        self.done.ends = done_ranges[1::2]
        self.indexed = False
        self.legacy = False

    def drop(self, offset: int, now: int = 0) -> None:
        """The record's delivery is over (done, or below the mark)."""
        d = self.deliveries.pop(offset, None)
        if not self.indexed:
            return
        self._ready_set.discard(offset)
        if self._exhausted:
            self._exhausted.discard(offset)
        if self._flying is not None:
            self._flying.discard(offset)
        key = d.order_key if d is not None else None
        if key is None:
            return
        pending = self._by_key.get(key)
        if not pending:
            return
        i = bisect_left(pending, offset)
        if i < len(pending) and pending[i] == offset:
            del pending[i]
            if not pending:
                del self._by_key[key]
            elif i == 0:  # the key's next record may go now
                head = pending[0]
                self._place(head, self.deliveries[head], now)

    # Leasing from the index -------------------------------------------------------------------

    def ensure_index(self, now: int, max_attempts: int, count_in_flight: bool = False) -> None:
        """Build the lease index (after replay: every delivery's ordering key known), and move
        what fell due since the last call into it. `count_in_flight`: keep `in_flight` exact
        (a consumer with an in-flight cap)."""
        self.max_attempts = max_attempts
        if not count_in_flight:
            self._flying = None
        if self.indexed:
            if count_in_flight and self._flying is None:
                self._flying = {o for o, d in self.deliveries.items()
                                if d.leased and d.until > now}
            self.advance(now)
            return
        if count_in_flight:  # kept by the index's changes only while it is built
            self._flying = {o for o, d in self.deliveries.items() if d.leased and d.until > now}
        self._ready = []
        self._ready_set = set()
        self._exhausted = set()
        self._by_key = {}
        for off in sorted(self.deliveries):
            key = self.deliveries[off].order_key
            if key is not None:
                self._by_key.setdefault(key, []).append(off)
        self._timers = [(d.until, o) for o, d in self.deliveries.items() if d.until > now]
        heapify(self._timers)
        self.indexed = True
        for off, d in self.deliveries.items():
            if d.until <= now:
                self._place(off, d, now)

    def advance(self, now: int) -> None:
        """Leases that expired and retries that fell due become available."""
        timers, deliveries = self._timers, self.deliveries
        while timers and timers[0][0] <= now:
            until, off = heappop(timers)
            d = deliveries.get(off)
            if d is not None and d.until == until:
                if self._flying is not None:
                    self._flying.discard(off)  # its lease ran out (or its retry fell due)
                self._place(off, d, now)

    def release_index(self) -> None:
        """An empty window (nothing in flight, waiting or done above the mark) lets go of its
        lease index until the next lease builds it again: an idle queue's window costs about
        a third as much (a queue a prefix consumer leased from and left idle, ADR 13)."""
        if self.deliveries or self.done.starts or not self.indexed:
            return
        self.indexed = False
        self.deliveries = {}  # a dict keeps its table when emptied
        self._ready = _NO_READY
        self._ready_set = _NO_MEMBERS
        self._exhausted = _NO_MEMBERS
        self._by_key = _NO_KEYS
        self._timers = _NO_TIMERS
        if self._flying is not None:
            self._flying = None  # built again with the index (`ensure_index`)

    def may_lease(self, now: int) -> bool:
        """Whether a lease may find one of the window's records now: one available, or one
        whose last attempt ran out (for the dead letters). An unindexed window (replayed, or
        let go: `release_index`) cannot tell without a walk: any delivery may be. Records
        past the frontier are the caller's to check."""
        if not self.indexed:
            return bool(self.deliveries)
        timers = self._timers
        return bool(self._ready_set or self._exhausted or (timers and timers[0][0] <= now))

    def in_flight(self) -> int:
        """Records leased now, as of the last `ensure_index` (with `count_in_flight`)."""
        return len(self._flying) if self._flying is not None else 0

    def _place(self, offset: int, d: Delivery, now: int) -> None:
        if d.until > now:
            heappush(self._timers, (d.until, offset))
        elif d.attempts and d.attempts >= self.max_attempts:
            self._exhausted.add(offset)  # its last attempt expired: for the dead letters
        elif d.order_key is None or self._by_key[d.order_key][0] == offset:
            self._make_ready(offset)

    def _make_ready(self, offset: int) -> None:
        if offset not in self._ready_set:
            self._ready_set.add(offset)
            heappush(self._ready, offset)

    def take_ready(self, limit: int) -> list[int]:
        """Up to `limit` records a lease may take now, lowest offset first, taken out of the
        index: the caller leases them, or gives them back (`give_back`)."""
        heap, members = self._ready, self._ready_set
        out: list[int] = []
        while heap and len(out) < limit:
            off = heappop(heap)
            if off in members:
                members.remove(off)
                out.append(off)
        return out

    def give_back(self, offsets: list[int], now: int) -> None:
        """Records taken (`take_ready`, `join` with `take`) and not leased after all."""
        if not self.indexed:
            return
        for off in offsets:
            d = self.deliveries.get(off)
            if d is not None:
                self._place(off, d, now)

    def exhausted(self) -> list[int]:
        """Records whose last attempt's lease expired (for the dead letters), in order."""
        return sorted(self._exhausted)

# An unindexed window's index parts: shared and empty, never changed (every change to them
# happens on an indexed window, whose `ensure_index` made its own).
_NO_READY: list[int] = []
_NO_MEMBERS: set[int] = set()
_NO_KEYS: dict[str, list[int]] = {}
_NO_TIMERS: list[tuple[int, int]] = []
