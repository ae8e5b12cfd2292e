"""A partition's offset-topic entries written: durably and then applied (`write`), or applied at
once and durable later (`submit`, for lease state: ADR 8, ADR 12). Every offset-topic write of a
node goes through one `EntryWriter`, whose `OffsetWriter` groups concurrent writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from typing import Any

from vqueues.queues.offset_writer import OffsetWriter
from vqueues.records import OffsetEntry, outgoing
from vqueues.state.partition_state import PartitionState
from vqueues.storage import Delivered, Submitter


class EntryWriter:
    """Writes partitions' offset-topic entries, in the order they were submitted."""

    def __init__(self, offset_log: Submitter) -> None:
        self._writer = OffsetWriter(offset_log)

    @property
    def writes(self) -> int:
        """Produce submissions made (a figure for tests and benchmarks)."""
        return self._writer.writes

    async def write(self, state: PartitionState, entries: Sequence[OffsetEntry]
                            ) -> None:
        """Write entries to the offset topic (acks=all), then apply them unless the partition
        was revoked meanwhile: the next owner replays them instead. A revocation waits for
        writes in flight, so the next owner's replay sees every write this node answered."""
        state.refuse_if_cutting()  # a cut's final snapshot must hold every write answered
        with state.writes.writing():
            delivered = await self._writer.submit(state.partition,
                                                  outgoing(state.generation, entries))
            if not state.revoked:
                state.apply_offset_entries(entries)
                state.offsets_position = max(state.offsets_position, delivered[-1][0] + 1)

    def submit(self, state: PartitionState, entries: Sequence[OffsetEntry],
               applied: bool = False) -> PendingWrite:
        """Queue entries for the offset topic now (so writes keep the order their callers
        took, under a lock; `OffsetWriter` groups them) and apply them at once, unless the
        caller did (`applied`); await the returned write to know they are durable, or leave it
        `behind`. For lease state, where concurrent workers must see each other's changes
        before the writes come back (ADR 8, ADR 12)."""
        state.refuse_if_cutting()
        state.writes.begin()
        try:
            pending = self._writer.submit(state.partition, outgoing(state.generation, entries))
        except BaseException:
            state.writes.end()
            raise
        if not applied:
            state.apply_offset_entries(entries)
        return PendingWrite(state, pending)


class PendingWrite:
    """A submitted write: awaited once (durable, or its failure raised), or left `behind`."""

    __slots__ = ("_pending", "_state")

    def __init__(self, state: PartitionState, pending: asyncio.Future[list[Delivered]]
                 ) -> None:
        self._state = state
        self._pending = pending

    def __await__(self) -> Generator[Any, None, None]:
        return self._durable().__await__()

    async def _durable(self) -> None:
        try:
            self._written(await self._pending)
        finally:
            self._state.writes.end()

    def behind(self, failed: Callable[[BaseException], None]) -> None:
        """Finish without a waiter (no task: a callback when the broker answers); `failed`
        is called with the error if the write fails."""
        def done(fut: asyncio.Future[list[Delivered]]) -> None:
            try:
                exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
                if exc is None:
                    self._written(fut.result())
                else:
                    failed(exc)
            finally:
                self._state.writes.end()
        self._pending.add_done_callback(done)

    def _written(self, delivered: list[Delivered]) -> None:
        state = self._state
        state.offsets_position = max(state.offsets_position, delivered[-1][0] + 1)
