"""A lease call's changes to a lease consumer's window as one offset-topic write (ADR 12): the
records it leases, retries or extends grouped by their new state, the records it finishes,
and the low-water mark if it moved. Every `CHECKPOINT_EVERY` writes or so the window is also
written whole (a checkpoint), followed by tombstones for the writes it supersedes, so the
offset topic's compaction keeps each window to a checkpoint and the writes since.

Decisions on the partition's state, made under the consumer's lock: `entries` applies the
write to the state and returns what to hand to the producer, in order.
"""

from __future__ import annotations

from itertools import pairwise

from vqueues.records import DeliveryGroup, OffsetEntry, WindowDelta, WindowKeyCleared, now_ms
from vqueues.state.partition_state import PartitionState
from vqueues.state.window import LeaseWindow

# Window writes between checkpoints (at least; a large window's checkpoint comes after more
# writes, one per `CHECKPOINT_RECORDS` of its deliveries, so its cost per write stays small).
CHECKPOINT_EVERY = 64
CHECKPOINT_RECORDS = 16

GroupKey = tuple[bool, int, int, int, str | None]


class WindowWrite:
    """Collects one call's changes; `entries` applies them and makes the write."""

    __slots__ = ("applied", "consumer", "dead", "done", "groups", "now", "queue", "state",
                 "work")

    def __init__(self, state: PartitionState, queue: str, consumer: str, work: LeaseWindow
                 ) -> None:
        self.state = state
        self.queue = queue
        self.consumer = consumer
        self.work = work
        self.groups: dict[GroupKey, list[int]] = {}
        self.done: list[int] = []
        self.applied: list[int] = []  # finished in the window already (`finish_now`)
        self.dead = 0
        self.now = now_ms()

    def __bool__(self) -> bool:
        return bool(self.groups or self.done or self.applied or self.dead)

    def put(self, offset: int, leased: bool, until: int, attempts: int, grant: int,
            reason: str | None) -> None:
        """The record becomes leased until `until` (or waits for a retry until then), in the
        window at once."""
        key = (leased, until, attempts, grant, reason)
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = [offset]
        else:
            group.append(offset)
        self.work.put(offset, leased, until, attempts, grant, reason, self.now)

    def finish(self, offsets: list[int], dead: int = 0) -> None:
        """The records are done; `dead` of them went to the dead letters."""
        self.done += offsets
        self.dead += dead

    def finish_now(self, offsets: list[int]) -> None:
        """The records are done, in the window at once (so what the same call leases next
        sees them finished), written with the rest of the call's changes."""
        q = self.state.queues.get(self.queue)
        if q is None:
            self.done += offsets
            return
        done = sorted(set(offsets)) if len(offsets) > 1 else offsets
        self.work.finish_many(done, q.offsets, self.now)
        self.applied += done

    def entries(self) -> list[OffsetEntry]:
        """Apply the write to the partition's state and return its entries: the delta, then
        (when due) a checkpoint and the tombstones of what it supersedes."""
        state, work, queue, consumer = self.state, self.work, self.queue, self.consumer
        q = state.queues.get(queue)
        held = q.offsets if q is not None else None
        committed = state.committed(queue, consumer) or 0
        done = sorted(set(self.done)) if len(self.done) > 1 else self.done
        if held is not None and done:  # first, so the low-water mark is known
            work.finish_many(done, held, self.now)
        if self.applied:
            done = sorted({*self.applied, *done})
        low = work.low_water(held, committed) if held is not None else committed
        delta = WindowDelta(
            queue, consumer, state.generation, work.seq + 1,
            [DeliveryGroup(*key, offs if _ascending(offs) else sorted(offs))
             for key, offs in self.groups.items()], done,
            low if low > committed else None,
            work.dead_lettered + self.dead if self.dead else None, self.now)
        state.apply_offset_entries([delta], own=True)
        out: list[OffsetEntry] = [delta]
        if work.legacy or work.deltas_since >= max(
                CHECKPOINT_EVERY, len(work.deliveries) // CHECKPOINT_RECORDS):
            out += checkpoint(state, queue, consumer, work)
        return out


def _ascending(offsets: list[int]) -> bool:
    return all(a < b for a, b in pairwise(offsets))


def checkpoint(state: PartitionState, queue: str, consumer: str, work: LeaseWindow
               ) -> list[OffsetEntry]:
    """The window written whole, then tombstones for every window key it supersedes (and for
    ADR 8's per-record keys); applied to the state's bookkeeping."""
    q = state.queues.get(queue)
    committed = state.committed(queue, consumer) or 0
    superseded: list[OffsetEntry] = [WindowKeyCleared(queue, consumer, gen, seq)
                                     for gen, seq in work.log_keys
                                     if (gen, seq) != (state.generation, None)]
    superseded += state.lease_windows.legacy_tombstones(queue, consumer, work,
                                                 q.offsets if q is not None else None, committed)
    groups: dict[GroupKey, list[int]] = {}
    for off, d in work.deliveries.items():
        if d.attempts or d.until:  # never delivered: nothing to write
            groups.setdefault((d.leased, d.until, d.attempts, d.grant, d.reason),
                              []).append(off)
    ranges = [x for pair in work.done.ranges() for x in pair]
    # The consumer's last ack, not now: a checkpoint (at a takeover, say) is no ack.
    entry = q.consumers.get(consumer) if q is not None else None
    acked_at = entry[1] if entry is not None else now_ms()
    full = WindowDelta(queue, consumer, state.generation, work.seq + 1,
                       [DeliveryGroup(*key, sorted(offs)) for key, offs in groups.items()],
                       [], committed, work.dead_lettered, acked_at, True, work.frontier,
                       ranges)
    entries: list[OffsetEntry] = [full, *superseded]
    state.apply_offset_entries(entries, own=True)
    return entries


def takeover_checkpoints(state: PartitionState) -> list[OffsetEntry]:
    """Checkpoints, under the state's (new) generation, of every window that stands on window
    keys of an older one; applied to the state's bookkeeping. A window still in ADR 8's
    format is left to its first write (its keys are tombstoned once the data is indexed)."""
    gen = state.generation
    out: list[OffsetEntry] = []
    for (queue, consumer), work in state.windows.items():
        if not work.legacy and any(g != gen for g, _ in work.log_keys):
            out += checkpoint(state, queue, consumer, work)
    return out
