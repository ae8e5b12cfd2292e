"""A partition leaving for a new layout (ADR 19): from the cut's start nothing is served and
nothing new is written; what the tail and the node's delivery reports bring is held until the
marker's offset is known, then only what lies below it counts."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from vqueues.records import Record


class LayoutCutGate:
    __slots__ = ("_held", "cut_at", "cutting")

    def __init__(self) -> None:
        self.cutting = False
        self.cut_at: int | None = None  # the marker's offset, once written
        self._held: list[Callable[[], None]] = []

    def hold(self, step: Callable[[], None]) -> bool:
        """Keep `step` for later if the marker is not known yet; whether it was kept."""
        if self.cutting and self.cut_at is None:
            self._held.append(step)
            return True
        return False

    def below(self, records: Iterable[tuple[str, Record]]) -> list[tuple[str, Record]]:
        """The records that count: all of them, or during a cut those below the marker."""
        cut = self.cut_at
        if not self.cutting or cut is None:
            return list(records)
        return [(q, r) for q, r in records if r.offset < cut]

    def set(self, marker: int) -> None:
        """The marker is at `marker`: run what was held, in order, against it."""
        self.cut_at = marker
        held, self._held = self._held, []
        for step in held:
            step()
