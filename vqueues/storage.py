"""The seams between the queue rules and Kafka: what the service and the ownership lifecycle need
of the data log, the offset log and the record fetcher, as Protocols.

`vqueues/kafka/` implements them on confluent-kafka; the unit tests implement them in memory
(tests/unit/fakes.py). Nothing above this seam imports the Kafka adapter's classes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Container, Sequence
from typing import Protocol

from vqueues.records import Record

# Past this many unwanted records between two wanted ones, seeking beats reading through.
SEEK_GAP = 256

# (key, value, headers) of one record to write.
Outgoing = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes]] | None]
# (offset, timestamp) the broker gave one written record; (-1, -1) when unknown (acks=0).
Delivered = tuple[int, int]
# (key, value, headers) of one record read back from a log.
Entry = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
# (partition, key, record) of one data record the group's tail consumed.
Consumed = tuple[int, bytes | None, Record]


class GroupListener(Protocol):
    """What the group member reports, from its own thread (the ownership lifecycle's input).

    `consumed` gets the batch's records, the high watermarks the fetches carried, and the next
    offset the tail will read per partition of the batch (`positions`). Records at the offsets
    `indexed(partition)` lists are already indexed (own writes) and may be left out of `batch`.
    """

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        """Blocking: take the partitions; return where to start reading each (absent: from
        the beginning), e.g. a loaded snapshot's position."""
        ...

    def revoked(self, partitions: Sequence[int], lost: bool) -> None: ...
    def indexed(self, partition: int) -> Container[int]: ...
    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None: ...
    def reached_end(self, partition: int, next_offset: int) -> None: ...
    def failed(self, error: str) -> None: ...


class Fence(Protocol):
    """What the group member needs of the self-fence (`self_fence.SelfFence`): whether a
    pause was seen since the group last confirmed, its epoch, and the confirmation."""

    epoch: int
    suspect: bool

    def confirmed(self, epoch: int) -> None: ...


class Submitter(Protocol):
    """What the offset writer needs of a log: submitting writes in order."""

    def submit(self, partition: int, records: Sequence[Outgoing]
               ) -> Awaitable[list[Delivered]]:
        """`Log.append`, with the records handed to the producer before this returns: writes
        submitted one after another reach the partition in that order."""
        ...


class Log(Submitter, Protocol):
    """A topic the node writes to, by explicit partition."""

    async def append(self, partition: int, records: Sequence[Outgoing]) -> list[Delivered]:
        """Write `records` in order; return each one's (offset, timestamp) once acknowledged."""
        ...


class OffsetLog(Log, Protocol):
    """A compacted topic written by the partition's owner and read back on assignment (the
    offset topic, the snapshot topic)."""

    def read_to_end(self, partitions: Sequence[int], starts: dict[int, int] | None = None
                    ) -> dict[int, tuple[list[Entry], int]]:
        """Blocking: every (key, value, headers) of `partitions` from `starts` (default: the
        beginning)
        to their end, and the offset of that end."""
        ...


class RecordFetcher(Protocol):
    """Reads data records by offset: how a read reaches records older than the cache."""

    def fetch(self, partition: int, offsets: Sequence[int]) -> dict[int, Record]:
        """Blocking: the records at `offsets` (ascending) that still exist."""
        ...

    def high_watermark(self, partition: int) -> int:
        """Blocking: the broker's end of `partition` (may be low on tansu: ADR 3)."""
        ...

    def log_start(self, partition: int) -> int:
        """Blocking: the first offset `partition` still holds (retention moves it up)."""
        ...


def runs(offsets: Sequence[int], gap: int = SEEK_GAP) -> list[list[int]]:
    """Split ascending offsets where two neighbours are more than `gap` apart: a fetcher reads
    each run straight through, and runs can be read side by side."""
    out: list[list[int]] = []
    for off in offsets:
        if out and off - out[-1][-1] <= gap:
            out[-1].append(off)
        else:
            out.append([off])
    return out
