"""A snapshot in memory: a partition's index, column by column (`Snapshot`)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from vqueues.snapshot.columns import decode_offsets
from vqueues.state.idempotency import KeySection
from vqueues.state.lease_windows import ConfigRow, WindowRow


@dataclass(slots=True)
class Snapshot:
    """A partition's index, column by column: queue i is `names[i]`, with `counts[i]` offsets
    (the next ones in `offsets`), deletion floor `deleted[i]`; consumers are
    (queue index, consumer, committed offset, last ack at)."""

    partition: int
    data_position: int  # P: every record below it is in the snapshot
    offsets_position: int  # O: every offset-topic entry below it is in the snapshot
    log_start: int
    names: list[str] = field(default_factory=list)
    counts: array[int] = field(default_factory=lambda: array("q"))
    deleted: array[int] = field(default_factory=lambda: array("q"))
    offsets: array[int] = field(default_factory=lambda: array("q"))
    consumers: list[tuple[int, str, int, int]] = field(default_factory=list)
    fence: int = 0
    configs: list[ConfigRow] = field(default_factory=list)  # `LeaseWindows.capture`'s
    windows: list[WindowRow] = field(default_factory=list)
    # (queue, tag, offsets as raw int64): the tag index below the cut
    tags: list[tuple[str, str, bytes]] = field(default_factory=list)
    # (queue, id, due): records waiting for their due time, below the cut
    scheduled: list[tuple[str, int, int]] = field(default_factory=list)
    # The idempotency window's keys of records below the cut (format 5)
    keys: KeySection = field(default_factory=KeySection.empty)
    # A loaded snapshot keeps its offsets encoded (`encode_offsets`), and `offsets` empty, until
    # `build` decodes them straight into the queues.
    column: bytes | memoryview | None = None
    # A captured snapshot's offsets, in the slices the capture copied them in (after `offsets`),
    # joined off the loop by `decoded_offsets`: one array grown on the loop would stall it at
    # each reallocation.
    pieces: list[array[int]] = field(default_factory=list)

    @property
    def records(self) -> int:
        if self.column is not None or self.pieces:
            return sum(self.counts)
        return len(self.offsets)

    def decoded_offsets(self) -> array[int]:
        """Every queue's offsets, in queue order (decoded if the snapshot was loaded, joined
        if it was captured; blocking for millions of them: off the loop)."""
        parts = self.offset_parts()
        if len(parts) == 1:
            return parts[0]
        out = array("q", [0]) * sum(map(len, parts))
        flat = np.frombuffer(out, dtype=np.int64)
        at = 0
        for part in parts:
            flat[at:at + len(part)] = np.frombuffer(part, dtype=np.int64)
            at += len(part)
        return out

    def offset_parts(self) -> list[array[int]]:
        """Every queue's offsets, in queue order, in parts (blocking if the snapshot was
        loaded: off the loop)."""
        if self.column is not None:
            return [decode_offsets(self.column, self.counts)]
        return [self.offsets, *self.pieces]

