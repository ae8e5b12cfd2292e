"""In-memory nodes for the unit tier: the queue and work services over the fakes of the storage
seams (tests/unit/fakes.py), built as a node builds them, and replayed from those logs as a new
owner replays them. Plain helpers; the fixtures over them are in tests/unit/conftest.py."""

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

from tests.narrow import known
from tests.unit.fakes import MemoryFetcher, MemoryLog
from vqueues.api.enqueue_body import decode_enqueue
from vqueues.errors import VQError
from vqueues.hashing import partition_for
from vqueues.ownership.ownership import Ownership
from vqueues.queues.service import QueueService
from vqueues.records import Record
from vqueues.settings import Settings
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import ORDER_KEY_HEADER
from vqueues.state.partition_state import PartitionState
from vqueues.work.work_service import WorkService

PARTITIONS = 2


async def queue_service(settings: Settings | None = None, partitions: int = PARTITIONS
                        ) -> QueueService:
    """A queue service owning every partition of empty logs, ready."""
    loop = asyncio.get_running_loop()
    cache = RecordCache(1 << 20)
    offset_log = MemoryLog()
    own = Ownership(loop, partitions, cache, offset_log, node_id="n", url="http://n")
    data_log = MemoryLog(tail=own)
    svc = QueueService(settings or Settings(write_visible_timeout_ms=1000), own, cache,
                       data_log, offset_log, MemoryFetcher(data_log))
    await asyncio.to_thread(own.assigned, list(range(partitions)))
    for p in range(partitions):
        await asyncio.to_thread(own.reached_end, p, 0)
    for _ in range(200):
        if own.ready:
            break
        await asyncio.sleep(0.005)
    return svc


async def work_node(data_log, offset_log, settings, assignment_log=None, partitions=PARTITIONS,
                    cache_bytes=1 << 20):
    """A node owning every partition, replayed from the logs (`assignment_log`: the prefix
    consumers' definitions too): (queue service, work service)."""
    loop = asyncio.get_running_loop()
    cache = RecordCache(cache_bytes)
    own = Ownership(loop, partitions, cache, offset_log, node_id="n", url="http://n",
                    assignment_log=assignment_log)
    data_log.tail = own
    svc = QueueService(settings, own, cache, data_log, offset_log, MemoryFetcher(data_log))
    if assignment_log is not None:
        own.prefixes.apply([(k, v) for k, v, _ in assignment_log.partitions.get(0, [])])
    await asyncio.to_thread(own.assigned, list(range(partitions)))
    for p in range(partitions):
        batch = [(p, k, rec) for k, rec in records_of(data_log, p)]
        if batch:
            await asyncio.to_thread(own.consumed, batch, {p: len(batch)}, {p: len(batch)})
        await asyncio.to_thread(own.reached_end, p, data_log.end(p))
    for _ in range(400):
        if own.ready:
            break
        await asyncio.sleep(0.005)
    assert own.ready
    return svc, WorkService(settings, svc, svc.entries, svc.reader)


def records_of(data_log: MemoryLog, p: int) -> Iterator[tuple[bytes | None, Record]]:
    """A partition of the log as the tail delivers it: (key, record)."""
    for off, (k, v, h) in enumerate(data_log.partitions.get(p, [])):
        yield k, Record(off, data_log.timestamp, v, tuple(h or ()))


async def fill(svc, queue, n, key=None):
    """`n` records enqueued to `queue` (with the ordering key `key`): their offsets."""
    headers = [(ORDER_KEY_HEADER, key.encode())] if key else []
    return (await svc.enqueue(queue, [(f"r{i}".encode(), headers) for i in range(n)])).offsets


