"""One partition's queues that may have records for each prefix consumer (ADR 13): kept as
records arrive and windows change, so that a prefix lease never looks at an idle queue.

Per prefix consumer, a turn order of queues (a deque, and the set of queues in it: the queue
whose turn it is comes first; one served goes to the back) and a heap of (time, queue) for queues
with nothing to lease until a lease runs out or a retry falls due. A queue may be in the order
and turn out to have nothing (records completed meanwhile): it is dropped when its turn comes.
A queue never leased and holding no record is in neither: an idle queue costs nothing here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from heapq import heappop, heappush


class ReadyQueues:
    __slots__ = ("_on_ready", "_orders", "_owed", "_timed", "_timers")

    def __init__(self, on_ready: Callable[[str], None] | None = None) -> None:
        self._orders: dict[str, tuple[deque[str], set[str]]] = {}
        self._timers: dict[str, list[tuple[int, str]]] = {}
        self._on_ready = on_ready  # a queue may have records for this consumer now
        # (consumer, queue) -> records left of a turn a lease call's end cut short: the
        # queue is first in turn, and its next turn takes just these.
        self._owed: dict[tuple[str, str], int] = {}
        # (consumer, queue) -> the earliest time it is timed for: a later time is not pushed
        # (the queue's turn or recheck then times it again), so every window write of a busy
        # queue does not leave a heap entry behind.
        self._timed: dict[tuple[str, str], int] = {}

    def add(self, consumer: str, queue: str) -> None:
        """`queue` may have records for `consumer`: it takes its turn (at the back)."""
        order = self._orders.get(consumer)
        if order is None:
            order = self._orders[consumer] = (deque(), set())
        turns, members = order
        if queue not in members:
            members.add(queue)
            turns.append(queue)
            if self._on_ready is not None:
                self._on_ready(consumer)

    def add_many(self, consumer: str, queues: Iterable[str]) -> None:
        for queue in queues:
            self.add(consumer, queue)

    def later(self, consumer: str, queue: str, at_ms: int) -> None:
        """`queue` has nothing for `consumer` until `at_ms` (a lease runs out, a retry)."""
        key = (consumer, queue)
        timed = self._timed.get(key)
        if timed is not None and timed <= at_ms:
            return
        self._timed[key] = at_ms
        heappush(self._timers.setdefault(consumer, []), (at_ms, queue))

    def untime(self, consumer: str, queue: str) -> None:
        """`queue` has nothing to wait for (its leases were all settled): its timer, if any,
        comes due as nothing, so a settled queue is not rechecked at its lease's old expiry."""
        self._timed.pop((consumer, queue), None)

    def due(self, consumer: str, now_ms: int) -> list[str]:
        """The queues whose time came, out of the timers: the caller looks at each again
        (`PartitionState.recheck_queue`)."""
        timers = self._timers.get(consumer)
        out: list[str] = []
        while timers and timers[0][0] <= now_ms:
            at, queue = heappop(timers)
            key = (consumer, queue)
            if self._timed.get(key) == at:
                del self._timed[key]
                out.append(queue)
        return out

    def next_at(self, consumer: str) -> int | None:
        timers = self._timers.get(consumer)
        return timers[0][0] if timers else None

    def take(self, consumer: str) -> tuple[str, int | None] | None:
        """The queue whose turn it is, out of the order (the caller adds it back if it still
        has records), and what is left of its turn if a call's end cut it short (None: a
        whole turn)."""
        order = self._orders.get(consumer)
        if order is None or not order[0]:
            return None
        queue = order[0].popleft()
        order[1].discard(queue)
        return queue, self._owed.pop((consumer, queue), None)

    def resume(self, consumer: str, queue: str, records: int) -> None:
        """`queue`'s turn was cut short with `records` left: it is first in turn again."""
        order = self._orders.get(consumer)
        if order is None:
            order = self._orders[consumer] = (deque(), set())
        turns, members = order
        if queue in members:  # put back meanwhile (its window's write): just now, at the end
            if turns[-1] == queue:
                turns.pop()
            else:
                turns.remove(queue)
        members.add(queue)
        turns.appendleft(queue)
        self._owed[(consumer, queue)] = records

    def waiting(self, consumer: str) -> list[str]:
        """The queues in `consumer`'s turn order now, in turn."""
        order = self._orders.get(consumer)
        return list(order[0]) if order is not None else []

    def size(self, consumer: str) -> int:
        """Queues in `consumer`'s turn order now."""
        order = self._orders.get(consumer)
        return len(order[0]) if order is not None else 0

    def forget(self, consumer: str) -> None:
        """The prefix consumer went (or changed): its orders start over."""
        self._orders.pop(consumer, None)
        self._timers.pop(consumer, None)
        for key in [k for k in self._owed if k[0] == consumer]:
            del self._owed[key]
        for key in [k for k in self._timed if k[0] == consumer]:
            del self._timed[key]
