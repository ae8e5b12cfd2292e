"""A group listener installed later (ADR 19): a node that leaves a layout joins the next
layout's consumer group at once, while it cuts, and hands the membership to the node it
restarts as; until then, what the group reports waits here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Container, Sequence

from vqueues.storage import Consumed, GroupListener

log = logging.getLogger(__name__)


class ListenerSlot:
    """A `GroupListener` that passes everything to `attach`ed listener; an assignment made
    before waits for it (the group thread blocks, as it does while a snapshot loads)."""

    def __init__(self) -> None:
        self._target: GroupListener | None = None
        self._attached = threading.Event()
        self.joined = threading.Event()  # the group's first assignment came (maybe empty)

    def attach(self, listener: GroupListener) -> None:
        self._target = listener
        self._attached.set()

    def close(self) -> None:
        """Never attached (the node stopped first): an assignment waiting is let go."""
        if self._target is None:
            self._target = _Closed()
            self._attached.set()

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        self.joined.set()
        self._attached.wait()
        assert self._target is not None
        return self._target.assigned(partitions)

    def revoked(self, partitions: Sequence[int], lost: bool) -> None:
        if self._target is not None:
            self._target.revoked(partitions, lost)

    def indexed(self, partition: int) -> Container[int]:
        return self._target.indexed(partition) if self._target is not None else ()

    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None:
        if self._target is not None:
            self._target.consumed(batch, high_watermarks, positions)

    def reached_end(self, partition: int, next_offset: int) -> None:
        if self._target is not None:
            self._target.reached_end(partition, next_offset)

    def failed(self, error: str) -> None:
        if self._target is not None:
            self._target.failed(error)
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
