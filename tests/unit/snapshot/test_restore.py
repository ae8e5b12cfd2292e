"""Snapshot restore through in-memory logs: a new owner starts at its latest snapshot's position,
builds the loaded index off the loop while the group reads on, builds its cold queues in the
background, drops a snapshot that loads too late, and fails when one cannot be built (ADR 7)."""

import asyncio
import time

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import ownership_of, queue_in, snapshot_log_of, until
from vqueues.records import Record
from vqueues.state.cache import RecordCache


async def test_a_snapshot_that_loads_after_the_group_gave_up_waiting_is_not_applied(
        logs, monkeypatch):
    import vqueues.ownership.ownership as ownership_module

    q = queue_in(0)
    snapshots = await snapshot_log_of(0, q, 1)
    own = ownership_of(logs, snapshots)
    monkeypatch.setattr(ownership_module, "SNAPSHOT_LOAD_TIMEOUT_S", 0.0)  # give up at once
    read = own._read_snapshots

    def slow_read(partitions):
        time.sleep(0.05)  # surely after the group gave up
        return read(partitions)

    monkeypatch.setattr(own, "_read_snapshots", slow_read)
    assert await asyncio.to_thread(own.assigned, [0]) == {}
    await until(lambda: 0 in own.states)
    await asyncio.sleep(0.2)  # the load finishes meanwhile
    assert own.states[0].tail_offset == 0 and own.states[0].queues == {}
    # The group reads from the beginning; the replay builds the state.
    await asyncio.to_thread(own.consumed, [(0, q.encode(), Record(0, 1, b"x", ()))], {0: 1},
                            {0: 1})
    await until(lambda: own.states[0].ready.is_set())
    assert own.states[0].select(q, 0, 10) == [0]


async def test_a_partition_with_a_snapshot_starts_at_its_position(logs):
    q = queue_in(1)
    snapshots = await snapshot_log_of(1, q, 5)
    own = ownership_of(logs, snapshots)
    assert await asyncio.to_thread(own.assigned, [1]) == {1: 5}
    await asyncio.to_thread(own.reached_end, 1, 5)
    await until(lambda: own.states[1].ready.is_set())
    assert own.states[1].select(q, 0, 10) == [0, 1, 2, 3, 4]


async def test_a_restored_partition_builds_its_cold_queues_in_the_background(logs):
    """A snapshot's queues stay columns at the restore (cold, in `QueueMap`); once the
    partition serves, a task builds them a shard per loop turn, so the columns are freed
    without any request's help."""
    from vqueues.snapshot.capture import capture
    from vqueues.snapshot.format import manifest_key
    from vqueues.snapshot.wire import encode
    from vqueues.state.partition_state import PartitionState

    source = PartitionState(1, RecordCache(1 << 20))
    names = [f"warm-{i}" for i in range(2000)]
    source.apply_records([(n, Record(i, 1, b"x", ())) for i, n in enumerate(names)], None)
    chunks, manifest = encode(await capture(source, 0), 1)
    snapshots = MemoryLog()
    await snapshots.append(1, [(k, v, None) for k, v in
                               [*chunks, (manifest_key(1), manifest)]])
    own = ownership_of(logs, snapshots)
    assert await asyncio.to_thread(own.assigned, [1]) == {1: 2000}
    await asyncio.to_thread(own.reached_end, 1, 2000)
    await until(lambda: own.states[1].ready.is_set())
    state = own.states[1]
    await until(lambda: state.queues.cold == 0)
    assert state.queues._cold is None  # the columns went with the last shard
    assert len(state.queues) == 2000 and state.select("warm-7", 0, 10) == [7]


async def test_the_group_reads_on_while_a_snapshot_is_built_and_its_records_follow_it(
        logs, monkeypatch):
    """The tail's first fetch overlaps the build (a takeover's two longest waits); records it
    brings meanwhile are applied after the restore, in order, none twice."""
    import threading

    from vqueues.snapshot import build as build_module

    q = queue_in(1)
    snapshots = await snapshot_log_of(1, q, 5)
    release = threading.Event()
    real_build = build_module.build

    def slow_build(image):
        assert release.wait(5)
        return real_build(image)

    monkeypatch.setattr(build_module, "build", slow_build)
    own = ownership_of(logs, snapshots)
    # The group learns the snapshot's position before the snapshot is built.
    assert await asyncio.to_thread(own.assigned, [1]) == {1: 5}
    await asyncio.to_thread(own.consumed, [(1, q.encode(), Record(5, 1, b"f", ())),
                                           (1, q.encode(), Record(6, 1, b"g", ()))], {1: 7},
                            {1: 7})
    await asyncio.to_thread(own.reached_end, 1, 7)
    await asyncio.sleep(0.05)
    state = own.states[1]
    assert not state.ready.is_set() and state.queues == {}  # nothing applied before the restore
    release.set()
    await until(lambda: state.ready.is_set())
    assert state.select(q, 0, 10) == [0, 1, 2, 3, 4, 5, 6]
    assert state.next_offset == 7


async def test_a_snapshot_that_cannot_be_built_fails_the_node(logs, monkeypatch):
    """The group already reads from the snapshot's position: serving without the records
    below it would lose them, so the node reports the failure (its /healthz answers 500)."""
    from vqueues.snapshot import build as build_module

    q = queue_in(2)
    snapshots = await snapshot_log_of(2, q, 3)

    def broken_build(image):
        raise MemoryError("no room")

    monkeypatch.setattr(build_module, "build", broken_build)
    own = ownership_of(logs, snapshots)
    assert await asyncio.to_thread(own.assigned, [2]) == {2: 3}
    await asyncio.to_thread(own.reached_end, 2, 3)
    await until(lambda: own.failure is not None)
    assert "snapshot could not be built" in own.failure
    assert not own.states[2].ready.is_set() and not own.ready
