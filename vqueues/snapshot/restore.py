"""Restoring an assigned partition from its latest snapshot (ADR 7): read it off the loop,
build the index off the loop, hand it to the partition's state, and once the partition serves,
build its remaining cold queues a shard per loop pass."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from vqueues.records import now_ms
from vqueues.snapshot import build, wire
from vqueues.snapshot.format import SnapshotError
from vqueues.snapshot.image import Snapshot
from vqueues.state.idempotency import IdempotencyWindow
from vqueues.state.partition_state import PartitionState
from vqueues.storage import OffsetLog

log = logging.getLogger(__name__)

WARM_WAIT_S = 0.05  # how often a restored partition's warming looks whether it serves yet


class SnapshotRestore:
    """Reads snapshots from `snapshot_log` and restores partitions from them. `spawn` runs a
    background task; `fail` reports a partition that cannot serve."""

    def __init__(self, snapshot_log: OffsetLog | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 fail: Callable[[str], None]) -> None:
        self._snapshot_log = snapshot_log
        self._spawn = spawn
        self._fail = fail
        self.snapshot_ids: dict[int, dict[str, int]] = {}  # partition -> its latest manifest

    def read(self, partitions: Sequence[int]
             ) -> dict[int, Snapshot | SnapshotError | None]:
        """The partitions' latest complete snapshots (blocking: off the loop), read together:
        one client for all of them, so the first partition does not wait for the others'
        clients to connect one after another. A partition
        whose snapshot is unusable gets its error."""
        assert self._snapshot_log is not None
        read = self._snapshot_log.read_to_end(partitions)
        out: dict[int, Snapshot | SnapshotError | None] = {}
        for p in partitions:
            records = [(k, v) for k, v, _ in read[p][0]]
            manifest = wire.manifest_of(records, p)
            if manifest is not None:
                self.snapshot_ids[p] = manifest
            try:
                out[p] = wire.latest(p, records)
            except SnapshotError as exc:
                out[p] = exc
        return out

    async def latest(self, states: dict[int, PartitionState],
                     read: Callable[[list[int]], dict[int, Snapshot
                                                      | SnapshotError | None]]
                     ) -> dict[int, Snapshot]:
        """The latest complete snapshot of each partition that has a usable one, through
        `read` (run off the loop); none when there is no snapshot log or it cannot be read
        (logged): those partitions replay from the beginning."""
        if self._snapshot_log is None or not states:
            return {}
        try:
            found = await asyncio.to_thread(read, list(states))
        except Exception as exc:
            log.warning("snapshot_unreadable", extra={"partitions": list(states),
                                                      "error": repr(exc)})
            return {}
        out: dict[int, Snapshot] = {}
        for p, image in found.items():
            if isinstance(image, SnapshotError):
                log.warning("snapshot_ignored", extra={"partition": p, "error": str(image)})
            elif image is not None and not states[p].revoked:
                out[p] = image
        return out

    async def restore(self, p: int, state: PartitionState, found: Snapshot,
                      read_ms: float) -> bool:
        """Fill `state` from `found`, built off the loop; False if it could not be built. The
        group already reads from the snapshot's position, so such a partition must not serve
        (its records below that position would be missing): the node reports the failure.
        `latest` checked every column already: only a lack of memory should get here."""
        started = time.monotonic()
        try:
            built = await asyncio.to_thread(build.build, found)
            window = await asyncio.to_thread(IdempotencyWindow.restore,
                                             state.idempotency.window_ms, found.keys, now_ms())
        except Exception as exc:
            log.exception("snapshot_build_failed", extra={"partition": p})
            self._fail(f"partition {p}: its snapshot could not be built: {exc!r}")
            return False
        build_ms = (time.monotonic() - started) * 1000
        if state.revoked:
            return True
        # No await from here to the restore: the tail's records (applied on the loop once the
        # inbox is released) can only come after it.
        build.restore(state, found, built, window)
        self._spawn(self.warm(state))
        log.info("snapshot_loaded", extra={
            "partition": p, "queues": len(found.names), "records": found.records,
            "keys": len(window),
            "data_position": found.data_position, "offsets_position": found.offsets_position,
            "read_ms": round(read_ms), "build_ms": round(build_ms),
            "load_ms": round(read_ms + build_ms)})
        return True

    async def warm(self, state: PartitionState) -> None:
        """Once a restored partition serves, build its queues still in the snapshot's columns
        a shard per loop pass (`QueueMap.warm_next`), so the columns are freed; the replay
        and requests meanwhile build the queues they touch. Not before it serves: the turns
        would slow the replay of the records after the snapshot (ADR 7)."""
        # Polled: a revocation is a flag, not an event, and ends the wait as well.
        while not state.ready.is_set() and not state.revoked:  # noqa: ASYNC110
            await asyncio.sleep(WARM_WAIT_S)
        started, queues = time.monotonic(), state.queues
        cold = queues.cold
        # A yield, not a wait: one shard per loop pass.
        while not state.revoked and queues is state.queues and queues.warm_next():  # noqa: ASYNC110
            await asyncio.sleep(0)
        log.info("snapshot_warmed", extra={
            "partition": state.partition, "queues": cold, "revoked": state.revoked,
            "ms": round((time.monotonic() - started) * 1000)})