async def snapshot_round_trip(state):
    """A snapshot of `state` captured, encoded, decoded and restored into a fresh partition:
    (the fresh partition, the loaded snapshot)."""
    image = await capture(state, state.offsets_position)
    chunks, manifest = encode(image, 1)
    loaded = known(latest(state.partition, [*chunks, (manifest_key(state.partition),
                                                           manifest)]))
    fresh = PartitionState(state.partition, RecordCache(1 << 20))
    restore(fresh, loaded, build(loaded))
    return fresh, loaded


class Owner:
    """A node over the shared in-memory logs: it restores from the latest snapshot (if any)
    and replays the rest, as a new owner does."""

    def __init__(self, logs, settings: Settings) -> None:
        self.data, self.offsets, self.snapshots = logs
        self.settings = settings

    async def start(self) -> "Owner":
        loop = asyncio.get_running_loop()
        cache = RecordCache(1 << 20)
        own = self.own = Ownership(loop, PARTITIONS, cache, self.offsets, node_id="n",
                                   url="http://n", snapshot_log=self.snapshots)
        self.svc = QueueService(self.settings, own, cache, self.data, self.offsets,
                                MemoryFetcher(self.data))
        starts = await asyncio.to_thread(own.assigned, list(range(PARTITIONS)))
        for p in range(PARTITIONS):
            log = self.data.partitions.get(p, [])
            start = starts.get(p, 0)
            batch = [(p, k, Record(o, self.data.timestamp, v, tuple(h or ())))
                     for o, (k, v, h) in enumerate(log) if o >= start]
            if batch:
                await asyncio.to_thread(own.consumed, batch, {p: len(log)}, {p: len(log)})
            await asyncio.to_thread(own.reached_end, p, len(log))
        for _ in range(400):
            if own.ready:
                break
            await asyncio.sleep(0.005)
        assert own.ready
        self.data.tail = own
        return self

    async def snapshot(self) -> None:
        """What Maintenance.write_snapshot writes, for every partition."""
        for p, state in self.own.states.items():
            assert await state.wait_writes(1.0)
            image = await capture(state, state.offsets_position)
            chunks, manifest = encode(image, int(time.time() * 1000))
            await self.snapshots.append(p, [(k, v, None) for k, v in chunks])
            await self.snapshots.append(p, [(manifest_key(p), manifest, None)])

    async def send(self, queue: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            new = decode_enqueue(json.dumps({"records": records}).encode(), self.settings)
            return {"offsets": (await self.svc.enqueue(queue, new)).offsets}
        except VQError as exc:
            return exc.to_json()

    def close(self) -> None:
        self.svc.close()


# Ownership alone (its lifecycle, offset replay, snapshot restore): the group's thread side
# is called from a thread, as in a node.
OWNER_PARTITIONS = 4


def queue_in(p, prefix="q"):
    """A queue name in partition `p` of OWNER_PARTITIONS."""
    return next(f"{prefix}{i}" for i in range(10**5)
                if partition_for(f"{prefix}{i}", OWNER_PARTITIONS) == p)


async def until(cond, timeout_s=2.0):
    """Wait on the loop until `cond()` holds; fail after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def ownership_of(logs, snapshot_log=None):
    """An Ownership of OWNER_OWNER_PARTITIONS partitions over `logs` (the offset and assignment
    logs), not yet assigned any."""
    offset_log, assignment_log = logs
    return Ownership(asyncio.get_running_loop(), OWNER_PARTITIONS, RecordCache(1 << 20), offset_log,
                     node_id="n1", url="http://n1", assignment_log=assignment_log,
                     snapshot_log=snapshot_log)


async def snapshot_log_of(partition, queue, records):
    """A snapshot log holding one snapshot of `partition`: `records` records of `queue`."""
    source = PartitionState(partition, RecordCache(1 << 20))
    source.apply_records([(queue, Record(i, 1, b"x", ())) for i in range(records)], None)
    chunks, manifest = encode(await capture(source, 0), 1)
    log = MemoryLog()
    await log.append(partition, [(k, v, None) for k, v in
                                 [*chunks, (manifest_key(partition), manifest)]])
    return log
