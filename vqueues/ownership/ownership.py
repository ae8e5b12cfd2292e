"""Which partitions this node serves, and their lifecycle: assign -> replay -> ready -> revoke.

`Ownership` is the group listener: it receives the group thread's events, hands them to the
event loop (`GroupInbox`), and keeps one `PartitionState` per owned partition. On assignment it
reads the partition's latest snapshot (if any) and tells the group to read the data partition
from the snapshot's position (or its beginning); while the snapshot is built into the index off
the loop (`SnapshotRestore`), the group's first fetch and the read of the same-numbered offset
partition (consumers, deletions: `OffsetReplay`) are under way. The partition serves once both
reached the end seen at assignment and its fence is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import logging
import math
import time
from collections.abc import Callable, Container, Coroutine, Sequence
from typing import Any

from vqueues import memory
from vqueues.errors import Unavailable, WrongNode
from vqueues.hashing import partition_for
from vqueues.metrics import Metrics
from vqueues.ownership.adoption import Adoption
from vqueues.ownership.cluster_map import ClusterMap, encode_claim, encode_release
from vqueues.ownership.group_inbox import GroupInbox
from vqueues.ownership.offset_replay import OffsetReplay
from vqueues.ownership.self_fence import SelfFence
from vqueues.records import Record
from vqueues.snapshot.format import SnapshotError
from vqueues.snapshot.image import Snapshot
from vqueues.snapshot.restore import SnapshotRestore
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.state.prefix_consumers import PrefixConsumers
from vqueues.storage import Consumed, Log, OffsetLog

log = logging.getLogger(__name__)

# Data records applied per loop pass (batches of them waiting at most: `GroupInbox`).
APPLY_SLICE = 500
# The group thread waits this long for snapshots to load before reading from the beginning.
SNAPSHOT_LOAD_TIMEOUT_S = 120.0
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
                 idempotency_window_ms: int = 600_000,
                 prefixes: PrefixConsumers | None = None,
                 fence: SelfFence | None = None) -> None:
        self.loop = loop
        # Refuses offset-topic writes after a pause until the group confirms (self_fence.py).
        self.fence = fence or SelfFence(math.inf)
        self.partitions = partitions
        self.idempotency_window_ms = idempotency_window_ms
        self.cache = cache
        self.node_id = node_id
        self.url = url
        self.cluster_map = cluster_map or ClusterMap(partitions)
        # The cluster's prefix consumers: from the assignment topic too (ADR 13).
        self.prefixes = prefixes or PrefixConsumers()
        self._assignment_log = assignment_log
        # Called with each partition as it becomes ready (after its replay).
        self.on_ready: list[Callable[[PartitionState], None]] = []
        self.metrics = metrics or Metrics()
        self._generation = 0
        self.draining = False
        self.states: dict[int, PartitionState] = {}
        self.failure: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.joined = False
        # The layout this node is leaving for (ADR 19): no snapshot is written any more, so
        # that each partition's final snapshot stays its last.
        self.leaving: int | None = None
        # How partitions of a grown layout take their queues over (None on layout 0).
        self.adoption: Adoption | None = None
        self._inbox = GroupInbox(loop)
        self._offsets = OffsetReplay(offset_log)
        self._snapshots = SnapshotRestore(snapshot_log, self._spawn, self._on_failed)
        self.snapshot_ids = self._snapshots.snapshot_ids  # partition -> its latest manifest
        self._assigned_at: dict[int, float] = {}
        self._spawn(self._inbox.run())

    # Thread side: called by the group thread ---------------------------------------------------

    def _post(self, event: Callable[[], None], batch: bool = False) -> None:
        self._inbox.post(event, batch)

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
            self.states[p] = PartitionState(p, self.cache, self.idempotency_window_ms,
                                            self.prefixes)
            self._assigned_at[p] = time.monotonic()
            fresh.append(p)
        self.metrics.rebalances.inc(len(fresh))
        self._generation = max(self._generation, self.cluster_map.generation) + 1
        log.info("partitions_assigned", extra={"partitions": fresh,
                                               "generation": self._generation})
        claims = [encode_claim(p, self.node_id, self.url, self._generation,
                               self.cluster_map.layout) for p in fresh]
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
        found: dict[int, Snapshot] = {}
        read_ms: dict[int, float] = {}
        restoring = self._inbox.hold()
        try:
            try:
                started = time.monotonic()
                found = await self._snapshots.latest(states, self._read_snapshots)
                read_ms = dict.fromkeys(found, (time.monotonic() - started) * 1000)
            finally:
                with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled
                    starts.set_result({p: image.data_position for p, image in found.items()})
            if starts.cancelled():
                found = {}  # the group gave up waiting and reads from the beginning
            reading = self.loop.create_task(self._offsets.read(
                states, {p: image.offsets_position for p, image in found.items()}))
            for p, image in (found | await self._adopted(states, found, read_ms)).items():
                if not await self._snapshots.restore(p, states[p], image, read_ms[p]):
                    del states[p]  # never served: its records below the position are missing
        finally:
            self._inbox.release(restoring)
        await self._offsets.replay(states, await reading, lambda: self._generation,
                                   self._log_if_ready)

    async def _adopted(self, states: dict[int, PartitionState], found: dict[int, Snapshot],
                       read_ms: dict[int, float]) -> dict[int, Snapshot]:
        """The images of the partitions without a snapshot of their own, cut out of their
        parents' final snapshots (ADR 19); a partition whose parent's cannot be read is
        dropped from `states` and reported: it must not serve without its queues."""
        missing = [p for p in states if p not in found]
        if self.adoption is None or not missing:
            return {}
        started = time.monotonic()
        images = await asyncio.to_thread(self.adoption.read, missing)
        out: dict[int, Snapshot] = {}
        for p, image in images.items():
            if isinstance(image, SnapshotError):
                log.error("adoption_failed", extra={"partition": p, "error": str(image)})
                self._on_failed(f"partition {p} cannot take its queues over: {image}")
                del states[p]
                continue
            out[p] = image
            read_ms[p] = (time.monotonic() - started) * 1000
            log.info("partition_adopted", extra={
                "partition": p, "layout": self.adoption.layout.number,
                "parent": self.adoption.layout.parent(p, self.adoption.parent),
                "queues": len(image.names), "records": image.records})
        return out

    def _read_snapshots(self, partitions: list[int]
                        ) -> dict[int, Snapshot | SnapshotError | None]:
        """The partitions' latest complete snapshots (blocking; `SnapshotRestore.read`)."""
        return self._snapshots.read(partitions)

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

    async def _release_memory(self) -> None:
        await asyncio.to_thread(memory.release_free_memory)

    async def give_up(self, partitions: list[int]) -> None:
        """Drop partitions this node cut (ADR 19) as a revocation does, releasing them in the
        map; the group keeps them assigned until the node leaves it."""
        await self._revoke(partitions, lost=False)

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
        releases = [encode_release(p, self.node_id, self._generation, self.cluster_map.layout)
                    for p in partitions]
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
        """Free revoked partitions' indexes a step per loop pass, once the requests that still
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
                # them), or full collections stall the loop (ADR 15).
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
            for listener in self.on_ready:
                listener(state)
            # A replay frees a lot of short-lived memory: hand it back to the system.
            self._spawn(self._release_memory())
            log.info("partition_ready", extra={
                "partition": state.partition, "queues": len(state.queues),
                "next_offset": state.next_offset,
                "replay_ms": round((time.monotonic() - started) * 1000)})
        elif started is not None:
            self._assigned_at[state.partition] = started

    async def announce(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Write records to the assignment topic (cluster-wide definitions: ADR 13) and apply
        them here at once; every node applies them from its tail."""
        if self._assignment_log is None:
            raise Unavailable("broker_error", "this node writes no assignment topic")
        await self._assignment_log.append(0, [(k, v, None) for k, v in records])
        self.prefixes.apply(records)

    # Queries ---------------------------------------------------------------------------------

    def require(self, partition: int) -> PartitionState:
        """The ready state of `partition`; else 409 wrong_node naming the owner, or 503 while
        no owner is known (a rebalance under way): a 409 always has an owner to follow."""
        state = self.states.get(partition)
        if state is None:
            owner = self.cluster_map.owner(partition)
            if owner is not None and owner.node != self.node_id:
                raise WrongNode(message=f"partition {partition} is owned by {owner.url}",
                                partition=partition, owner=owner.url, owner_node=owner.node)
            raise Unavailable("partition_unavailable", f"partition {partition} has no ready "
                              "owner this node knows of (a rebalance is under way); retry "
                              "shortly", partition=partition)
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
