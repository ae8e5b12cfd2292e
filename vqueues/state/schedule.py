"""Scheduled records: written now, visible at their due time (docs/api.md#scheduled-records).

A scheduled record is written to its queue's partition with a `vq-deliver-at` header (UTC ms),
which keeps it out of the queue's index: the owner holds it in a due-time heap instead. At its
due time the owner writes the real record to the queue, carrying `vq-scheduled-from: <offset>`
(the scheduled record's offset, its id); indexing that record removes the scheduled one. A
cancellation is a record with `vq-cancel-scheduled: <offset>`. Everything is in the data log, so
a new owner's replay rebuilds the heap exactly: a move written before a crash is seen (no second
delivery), one not written is done again (none lost).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

DELIVER_AT_HEADER = "vq-deliver-at"
FROM_HEADER = "vq-scheduled-from"
CANCEL_HEADER = "vq-cancel-scheduled"


def control_of(headers: Sequence[tuple[str, bytes | None]]) -> tuple[str, int] | None:
    """("at", due), ("cancel", id) or ("from", id) if the headers say so."""
    for name, value in headers:
        if value and name in (DELIVER_AT_HEADER, CANCEL_HEADER, FROM_HEADER):
            try:
                number = int(value)
            except ValueError:
                continue
            return {DELIVER_AT_HEADER: "at", CANCEL_HEADER: "cancel",
                    FROM_HEADER: "from"}[name], number
    return None


class Schedule:
    """One partition's scheduled records: queue -> {id (offset): due}, and a due-time heap."""

    __slots__ = ("_heap", "by_queue", "moving")

    def __init__(self) -> None:
        self.by_queue: dict[str, dict[int, int]] = {}
        self._heap: list[tuple[int, int, str]] = []
        self.moving: set[int] = set()  # ids being moved or cancelled right now

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_queue.values())

    def add(self, queue: str, record_id: int, due: int) -> None:
        self.by_queue.setdefault(queue, {})[record_id] = due
        heapq.heappush(self._heap, (due, record_id, queue))

    def remove(self, queue: str, record_id: int) -> bool:
        """Forget a scheduled record (moved or cancelled); True if it was there."""
        self.moving.discard(record_id)
        pending = self.by_queue.get(queue)
        if pending is None or pending.pop(record_id, None) is None:
            return False
        if not pending:
            del self.by_queue[queue]
        return True

    def holds(self, queue: str, record_id: int) -> bool:
        return record_id in self.by_queue.get(queue, {})

    def take_due(self, now_ms: int) -> list[tuple[int, int, str]]:
        """(due, id, queue) of every record due by now that is not being moved, in due order;
        they are marked moving until `remove` (done) or `release` (try again)."""
        heap, out = self._heap, []
        while heap and heap[0][0] <= now_ms:
            due, record_id, queue = heapq.heappop(heap)
            if self.by_queue.get(queue, {}).get(record_id) == due and record_id not in self.moving:
                self.moving.add(record_id)
                out.append((due, record_id, queue))
        return out

    def next_at(self) -> int | None:
        """The earliest due time of a record not being moved (or of one gone since: then
        `take_due` finds it stale), if any."""
        return self._heap[0][0] if self._heap else None

    def release(self, entries: Sequence[tuple[int, int, str]]) -> None:
        """A move failed: the records are due again at the next tick."""
        for due, record_id, queue in entries:
            self.moving.discard(record_id)
            if self.holds(queue, record_id):
                heapq.heappush(self._heap, (due, record_id, queue))

    def next_due(self, queue: str) -> int | None:
        pending = self.by_queue.get(queue)
        return min(pending.values()) if pending else None

    def drop_below(self, queue: str | None, offset: int) -> int:
        """Forget scheduled records below `offset` (of one queue, or all): retention or a
        deletion removed them. Returns how many."""
        dropped = 0
        for q in [queue] if queue is not None else list(self.by_queue):
            pending = self.by_queue.get(q)
            if not pending:
                continue
            for record_id in [i for i in pending if i < offset]:
                del pending[record_id]
                dropped += 1
            if not pending:
                del self.by_queue[q]
        return dropped

    def entries(self) -> list[tuple[str, int, int]]:
        """(queue, id, due) of every scheduled record."""
        return [(q, i, due) for q, pending in self.by_queue.items() for i, due in pending.items()]

    # The snapshot's section ----------------------------------------------------------------

    def capture(self, cut: int) -> list[tuple[str, int, int]]:
        """(queue, id, due) of the scheduled records written below `cut`."""
        return [e for e in self.entries() if e[1] < cut]

    def restore(self, rows: Sequence[tuple[str, int, int]]) -> None:
        """Add the scheduled records `capture` described."""
        for queue, record_id, due in rows:
            self.add(queue, record_id, due)
