"""A group listener installed later (ADR 19): a node that leaves a layout joins the next
layout's consumer group at once, while it cuts, and hands the membership to the node it
restarts as. Until then the slot takes the group's assignments at once (reading from the
beginning: a new layout's partitions have no snapshot yet) and holds what the tail brings, so
that the group's other members are never held up by this one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Container, Sequence

from vqueues.storage import Consumed, GroupListener

log = logging.getLogger(__name__)


class ListenerSlot:
    """A `GroupListener` whose listener comes later (`attach`); called from the group's
    thread, in order."""

    def __init__(self) -> None:
        self._target: GroupListener | None = None
        self._lock = threading.Lock()
        self._owned: set[int] = set()
        self._consumed: list[tuple[list[Consumed], dict[int, int], dict[int, int]]] = []
        self._ends: list[tuple[int, int]] = []
        self.joined = threading.Event()  # the group's first assignment came (maybe empty)

    def attach(self, listener: GroupListener) -> None:
        """Hand the membership over (from the event loop): what the listener does with it
        blocks on the loop, so it is done on a thread of its own, before the group's next
        report."""
        threading.Thread(target=self._drain, args=(listener,), name="vq-slot-attach",
                         daemon=True).start()

    def _drain(self, listener: GroupListener) -> None:
        with self._lock:
            if self._target is not None:
                return  # closed meanwhile
            owned = sorted(self._owned)
            if owned:
                listener.assigned(owned)  # its starts: the tail reads from the beginning
            for batch, high, positions in self._consumed:
                listener.consumed([c for c in batch if c[0] in self._owned],
                                  {p: o for p, o in high.items() if p in self._owned},
                                  {p: o for p, o in positions.items() if p in self._owned})
            for partition, offset in self._ends:
                if partition in self._owned:
                    listener.reached_end(partition, offset)
            self._consumed.clear()
            self._ends.clear()
            self._target = listener

    def close(self) -> None:
        """Never attached (the node stopped first): nothing is taken any more."""
        with self._lock:
            if self._target is None:
                self._target = _Closed()
                self._consumed.clear()

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        self.joined.set()
        with self._lock:
            if self._target is not None:
                return self._target.assigned(partitions)
            self._owned.update(partitions)
            return {}

    def revoked(self, partitions: Sequence[int], lost: bool) -> None:
        with self._lock:
            if self._target is not None:
                self._target.revoked(partitions, lost)
            else:
                self._owned.difference_update(partitions)

    def indexed(self, partition: int) -> Container[int]:
        target = self._target
        return target.indexed(partition) if target is not None else ()

    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None:
        with self._lock:
            if self._target is not None:
                self._target.consumed(batch, high_watermarks, positions)
            else:
                self._consumed.append((batch, high_watermarks, positions))

    def reached_end(self, partition: int, next_offset: int) -> None:
        with self._lock:
            if self._target is not None:
                self._target.reached_end(partition, next_offset)
            else:
                self._ends.append((partition, next_offset))

    def failed(self, error: str) -> None:
        target = self._target
        if target is not None:
            target.failed(error)
        else:
            log.error("group_failed", extra={"error": error, "before": "the node restarted"})


class _Closed:
    """What a slot closed before any listener came passes to: nothing is taken."""

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        return {}

    def revoked(self, partitions: Sequence[int], lost: bool) -> None:
        return None

    def indexed(self, partition: int) -> Container[int]:
        return ()

    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None:
        return None

    def reached_end(self, partition: int, next_offset: int) -> None:
        return None

    def failed(self, error: str) -> None:
        return None
