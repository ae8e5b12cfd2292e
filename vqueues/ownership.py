"""Which partitions this node serves, and their lifecycle: assign -> replay -> ready -> revoke.

`Ownership` is the group listener: it receives the group thread's events, hands them to the
event loop, and keeps one `PartitionState` per owned partition. On assignment it reads the
partition's latest snapshot (if any) and tells the group to read the data partition from the
snapshot's position (or its beginning); while the snapshot is built into the index off the loop,
the group's first fetch and the read of the same-numbered offset partition (consumers,
deletions) are under way. The partition serves once both reached the end seen at assignment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable, Container, Coroutine, Sequence
from typing import Any

from vqueues import memory, snapshot
from vqueues.cache import RecordCache
from vqueues.cluster_map import ClusterMap, encode_claim, encode_release
from vqueues.errors import Unavailable, WrongNode
from vqueues.hashing import partition_for
from vqueues.metrics import Metrics
from vqueues.partition_state import PartitionState
from vqueues.records import (
    OffsetEntry,
    OwnerFenced,
    Record,
    decode_offset_entry,
    encode_offset_entry,
    generation_header,
    generation_of,
)
from vqueues.storage import Consumed, Log, OffsetLog

log = logging.getLogger(__name__)

# Offset-topic entries applied per loop turn during a replay.
REPLAY_CHUNK = 5000
# Data records applied per loop turn, and batches of them waiting at most (backpressure).
APPLY_SLICE = 500
MAX_PENDING_BATCHES = 16
# The group thread waits this long for snapshots to load before reading from the beginning.
SNAPSHOT_LOAD_TIMEOUT_S = 120.0
WARM_WAIT_S = 0.05  # how often a restored partition's warming looks whether it serves yet
# A revoked partition's index is freed this long after the revocation (requests that still
# hold its state answer wrong_node by then; a read's fetch of old records takes well under).
DISMANTLE_AFTER_S = 5.0


def wait_for_starts(starts: concurrent.futures.Future[dict[int, int]], timeout_s: float,
                    partitions: Sequence[int]) -> dict[int, int]:
    """Where the loop says the group should start reading each partition, or {} (from the
    beginning) if it has not said within `timeout_s`: then `starts` is cancelled, and a
    snapshot read later is not restored. Answered just as the wait ended, the loop restores
    the snapshots, so its answer stands."""
    try:
        return starts.result(timeout=timeout_s)
    except Exception as exc:  # a timeout included: replay those partitions in full
        if not starts.cancel() and starts.done() and starts.exception() is None:
            return starts.result()
        log.warning("snapshot_load_incomplete", extra={"partitions": list(partitions),
                                                       "error": repr(exc)})
        return {}


class Ownership:
    """The group listener (thread side) and the owned partitions' registry (loop side).

    On assignment the latest complete snapshot in `snapshot_log` (when given) is loaded and the
    data partition is read from its position on; otherwise from the beginning. `offset_log` is
    replayed from the snapshot's position (or the beginning); claims and releases go to
    `assignment_log` (partition 0 of the single-partition assignment topic), when given.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, partitions: int, cache: RecordCache,
                 offset_log: OffsetLog, node_id: str = "", url: str = "",
                 cluster_map: ClusterMap | None = None,
                 assignment_log: Log | None = None,
                 metrics: Metrics | None = None,
                 snapshot_log: OffsetLog | None = None,
                 idempotency_window_ms: int = 600_000) -> None:
        self.loop = loop
        self.partitions = partitions
        self.idempotency_window_ms = idempotency_window_ms
        self.cache = cache
        self.node_id = node_id
        self.url = url
        self.cluster_map = cluster_map or ClusterMap(partitions)
        self._assignment_log = assignment_log
        self.metrics = metrics or Metrics()
        self._generation = 0
        self.draining = False
        self.states: dict[int, PartitionState] = {}
        self.failure: str | None = None
        self._offset_log = offset_log
        self._snapshot_log = snapshot_log
        self.snapshot_ids: dict[int, dict[str, int]] = {}  # partition -> its latest manifest
        self._assigned_at: dict[int, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.joined = False
        self._loop_thread = threading.get_ident()  # built on the loop's thread
        self._inbox: asyncio.Queue[tuple[Callable[[], None], bool]] = asyncio.Queue()
        # Assignments whose snapshots are being built: the group's events wait for them.
        self._restoring: set[asyncio.Future[None]] = set()
        self._room = threading.BoundedSemaphore(MAX_PENDING_BATCHES)
        self._spawn(self._apply_events())

    # Thread side: called by the group thread ---------------------------------------------------

    def _post(self, event: Callable[[], None], batch: bool = False) -> None:
        """Hand a group event to the loop, in order. A batch of records waits (blocking the
        group thread) while MAX_PENDING_BATCHES are not applied yet: a replay never piles up
        more than that in memory, and the loop is never handed more than it can take."""
        if batch and threading.get_ident() != self._loop_thread:
            while not self._room.acquire(timeout=1.0):
                if self.loop.is_closed():
                    return
        else:
            batch = False
        self.loop.call_soon_threadsafe(self._inbox.put_nowait, (event, batch))

    async def _apply_events(self) -> None:
        """Apply the group's events one by one, yielding to the loop between them (and within
        a large batch), so requests are served while a partition replays."""
        while True:
            event, batch = await self._inbox.get()
            while self._restoring:  # the tail's records come after the snapshot they follow
                await asyncio.wait(self._restoring)
            try:
                event()
            except Exception:
                log.exception("group_event_failed")
            finally:
                if batch:
                    self._room.release()
            await asyncio.sleep(0)

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        """Take the partitions; block until their snapshots are read and return where the
        group should start reading each (no entry: from the beginning)."""
        starts: concurrent.futures.Future[dict[int, int]] = concurrent.futures.Future()
        self._post(functools.partial(self._on_assigned, list(partitions), starts))
        return wait_for_starts(starts, SNAPSHOT_LOAD_TIMEOUT_S, partitions)

    def revoked(self, partitions: Sequence[int], lost: bool) -> None:
        # Block the group thread until the partitions are dropped, their offset writes are
        # done and the releases are written: only then may another node take them over.
        done = asyncio.run_coroutine_threadsafe(self._revoke(list(partitions), lost), self.loop)
        try:
            done.result(timeout=20)
        except Exception as exc:  # a timeout included: the group must go on
            log.warning("revoke_incomplete", extra={"partitions": list(partitions),
                                                    "error": repr(exc)})

    def indexed(self, partition: int) -> Container[int]:
        # Read from the group thread: a membership test of a set the loop changes is safe, and
        # an offset only leaves it once the tail has passed it.
        state = self.states.get(partition)
        return state.own_indexed if state is not None else ()

    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None:
        # Decode keys here, off the loop; keyless records are not queue records.
        by_partition: dict[int, list[tuple[str, Record]]] = {}
        for p, key, rec in batch:
            try:
                queue = key.decode("utf-8") if key else None
            except UnicodeDecodeError:
                queue = None
            if queue is None:
                self.metrics.records_skipped.inc()
                continue
            by_partition.setdefault(p, []).append((queue, rec))
        # Large batches are applied in slices, each its own turn of the loop.
        for p, records in by_partition.items():
            for i in range(0, len(records), APPLY_SLICE):
                part = {p: records[i:i + APPLY_SLICE]}
                last = i + APPLY_SLICE >= len(records)
                self._post(functools.partial(
                    self._on_consumed, part, high_watermarks,
                    {p: positions[p]} if last else {p: part[p][-1][1].offset + 1}), batch=True)
        for p in positions.keys() - by_partition.keys():  # only skipped records there
            self._post(functools.partial(self._on_consumed, {}, high_watermarks,
                                         {p: positions[p]}), batch=True)

    def reached_end(self, partition: int, next_offset: int) -> None:
        self._post(functools.partial(self._on_end, partition, next_offset))

    def failed(self, error: str) -> None:
        self._post(functools.partial(self._on_failed, error))

    # Loop side -------------------------------------------------------------------------------

    def _on_assigned(self, partitions: list[int],
                     starts: concurrent.futures.Future[dict[int, int]]) -> None:
        self.joined = True
        if not partitions:
            starts.set_result({})
            return
        fresh = []
        for p in partitions:
            old = self.states.get(p)
            if old is not None:
                old.revoke()
                self._spawn(self._dismantle([old]))
            self.states[p] = PartitionState(p, self.cache, self.idempotency_window_ms)
            self._assigned_at[p] = time.monotonic()
            fresh.append(p)
        self.metrics.rebalances.inc(len(fresh))
        self._generation = max(self._generation, self.cluster_map.generation) + 1
        log.info("partitions_assigned", extra={"partitions": fresh,
                                               "generation": self._generation})
        claims = [encode_claim(p, self.node_id, self.url, self._generation) for p in fresh]
        self.cluster_map.apply(claims)  # known here at once; the tail confirms it
        self._spawn(self._announce(claims))
        self._spawn(self._start(fresh, starts))

    async def _start(self, partitions: list[int],
                     starts: concurrent.futures.Future[dict[int, int]]) -> None:
        """Read the partitions' latest snapshots and tell the group where to read from at once;
        build the index from each snapshot while the tail's first fetch and the offset
        partitions' reads are under way, then replay the offset entries after the snapshots'
        positions. The tail's records wait in the inbox until their partition is restored."""
        states = {p: self.states[p] for p in partitions}
        found: dict[int, snapshot.Snapshot] = {}
        read_ms: dict[int, float] = {}
        restoring: asyncio.Future[None] = self.loop.create_future()
        self._restoring.add(restoring)
        try:
            try:
                for p, state in states.items():
                    started = time.monotonic()
                    image = await self._read_latest(p, state)
                    if image is not None:
                        found[p] = image
                        read_ms[p] = (time.monotonic() - started) * 1000
            finally:
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled
                    starts.set_result({p: image.data_position for p, image in found.items()})
            if starts.cancelled():
                found = {}  # the group gave up waiting and reads from the beginning
            reading = self.loop.create_task(self._read_offsets(
                states, {p: image.offsets_position for p, image in found.items()}))
            for p, image in found.items():
                if not await self._restore(p, states[p], image, read_ms[p]):
                    del states[p]  # never served: its records below the position are missing
        finally:
            self._restoring.discard(restoring)
            restoring.set_result(None)
        await self._replay_offsets(states, await reading)

    async def _read_latest(self, p: int, state: PartitionState) -> snapshot.Snapshot | None:
        """Partition p's latest complete snapshot, or None (no snapshot log, none yet, or one
        that is unusable: logged)."""
        if self._snapshot_log is None:
            return None
        try:
            found = await asyncio.to_thread(self._read_snapshot, p)
        except snapshot.SnapshotError as exc:
            log.warning("snapshot_ignored", extra={"partition": p, "error": str(exc)})
            return None
        except Exception as exc:
            log.warning("snapshot_unreadable", extra={"partition": p, "error": repr(exc)})
            return None
        return None if state.revoked else found

    async def _restore(self, p: int, state: PartitionState, found: snapshot.Snapshot,
                       read_ms: float) -> bool:
        """Fill `state` from `found`, built off the loop; False if it could not be built. The
        group already reads from the snapshot's position, so such a partition must not serve
        (its records below that position would be missing): the node reports the failure.
        `latest` checked every column already: only a lack of memory should get here."""
        started = time.monotonic()
        try:
            built = await asyncio.to_thread(snapshot.build, found)
        except Exception as exc:
            log.exception("snapshot_build_failed", extra={"partition": p})
            self._on_failed(f"partition {p}: its snapshot could not be built: {exc!r}")
            return False
        build_ms = (time.monotonic() - started) * 1000
        if state.revoked:
            return True
        # No await from here to the restore: the tail's records (applied on this loop once
        # `_restoring` is done) can only come after it.
        snapshot.restore(state, found, built)
        self._spawn(self._warm(state))
        log.info("snapshot_loaded", extra={
            "partition": p, "queues": len(found.names), "records": found.records,
            "data_position": found.data_position, "offsets_position": found.offsets_position,
            "read_ms": round(read_ms), "build_ms": round(build_ms),
            "load_ms": round(read_ms + build_ms)})
        return True

    async def _warm(self, state: PartitionState) -> None:
        """Once a restored partition serves, build its queues still in the snapshot's columns
        a shard per loop turn (`QueueMap.warm_next`), so the columns are freed; the replay
        and requests meanwhile build the queues they touch. Not before it serves: the turns
        slowed the replay of the records after the snapshot (100,000 of them: by 0.8 s,
        measured)."""
        while not state.ready.is_set() and not state.revoked:
            await asyncio.sleep(WARM_WAIT_S)
        started, queues = time.monotonic(), state.queues
        cold = queues.cold
        while not state.revoked and queues is state.queues and queues.warm_next():
            await asyncio.sleep(0)
        log.info("snapshot_warmed", extra={
            "partition": state.partition, "queues": cold, "revoked": state.revoked,
            "ms": round((time.monotonic() - started) * 1000)})

    def _read_snapshot(self, p: int) -> snapshot.Snapshot | None:
        assert self._snapshot_log is not None
        entries, _end = self._snapshot_log.read_to_end([p])[p]
        records = [(k, v) for k, v, _ in entries]
        manifest = snapshot.manifest_of(records, p)
        if manifest is not None:
            self.snapshot_ids[p] = manifest
        return snapshot.latest(p, records)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _announce(self, records: list[tuple[bytes, bytes]]) -> None:
        if self._assignment_log is None or not records:
            return
        for attempt in range(1, 6):
            try:
                await self._assignment_log.append(0, [(k, v, None) for k, v in records])
                return
            except Exception as exc:
                log.warning("assignment_write_failed", extra={"attempt": attempt,
                                                              "error": str(exc)})
                await asyncio.sleep(0.2 * attempt)

    async def _read_offsets(self, states: dict[int, PartitionState], starts: dict[int, int]
                            ) -> dict[int, tuple[list[tuple[int, OffsetEntry]], int]]:
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

    async def _replay_offsets(self, states: dict[int, PartitionState],
                              entries: dict[int, tuple[list[tuple[int, OffsetEntry]], int]]
                              ) -> None:
        """Apply the offset entries read on the loop, in chunks (no long stall); then fence
        and serve each partition once its data is replayed too."""
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
                await self._fence(state)
                if state.revoked:
                    continue
                state.mark_offsets_replayed()
                self._log_if_ready(state)

    async def _fence(self, state: PartitionState) -> None:
        """Write this owner's fence to the offset partition before serving: from here on,
        entries of an older owner (a zombie that lost the partition but still writes) are
        ignored by every replay, and every write of ours carries the new generation."""
        generation = max(state.fence + 1, self._generation)
        key, value = encode_offset_entry(OwnerFenced(generation))
        for attempt in itertools.count(1):
            try:
                delivered = await self._offset_log.append(
                    state.partition, [(key, value, generation_header(generation))])
                break
            except Exception as exc:
                log.warning("fence_write_failed", extra={"partition": state.partition,
                                                         "attempt": attempt, "error": str(exc)})
                await asyncio.sleep(min(5.0, 0.2 * attempt))
                if state.revoked:
                    return
        state.fence = state.generation = generation
        state.offsets_position = max(state.offsets_position, delivered[-1][0] + 1)

    def _read_entries(self, partitions: list[int], starts: dict[int, int]
                      ) -> dict[int, tuple[list[tuple[int, OffsetEntry]], int]]:
        out: dict[int, tuple[list[tuple[int, OffsetEntry]], int]] = {}
        for p, (records, end) in self._offset_log.read_to_end(partitions, starts).items():
            decoded = ((generation_of(h), decode_offset_entry(k, v)) for k, v, h in records)
            out[p] = ([(g, e) for g, e in decoded if e is not None], end)
        return out

    async def _release_memory(self) -> None:
        await asyncio.to_thread(memory.release_free_memory)

    async def _revoke(self, partitions: list[int], lost: bool) -> None:
        gone = []
        for p in partitions:
            state = self.states.pop(p, None)
            if state is not None:
                state.revoke()  # new requests for p get wrong_node from here on
                gone.append(state)
        for state in gone:
            if not await state.wait_writes(5.0):
                log.warning("revoke_writes_pending", extra={"partition": state.partition})
        releases = [encode_release(p, self.node_id, self._generation) for p in partitions]
        self.cluster_map.apply(releases)
        try:
            await asyncio.wait_for(self._announce(releases), 5.0)
        except TimeoutError:
            log.warning("release_not_written", extra={"partitions": partitions})
        self.metrics.revocations.labels(lost=str(lost).lower()).inc(len(gone))
        log.info("partitions_revoked", extra={"partitions": partitions, "lost": lost})
        if gone:
            self._spawn(self._dismantle(gone))

    async def _dismantle(self, states: list[PartitionState]) -> None:
        """Free revoked partitions' indexes a step per loop turn, once the requests that still
        hold their states (they answer wrong_node) are done, then hand the memory back."""
        await asyncio.sleep(DISMANTLE_AFTER_S)
        for state in states:
            for _ in state.dismantle():
                await asyncio.sleep(0)
        await self._release_memory()

    def _on_consumed(self, by_partition: dict[int, list[tuple[str, Record]]],
                     high_watermarks: dict[int, int], positions: dict[int, int]) -> None:
        for p, position in positions.items():
            state = self.states.get(p)
            if state is None:
                continue
            # A record another partitioner put here is not served: its queue lives elsewhere.
            ok = []
            served = None  # the last queue found served here: a run of its records is checked once
            for queue, rec in by_partition.get(p, ()):
                if queue != served:
                    if queue not in state.queues and partition_for(queue, self.partitions) != p:
                        self.metrics.records_skipped.inc()
                        continue
                    served = queue
                ok.append((queue, rec))
            was_ready = state.ready.is_set()
            state.apply_records(ok, high_watermarks.get(p))
            state.skip_to(position)
            if not was_ready:
                # A replay builds a long-lived index: keep it out of the collector's scans as
                # it grows (gc.freeze is O(1); the objects hold no cycles, refcounting frees
                # them), or full collections stall the loop for up to a second (measured).
                gc.freeze()
                self._log_if_ready(state)

    def _on_end(self, partition: int, next_offset: int) -> None:
        state = self.states.get(partition)
        if state is not None:
            state.reached_end(next_offset)
            self._log_if_ready(state)

    def _on_failed(self, error: str) -> None:
        self.failure = error
        log.error("group_failed", extra={"error": error})

    def _log_if_ready(self, state: PartitionState) -> None:
        started = self._assigned_at.pop(state.partition, None)
        if state.ready.is_set() and started is not None:
            self.metrics.replay_seconds.observe(time.monotonic() - started)
            # A replay frees a lot of short-lived memory: hand it back to the system.
            self._spawn(self._release_memory())
            log.info("partition_ready", extra={
                "partition": state.partition, "queues": len(state.queues),
                "next_offset": state.next_offset,
                "replay_ms": round((time.monotonic() - started) * 1000)})
        elif started is not None:
            self._assigned_at[state.partition] = started

    # Queries ---------------------------------------------------------------------------------

    def require(self, partition: int) -> PartitionState:
        """The ready state of `partition`, or WrongNode (409) / Unavailable (503)."""
        state = self.states.get(partition)
        if state is None:
            owner = self.cluster_map.owner(partition)
            if owner is not None and owner.node != self.node_id:
                raise WrongNode(message=f"partition {partition} is owned by {owner.url}",
                                partition=partition, owner=owner.url, owner_node=owner.node)
            raise WrongNode(message=f"partition {partition} is not owned by this node; "
                                    "its owner is not known yet", partition=partition,
                            owner=None)
        if not state.ready.is_set():
            raise Unavailable("partition_replaying",
                              f"partition {partition} is still being replayed; retry shortly",
                              partition=partition)
        return state

    @property
    def ready(self) -> bool:
        """Joined the group and every owned partition is ready."""
        return self.joined and all(s.ready.is_set() for s in self.states.values())

    def drain(self) -> None:
        """Shutting down: parked readers answer now, and no read parks any more."""
        self.draining = True
        for state in self.states.values():
            state.wake_all()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for p in list(self.states):
            self.states.pop(p).revoke()
