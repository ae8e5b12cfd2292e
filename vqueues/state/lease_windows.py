"""A partition's consumer settings and lease windows: `ConsumerConfig` and `LeaseWindow` by
(queue, consumer), as the offset topic's entries make them (ADR 8, ADR 12). The rules that
decide the entries are the work service's; this is what replay and the owner's own writes
apply, and what a snapshot carries."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

from vqueues.records import (
    ConsumerConfigured,
    DeliveryCleared,
    DeliveryUpdated,
    OffsetEntry,
    WindowDelta,
    WindowKeyCleared,
    attributes_of,
    now_ms,
)
from vqueues.state.consumer_config import LEASE, ConsumerConfig
from vqueues.state.window import Delivery, LeaseWindow

# A snapshot's rows: (queue, consumer, mode, max_attempts, dead_letter_queue, visibility_ms,
# max_in_flight, prefix, durable_grants, attributes as a dict or None); rows of snapshots
# before format 7 end after visibility_ms, of format 7 after prefix, of format 8 after
# durable_grants.
ConfigRow = tuple[Any, ...]
# (queue, consumer, frontier, dead_lettered, done starts, done ends,
#  [(offset, attempts, until, leased, order_key, reason, grant)],
#  seq, deltas_since, [(generation, seq; -1 for a checkpoint)], legacy, needs_keys).
# Rows of snapshot formats before 6 end after the deliveries, which lack the grant.
WindowRow = tuple[Any, ...]


def _shared(config: ConsumerConfig) -> ConsumerConfig:
    """One object for equal settings: the queues under a prefix consumer share them."""
    found = _CONFIGS.get(config)
    if found is None:
        if len(_CONFIGS) >= 10_000:
            _CONFIGS.clear()
        found = _CONFIGS[config] = config
    return found


_CONFIGS: dict[ConsumerConfig, ConsumerConfig] = {}


class LeaseWindows:
    """Consumers with settings (`configs`) and the lease consumers' windows (`work`)."""

    __slots__ = ("configs", "last_attempts", "windows")

    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], ConsumerConfig] = {}
        self.windows: dict[tuple[str, str], LeaseWindow] = {}
        # (deadline, queue, consumer) of leases on a record's last attempt: when one expires,
        # the record goes to the dead letters then (`lease_expiry`), not at the next lease.
        self.last_attempts: list[tuple[int, str, str]] = []

    def due_last_attempts(self, now: int) -> list[tuple[str, str]]:
        """The consumers with a last-attempt lease that expired by `now` (each once)."""
        heap = self.last_attempts
        out: dict[tuple[str, str], None] = {}
        while heap and heap[0][0] <= now:
            _, queue, consumer = heappop(heap)
            out[(queue, consumer)] = None
        return list(out)

    # Replay: one method per offset-topic entry that touches them ------------------------------

    def acked(self, queue: str, consumer: str, offset: int, dead_lettered: int) -> None:
        """The consumer's committed offset moved (a `c` entry): for a lease consumer, its
        low-water mark."""
        work = self.windows.get((queue, consumer))
        if work is not None:
            work.frontier = max(work.frontier, offset)
            work.settle_below(offset)
            work.dead_lettered = dead_lettered

    def forget(self, queue: str, consumer: str) -> None:
        """The consumer was deleted, or its settings cleared."""
        self.configs.pop((queue, consumer), None)
        self.windows.pop((queue, consumer), None)

    def configured(self, e: ConsumerConfigured, committed: int | None) -> None:
        """New settings; a consumer that becomes a lease consumer starts its window at its
        committed offset, one that becomes a cursor loses its window."""
        key = (e.queue, e.consumer)
        self.configs[key] = _shared(ConsumerConfig(e.mode, e.max_attempts, e.dead_letter_queue,
                                                   e.visibility_ms, e.max_in_flight, e.prefix,
                                                   e.durable_grants, e.attributes))
        if e.mode == LEASE:
            if key not in self.windows:
                self.windows[key] = LeaseWindow(committed or 0)
        else:
            self.windows.pop(key, None)

    def window_written(self, e: WindowDelta, own: bool,
                       offsets_of: Callable[[str], array[int]]) -> None:
        """A window write (ADR 12), replayed or this owner's own (`own`: its writer finished its
        records already, to find the mark). An own checkpoint repeats what the delta before
        it applied: only its bookkeeping is done."""
        key = (e.queue, e.consumer)
        work = self.windows.get(key)
        if work is None:
            work = self.windows[key] = LeaseWindow(e.frontier)
        now = now_ms()
        if e.checkpoint:
            work.log_keys.clear()
            work.deltas_since = 0
            work.legacy = False
            if not own:
                work.reset(e.frontier, e.dead_lettered or 0, e.done_ranges)
                work.needs_keys = True  # its records' ordering keys are read back
        else:
            work.deltas_since += 1
        work.log_keys[(e.generation, None if e.checkpoint else e.seq)] = None
        work.seq = max(work.seq, e.seq)
        if own and e.checkpoint:
            return
        # An own write's records were finished and set by its writer (`WindowWrite`).
        if e.done and not own:
            work.finish_many(e.done, offsets_of(e.queue), now)
        config = self.configs.get(key)
        for g in e.groups:
            if not own:
                for off in g.offsets:
                    work.put(off, g.leased, g.until, g.attempts, g.grant, g.reason, now)
            if g.leased and config is not None and g.attempts >= config.max_attempts:
                heappush(self.last_attempts, (g.until, e.queue, e.consumer))
        if e.low_water is not None:
            work.done.drop_below(e.low_water)
            if work.frontier < e.low_water:
                work.frontier = e.low_water
        if e.dead_lettered is not None:
            work.dead_lettered = e.dead_lettered
        work.release_index()  # if the window is empty now

    def key_cleared(self, e: WindowKeyCleared) -> None:
        work = self.windows.get((e.queue, e.consumer))
        if work is not None:
            work.log_keys.pop((e.generation, e.seq), None)

    def fenced(self, e: OffsetEntry) -> None:
        """A fenced-off owner's window write (ignored): its key still needs a tombstone."""
        if isinstance(e, WindowDelta):
            work = self.windows.get((e.queue, e.consumer))
            if work is not None:
                work.log_keys[(e.generation, None if e.checkpoint else e.seq)] = None

    def delivery_updated(self, e: DeliveryUpdated, committed: int,
                         offsets_of: Callable[[str], array[int]]) -> None:
        """ADR 8's entry: one record of a window was leased, retried, extended or completed.
        `offsets_of` gives the queue's offsets (asked only for a completion)."""
        key = (e.queue, e.consumer)
        work = self.windows.get(key)
        if work is None:
            work = self.windows[key] = LeaseWindow(0)
        work.legacy = True
        if e.offset < committed:
            return  # settled already (its tombstone may not have been written)
        now = now_ms()
        if e.done:
            work.finish(e.offset, offsets_of(e.queue), now)
        else:
            work.put(e.offset, e.leased, e.until_ms, e.attempts, 0, e.reason, now)
            d = work.deliveries[e.offset]
            d.order_key = e.order_key

    def delivery_cleared(self, e: DeliveryCleared) -> None:
        """ADR 8's tombstone: the record is below the mark. Once a checkpoint replaced the
        window (not `legacy`), such tombstones only clear the old keys: nothing to apply."""
        work = self.windows.get((e.queue, e.consumer))
        if work is not None and work.legacy:
            work.drop(e.offset)

    def drop_queue(self, queue: str) -> None:
        """The queue was deleted: its consumers' settings and windows go with it."""
        for key in [k for k in self.configs if k[0] == queue]:
            del self.configs[key]
        for key in [k for k in self.windows if k[0] == queue]:
            del self.windows[key]

    # Queries ---------------------------------------------------------------------------------

    def tombstones(self, queue: str, consumer: str, queue_offsets: array[int] | None,
                   committed: int) -> list[OffsetEntry]:
        """Tombstones for every window key the lease consumer may have live in the log."""
        work = self.windows.get((queue, consumer))
        if work is None:
            return []
        out: list[OffsetEntry] = [WindowKeyCleared(queue, consumer, gen, seq)
                                  for gen, seq in work.log_keys]
        return out + self.legacy_tombstones(queue, consumer, work, queue_offsets, committed)

    @staticmethod
    def legacy_tombstones(queue: str, consumer: str, work: LeaseWindow,
                          queue_offsets: array[int] | None, committed: int
                          ) -> list[OffsetEntry]:
        """Tombstones for ADR 8's per-record keys the window may hold (none once a checkpoint
        replaced them)."""
        if not work.legacy:
            return []
        window = work.window(queue_offsets, committed) if queue_offsets is not None else ()
        offsets = set(work.deliveries) | set(window)
        return [DeliveryCleared(queue, consumer, o) for o in sorted(offsets)]

    # The snapshot's section ----------------------------------------------------------------

    def capture(self) -> tuple[list[ConfigRow], list[WindowRow]]:
        """Every consumer's settings and every window, as rows."""
        configs: list[ConfigRow] = [
            (q, c, k.mode, k.max_attempts, k.dead_letter_queue, k.visibility_ms, k.max_in_flight,
             k.prefix, k.durable_grants, dict(k.attributes) if k.attributes else None)
            for (q, c), k in self.configs.items()]
        work: list[WindowRow] = [
            (q, c, w.frontier, w.dead_lettered, list(w.done.starts), list(w.done.ends),
             [(o, d.attempts, d.until, d.leased, d.order_key, d.reason, d.grant)
              for o, d in w.deliveries.items()],
             w.seq, w.deltas_since, [(g, -1 if s is None else s) for g, s in w.log_keys],
             w.legacy, w.needs_keys)
            for (q, c), w in self.windows.items()]
        return configs, work

    def restore(self, configs: Sequence[ConfigRow], work: Sequence[WindowRow]) -> None:
        """Replace everything with what `capture` described (or an older snapshot's rows)."""
        self.configs = {(str(row[0]), str(row[1])): _shared(ConsumerConfig(
            str(row[2]), int(row[3]), row[4], int(row[5]),
            int(row[6]) if len(row) > 6 and row[6] is not None else None,
            row[7] if len(row) > 7 else None,
            bool(row[8]) if len(row) > 8 else False,
            attributes_of(row[9]) if len(row) > 9 else ())) for row in configs}
        self.windows = {}
        self.last_attempts = []
        for row in work:
            q, c, frontier, dead, starts, ends, deliveries = row[:7]
            w = self.windows[(str(q), str(c))] = LeaseWindow(int(frontier))
            w.dead_lettered = int(dead)
            w.done.starts, w.done.ends = list(starts), list(ends)
            w.deliveries = {int(d[0]): Delivery(int(d[1]), int(d[2]), bool(d[3]), d[4], d[5],
                                                int(d[6]) if len(d) > 6 else 0)
                            for d in deliveries}
            if len(row) > 7:
                seq, since, keys, legacy, needs_keys = row[7:12]
                w.seq, w.deltas_since = int(seq), int(since)
                w.log_keys = {(int(g), None if s < 0 else int(s)): None
                              for g, s in keys}
                w.legacy, w.needs_keys = bool(legacy), bool(needs_keys)
            else:  # an older snapshot: its window's keys in the log are ADR 8's
                w.legacy = w.needs_keys = True
            config = self.configs.get((str(q), str(c)))
            if config is not None:
                for d in w.deliveries.values():
                    if d.leased and d.attempts >= config.max_attempts:
                        self.last_attempts.append((d.until, str(q), str(c)))
        heapify(self.last_attempts)
