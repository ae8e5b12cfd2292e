"""Upkeep of the owned partitions, off the request path: the index follows retention, idle
consumers expire, and partitions are snapshotted (ADR 7). Each pass works one shard of a
partition's queue map per loop pass, so a million queues never stall the loop."""

from __future__ import annotations

import asyncio
import gc
import heapq
import logging
import secrets
import time
from dataclasses import dataclass

from vqueues import memory
from vqueues.metrics import Metrics
from vqueues.ownership.ownership import Ownership
from vqueues.queues.service import QueueService
from vqueues.records import now_ms
from vqueues.settings import Settings
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import chunk_key, final_manifest_key, manifest_key
from vqueues.snapshot.wire import encode
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_map import QUEUE_SHARDS
from vqueues.storage import Log

log = logging.getLogger(__name__)

# Consumers exported by vq_consumer_lag_top (the furthest behind on this node).
TOP_LAGS = 10
# How often the loop's lag is sampled (a timer the loop runs late shows a blocked loop).
LOOP_LAG_EVERY_S = 0.05
# How often the collector's tracked objects are counted (about 1 ms per 100,000 of them).
GC_CHECK_S = 1.0
# Idle consumers expired at once: their tombstones share offset-topic writes (`OffsetWriter`),
# where one consumer after the other waited for a write each.
EXPIRE_AT_ONCE = 256


@dataclass(frozen=True, slots=True)
class _Kept:
    """What a whole retention pass over a partition found, so a pass that would find nothing
    is not made: with many queues the walks hold the loop (ADR 15). The next pass walks for
    retention only if
    the log start moved (or the tail was below it), and for idle consumers only once the
    oldest last ack seen can have passed the retention."""

    state: PartitionState
    log_start: int  # what the pass trimmed to
    tail: int  # the partition's tail offset when it began
    oldest_ack: int | None  # no consumer's last ack was older (None: not walked)


