"""Replaying an owned partition's offset-topic entries (consumers, deletions, lease state) on
assignment, and fencing the partition before it serves (ADR 2, ADR 8).

Entries are read and decoded off the loop, applied on it in chunks, and followed by this
owner's fence: from then on every replay ignores what an older owner (a zombie) writes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from vqueues.records import (
    OffsetEntry,
    OwnerFenced,
    decode_offset_entry,
    generation_of,
    outgoing,
)
from vqueues.state.partition_state import PartitionState
from vqueues.state.window_writes import takeover_checkpoints
from vqueues.storage import OffsetLog

log = logging.getLogger(__name__)

# Offset-topic entries applied per loop pass during a replay.
REPLAY_CHUNK = 5000

Entries = dict[int, tuple[list[tuple[int, OffsetEntry]], int]]


class OffsetReplay:
    """Reads, applies and fences the offset partitions of assigned data partitions."""

    def __init__(self, offset_log: OffsetLog) -> None:
        self._offset_log = offset_log

    async def read(self, states: dict[int, PartitionState], starts: dict[int, int]) -> Entries:
        """The offset partitions' entries from `starts` (or their beginning) to their end,
        read and decoded off the loop, retried until read or every partition is revoked."""
        partitions = list(states)
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.to_thread(self._read_entries, partitions, starts)
            except Exception as exc:
                log.warning("offset_replay_failed", extra={"partitions": partitions,
                                                           "attempt": attempt, "error": str(exc)})
                await asyncio.sleep(min(5.0, 0.2 * attempt))
                if all(s.revoked for s in states.values()):
                    return {}

    def _read_entries(self, partitions: list[int], starts: dict[int, int]) -> Entries:
        out: Entries = {}
        for p, (records, end) in self._offset_log.read_to_end(partitions, starts).items():
            decoded = ((generation_of(h), decode_offset_entry(k, v)) for k, v, h in records)
            out[p] = ([(g, e) for g, e in decoded if e is not None], end)
        return out

    async def replay(self, states: dict[int, PartitionState], entries: Entries,
                     generation: Callable[[], int],
                     replayed: Callable[[PartitionState], None]) -> None:
        """Apply the entries read, in chunks (no long stall); then fence each partition with
        at least this owner's `generation()` as it is then, and tell `replayed`. A partition's
        fence is written as soon as its entries are applied, beside the other partitions',
        so the last partition does not wait for every fence before it."""
        fencing: list[asyncio.Task[None]] = []
        try:
            for p, state in states.items():
                if state.revoked:
                    continue
                todo, end = entries.get(p, ([], 0))
                for i in range(0, len(todo), REPLAY_CHUNK):
                    if state.revoked:
                        break
                    state.apply_logged(todo[i:i + REPLAY_CHUNK])
                    await asyncio.sleep(0)
                if not state.revoked:
                    state.offsets_position = max(state.offsets_position, end)
                    if state.fenced_entries:
                        log.warning("fenced_entries_ignored", extra={
                            "partition": p, "entries": state.fenced_entries})
                    fencing.append(asyncio.create_task(
                        self._fence_then_serve(state, generation, replayed)))
            await asyncio.gather(*fencing)
        finally:
            for task in fencing:  # cancelled with the replay: so are its fences
                task.cancel()

    async def _fence_then_serve(self, state: PartitionState, generation: Callable[[], int],
                                replayed: Callable[[PartitionState], None]) -> None:
        await self.fence(state, generation())
        if not state.revoked:
            state.mark_offsets_replayed()
            replayed(state)

    async def fence(self, state: PartitionState, generation: int) -> None:
        """Write this owner's fence (`generation`, or above the partition's last) to the offset
        partition before serving: from here on,
        entries of an older owner (a zombie that lost the partition but still writes) are
        ignored by every replay, and every write of ours carries the new generation.

        In the same write, every lease window rebuilt from an older owner's window keys is
        checkpointed under this owner's (ADR 12): a zombie may still tombstone or overwrite
        its own keys, and compaction would then take away what this owner's state stands
        on."""
        generation = max(state.fence + 1, generation)
        state.generation = generation
        records = outgoing(generation, [OwnerFenced(generation), *takeover_checkpoints(state)])
        for attempt in itertools.count(1):
            try:
                delivered = await self._offset_log.append(state.partition, records)
                break
            except Exception as exc:
                log.warning("fence_write_failed", extra={"partition": state.partition,
                                                         "attempt": attempt, "error": str(exc)})
                await asyncio.sleep(min(5.0, 0.2 * attempt))
                if state.revoked:
                    return
        state.fence = state.generation = generation
        state.offsets_position = max(state.offsets_position, delivered[-1][0] + 1)
