"""Adoption (ADR 19): a partition of a grown layout that has no snapshot of its own takes its
queues over from its parent's final snapshot, keeping only the queues that route to it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vqueues.layouts import Cut, Layout
from vqueues.snapshot import wire
from vqueues.snapshot.format import SnapshotError
from vqueues.snapshot.image import Snapshot
from vqueues.snapshot.split import split
from vqueues.storage import OffsetLog


@dataclass(frozen=True, slots=True)
class Adoption:
    """How the partitions of `layout` find their parents' final snapshots: the layout
    before, its partitions' first cuts for `layout`, and its snapshot topic."""

    layout: Layout
    parent: Layout
    cuts: dict[int, Cut]
    parent_snapshots: OffsetLog

    def read(self, partitions: Sequence[int]) -> dict[int, Snapshot | SnapshotError]:
        """Blocking: each child's image cut out of its parent's final snapshot; an error for a
        child whose parent's cut or snapshot is missing (it cannot serve)."""
        parents = sorted({self.layout.parent(p, self.parent) for p in partitions})
        read = self.parent_snapshots.read_to_end(parents)
        images: dict[int, Snapshot | SnapshotError] = {}
        for parent in parents:
            cut = self.cuts.get(parent)
            if cut is None:
                images[parent] = SnapshotError(f"partition {parent} of layout "
                                               f"{self.parent.number} was not cut")
                continue
            try:
                image = wire.latest(parent, [(k, v) for k, v, _ in read[parent][0]],
                                    snapshot_id=cut.snapshot)
            except SnapshotError as exc:
                images[parent] = exc
                continue
            images[parent] = image if image is not None else SnapshotError(
                f"the final snapshot {cut.snapshot} of partition {parent} of layout "
                f"{self.parent.number} is gone")
        out: dict[int, Snapshot | SnapshotError] = {}
        for p in partitions:
            found = images[self.layout.parent(p, self.parent)]
            out[p] = found if isinstance(found, SnapshotError) else \
                split(found, p, self.layout.partitions).image
        return out