class Maintenance:
    def __init__(self, settings: Settings, ownership: Ownership, service: QueueService,
                 snapshot_log: Log | None = None) -> None:
        self.settings = settings
        self.ownership = ownership
        self.service = service
        self.metrics: Metrics = ownership.metrics
        self._snapshots = snapshot_log
        # Per partition: the data position of its last snapshot (written or loaded).
        self._snapshot_at: dict[int, int] = {}
        # The consumers furthest behind, as of the last pass (vq_consumer_lag_top).
        self.top_lags: list[tuple[int, str, str]] = []
        # Per partition, what its last whole pass found (`_Kept`): the next pass skips the
        # walks that cannot find anything.
        self._kept: dict[int, _Kept] = {}
        self.metrics.lag_source = lambda: self.top_lags
        self.freezer = memory.Freezer(settings.gc_freeze_objects)

    def start(self) -> list[asyncio.Task[None]]:
        """The periodic passes, as tasks the node cancels when it stops."""
        tasks = [asyncio.create_task(self.retention_forever()),
                 asyncio.create_task(self.loop_lag_forever())]
        if self.settings.gc_freeze_objects:
            tasks.append(asyncio.create_task(self.gc_forever()))
        if self._snapshots is not None:
            tasks.append(asyncio.create_task(self.snapshot_forever()))
        return tasks

    # The loop's own latency ----------------------------------------------------------------------

    async def loop_lag_forever(self, every_s: float = LOOP_LAG_EVERY_S) -> None:
        """How late the loop runs a timer, every `every_s`: a loop blocked by long work delays
        every request by as much (vq_event_loop_lag_seconds; its worst in ..._max_seconds)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + every_s
            await asyncio.sleep(every_s)
            self.metrics.observe_loop_lag(max(0.0, loop.time() - due))

    # The collector -------------------------------------------------------------------------------

    async def gc_forever(self, every_s: float = GC_CHECK_S) -> None:
        """Every `every_s`: keep collections short (`memory.Freezer`)."""
        while True:
            await asyncio.sleep(every_s)
            self.freeze_long_lived()

    def freeze_long_lived(self) -> int:
        """Freeze long-lived objects once `gc_freeze_objects` more are tracked than the floor
        (`memory.Freezer`); how many objects were tracked then (0: none frozen)."""
        if not gc.isenabled():  # a snapshot build is under way: its index is frozen after it
            return 0
        started = time.monotonic()
        held = self.freezer.check()
        if held:
            log.info("gc_frozen", extra={"objects": held,
                                         "ms": round((time.monotonic() - started) * 1000)})
        return held

    # Retention and idle consumers --------------------------------------------------------------

    async def retention_forever(self) -> None:
        """Every `retention_check_s`: follow retention and expire idle consumers."""
        while True:
            await asyncio.sleep(self.settings.retention_check_s)
            try:
                await self.follow_retention()
            except Exception:  # logged, and tried again at the next check
                log.exception("maintenance_failed")

    async def follow_retention(self) -> None:
        """One pass over the ready partitions: drop what retention removed (below each data
        partition's log start), then tombstone consumers idle past `consumer_retention_ms`."""
        retention_ms = self.settings.consumer_retention_ms
        lags: list[tuple[int, str, str]] = []
        for p, state in list(self.ownership.states.items()):
            if not state.ready.is_set():
                continue
            log_start = await self.service.reader.log_start(p)
            lost = state.trim_schedule(log_start)
            if lost:
                log.warning("scheduled_records_lost", extra={
                    "partition": p, "records": lost, "log_start": log_start,
                    "why": "retention removed them before their due time"})
            started = now_ms()
            acked_before = started - retention_ms
            dropped, expired = 0, []
            kept = self._kept.get(p)
            if kept is not None and kept.state is not state:
                kept = None  # the partition was lost and taken again: a new state
            # Records indexed after the last pass are at or above its tail offset: if that was
            # past the log start, and the log start has not moved, no record is below it.
            trim = kept is None or kept.log_start != log_start or kept.tail < log_start
            # Last-ack times only move forward, and a new consumer's is now: none is older
            # than the oldest the last walk found.
            expire = retention_ms > 0 and (kept is None or kept.oldest_ack is None
                                           or kept.oldest_ack < acked_before)
            oldest = started
            tail = state.tail_offset
            whole = True
            # Shard by shard (a few thousand names at a time at a million queues): list() of
            # a million names is one long C call on the loop.
            for shard in range(QUEUE_SHARDS):
                if trim:
                    dropped += state.trim(log_start, state.queues.shard_names(shard))
                nth = lags[-1][0] if len(lags) >= TOP_LAGS else -1  # `lags` is descending
                found = state.consumers_in_shard(shard, nth, acked_before if expire else None)
                if found.lags:
                    lags = heapq.nlargest(TOP_LAGS, lags + found.lags)
                expired += found.idle
                if found.oldest_ack is not None and found.oldest_ack < oldest:
                    oldest = found.oldest_ack
                await asyncio.sleep(0)
                if state.revoked:
                    whole = False
                    break
            if whole:
                self._kept[p] = _Kept(
                    state, log_start, tail,
                    oldest if expire else kept.oldest_ack if kept is not None else None)
            gone = await self._expire(state, expired, acked_before)
            if dropped or gone:
                log.info("partition_maintained", extra={
                    "partition": p, "log_start": log_start, "queues_dropped": dropped,
                    "consumers_expired": gone})
        self.top_lags = lags
        for p in [p for p in self._kept if p not in self.ownership.states]:
            del self._kept[p]

    async def _expire(self, state: PartitionState, expired: list[tuple[str, str]],
                      acked_before: int) -> int:
        """Tombstone the `expired` (queue, consumer) pairs still idle since `acked_before`,
        `EXPIRE_AT_ONCE` at a time; how many were."""
        gone = 0
        for start in range(0, len(expired), EXPIRE_AT_ONCE):
            done = await asyncio.gather(*(
                self.service.expire_consumer(state, queue, consumer, acked_before)
                for queue, consumer in expired[start:start + EXPIRE_AT_ONCE]),
                return_exceptions=True)  # none left running when one fails
            for result in done:
                if isinstance(result, BaseException):
                    raise result
                gone += result
        return gone

    # Snapshots ---------------------------------------------------------------------------------

    async def snapshot_forever(self) -> None:
        """Every `snapshot_interval_s`, snapshot each ready partition that took in at least
        `snapshot_min_records` records since its last snapshot (ADR 7)."""
        while True:
            await asyncio.sleep(self.settings.snapshot_interval_s)
            await self.snapshot_changed()

    async def snapshot_changed(self, min_records: int | None = None,
                               timeout_s: float | None = None) -> int:
        """Snapshot every owned, ready partition with at least `min_records` (by default
        `snapshot_min_records`) records since its last snapshot, for at most `timeout_s` in all
        (a stopping node: its successor, or itself restarted, then loads instead of
        replaying). How many were written."""
        written = 0
        try:
            async with asyncio.timeout(timeout_s):
                for p in list(self.ownership.states):
                    try:
                        written += await self.write_snapshot(p, min_records=min_records)
                    except Exception:  # logged; the next round (or the successor's replay)
                        log.exception("snapshot_failed", extra={"partition": p})
        except TimeoutError:
            log.warning("snapshots_at_stop_cut_short", extra={"written": written})
        return written

    async def write_snapshot(self, p: int, force: bool = False,
                             min_records: int | None = None) -> bool:
        """Snapshot partition p (owned and ready) to the snapshot topic; False if it was not
        due (fewer than `min_records`, by default `snapshot_min_records`, new records, unless
        `force`)."""
        state = self.ownership.states.get(p)
        if self._snapshots is None or state is None or not state.ready.is_set() \
                or self.ownership.leaving is not None:
            return False
        manifest = self.ownership.snapshot_ids.get(p, {})
        last_at = self._snapshot_at.get(p, int(manifest.get("data_position", 0)))
        least = self.settings.snapshot_min_records if min_records is None else min_records
        if not force and state.next_offset - last_at < least:
            return False
        return await self.write_image(p, state) is not None

    async def write_image(self, p: int, state: PartitionState, final: bool = False
                          ) -> int | None:
        """Capture `state` once no offset-topic write is in flight and write it to the
        snapshot topic; its id, or None if the partition was revoked meanwhile. A `final`
        snapshot (a layout's cut, ADR 19) gets a random id, its manifest also under a key of
        its own (`["f", p, id]`), and tombstones nothing: its children read it by id however
        many snapshots of the partition come after it."""
        assert self._snapshots is not None
        manifest = self.ownership.snapshot_ids.get(p, {})
        started = time.monotonic()
        # The cut: no offset-topic write in flight, so the state reflects every entry below
        # offsets_position (a write holds the partition's writing() counter until applied).
        while not await state.wait_writes(1.0):
            if state.revoked:
                return None
        image = await capture(state, state.offsets_position)
        snapshot_id = (int(manifest.get("id", 0)) + 1 if not final
                       else secrets.randbits(50) + (1 << 50))
        chunks, manifest_value = await asyncio.to_thread(encode, image, snapshot_id)
        if state.revoked:
            return None
        await self._snapshots.append(p, [(k, v, None) for k, v in chunks])
        await self._snapshots.append(p, [(manifest_key(p), manifest_value, None)] + (
            [(final_manifest_key(p, snapshot_id), manifest_value, None)] if final else []))
        # The previous snapshot's chunks are not needed any more: tombstones let compaction
        # drop them.
        if manifest.get("id") is not None and not final:
            old = [(chunk_key(p, int(manifest["id"]), i), None, None)
                   for i in range(int(manifest.get("chunks", 0)))]
            if old:
                await self._snapshots.append(p, old)
        self.ownership.snapshot_ids[p] = {"id": snapshot_id, "chunks": len(chunks),
                                          "data_position": image.data_position}
        self._snapshot_at[p] = image.data_position
        self.metrics.snapshots.inc()
        log.info("snapshot_written", extra={
            "partition": p, "id": snapshot_id, "queues": len(image.names),
            "records": image.records, "chunks": len(chunks),
            "bytes": sum(len(v) for _, v in chunks), "data_position": image.data_position,
            "offsets_position": image.offsets_position,
            "ms": round((time.monotonic() - started) * 1000)})
        return snapshot_id
