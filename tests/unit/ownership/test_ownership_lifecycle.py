"""The ownership lifecycle through in-memory logs: assign -> replay -> ready -> revoke, and a
re-assignment without a revoke. The group's thread side is called from a thread, as in a node."""

import asyncio
import time

import pytest

from tests.unit.fakes import MemoryLog
from vqueues.errors import Unavailable, VQError
from vqueues.hashing import partition_for
from vqueues.ownership import ownership
from vqueues.ownership.cluster_map import encode_claim
from vqueues.ownership.ownership import Ownership
from vqueues.records import ConsumerAcked, Record, encode_offset_entry
from vqueues.state.cache import RecordCache

PARTITIONS = 4


def queue_in(p, prefix="q"):
    return next(f"{prefix}{i}" for i in range(10**5)
                if partition_for(f"{prefix}{i}", PARTITIONS) == p)


async def until(cond, timeout_s=2.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.fixture
def logs():
    return MemoryLog(), MemoryLog()


def make(logs, snapshot_log=None):
    offset_log, assignment_log = logs
    return Ownership(asyncio.get_running_loop(), PARTITIONS, RecordCache(1 << 20), offset_log,
                     node_id="n1", url="http://n1", assignment_log=assignment_log,
                     snapshot_log=snapshot_log)


async def test_a_partition_serves_once_its_data_and_offsets_are_replayed(logs):
    offset_log, assignment_log = logs
    q = queue_in(1)
    await offset_log.append(1, [(*encode_offset_entry(ConsumerAcked(q, "c", 1)), None)])
    own = make(logs)
    await asyncio.to_thread(own.assigned, [1])
    await until(lambda: 1 in own.states)
    with pytest.raises(VQError) as err:
        own.require(1)
    assert err.value.code == "partition_replaying"
    await asyncio.to_thread(own.consumed, [(1, q.encode(), Record(0, 1, b"x", ())),
                                           (1, q.encode(), Record(1, 1, b"y", ()))], {1: 2},
                            {1: 2})
    await until(lambda: own.states[1].ready.is_set())
    state = own.require(1)
    assert state.select(q, 0, 10) == [0, 1] and state.committed(q, "c") == 1
    assert own.ready
    # The claim was announced on the assignment log with the node's URL.
    await until(lambda: assignment_log.end(0) == 1)
    assert b"http://n1" in assignment_log.partitions[0][0][1]


async def test_an_empty_partition_is_ready_at_its_end_event(logs):
    own = make(logs)
    await asyncio.to_thread(own.assigned, [2])
    await asyncio.to_thread(own.reached_end, 2, 0)
    await until(lambda: 2 in own.states and own.states[2].ready.is_set())


async def test_a_revoked_partition_is_unavailable_until_an_owner_is_known(logs):
    """No 409 without an owner to follow: 503 partition_unavailable (retriable, with
    Retry-After) until the next owner's claim arrives, then 409 wrong_node naming it."""
    _, assignment_log = logs
    own = make(logs)
    await asyncio.to_thread(own.assigned, [3])
    await asyncio.to_thread(own.reached_end, 3, 0)
    await until(lambda: 3 in own.states and own.states[3].ready.is_set())
    state = own.states[3]
    await asyncio.to_thread(own.revoked, [3], False)
    assert state.revoked and 3 not in own.states
    assert b"released" in assignment_log.partitions[0][-1][1]
    own.cluster_map.apply([(assignment_log.partitions[0][-1][0],
                            assignment_log.partitions[0][-1][1])])
    with pytest.raises(VQError) as err:
        own.require(3)
    assert (err.value.code, err.value.status, err.value.retriable) == (
        "partition_unavailable", 503, True)
    assert isinstance(err.value, Unavailable)  # it carries retry_after_s
    assert err.value.details["partition"] == 3 and err.value.retry_after_s >= 1
    own.cluster_map.apply([encode_claim(3, "n2", "http://n2", 99)])
    with pytest.raises(VQError) as err:
        own.require(3)
    assert (err.value.code, err.value.details["owner"]) == ("wrong_node", "http://n2")


async def test_a_given_up_partitions_index_is_freed_after_a_grace_period(logs, monkeypatch):
    monkeypatch.setattr(ownership, "DISMANTLE_AFTER_S", 0.2)
    own = make(logs)
    q = queue_in(3)
    for again in (False, True):
        await asyncio.to_thread(own.assigned, [3])
        await asyncio.to_thread(own.consumed, [(3, q.encode(), Record(0, 1, b"x", ()))],
                                {3: 1}, {3: 1})
        await until(lambda: 3 in own.states and own.states[3].ready.is_set())
        state = own.states[3]
        if again:  # re-assigned without a revoke: the old state is given up as well
            await asyncio.to_thread(own.assigned, [3])
        else:
            await asyncio.to_thread(own.revoked, [3], False)
        assert state.revoked and state.select(q, 0, 10) == [0]  # whole for who holds it
        await until(lambda s=state: len(s.queues) == 0)


async def test_a_reassignment_without_a_revoke_starts_a_fresh_replay(logs):
    own = make(logs)
    q = queue_in(0)
    await asyncio.to_thread(own.assigned, [0])
    await asyncio.to_thread(own.consumed, [(0, q.encode(), Record(0, 1, b"x", ()))], {0: 1}, {0: 1})
    await until(lambda: 0 in own.states and own.states[0].ready.is_set())
    first = own.states[0]
    await asyncio.to_thread(own.assigned, [0])  # no revoke in between
    await until(lambda: own.states[0] is not first)
    assert first.revoked
    fresh = own.states[0]
    assert not fresh.ready.is_set() and fresh.select(q, 0, 10) == []
    # The group re-reads the partition from its beginning: the fresh state indexes it again.
    await asyncio.to_thread(own.consumed, [(0, q.encode(), Record(0, 1, b"x", ()))], {0: 1}, {0: 1})
    await until(lambda: fresh.ready.is_set())
    assert fresh.select(q, 0, 10) == [0]


async def test_records_of_another_partitions_queue_are_skipped(logs):
    own = make(logs)
    elsewhere = queue_in(2)
    await asyncio.to_thread(own.assigned, [1])
    await asyncio.to_thread(own.consumed, [(1, elsewhere.encode(), Record(0, 1, b"x", ())),
                                           (1, None, Record(1, 1, b"y", ()))], {1: 2},
                            {1: 2})
    await until(lambda: 1 in own.states and own.states[1].ready.is_set())
    assert own.states[1].select(elsewhere, 0, 10) == []
    assert own.states[1].next_offset == 2


async def snapshot_log_of(partition, queue, records):
    """A snapshot log holding one snapshot of `partition`: `records` records of `queue`."""
    from vqueues.snapshot import codec as snap
    from vqueues.state.partition_state import PartitionState

    source = PartitionState(partition, RecordCache(1 << 20))
    source.apply_records([(queue, Record(i, 1, b"x", ())) for i in range(records)], None)
    chunks, manifest = snap.encode(await snap.capture(source, 0), 1)
    log = MemoryLog()
    await log.append(partition, [(k, v, None) for k, v in
                                 [*chunks, (snap.manifest_key(partition), manifest)]])
    return log


async def test_a_snapshot_that_loads_after_the_group_gave_up_waiting_is_not_applied(
        logs, monkeypatch):
    import vqueues.ownership.ownership as ownership_module

    q = queue_in(0)
    snapshots = await snapshot_log_of(0, q, 1)
    own = make(logs, snapshots)
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
    own = make(logs, snapshots)
    assert await asyncio.to_thread(own.assigned, [1]) == {1: 5}
    await asyncio.to_thread(own.reached_end, 1, 5)
    await until(lambda: own.states[1].ready.is_set())
    assert own.states[1].select(q, 0, 10) == [0, 1, 2, 3, 4]


async def test_a_restored_partition_builds_its_cold_queues_in_the_background(logs):
    """A snapshot's queues stay columns at the restore (cold, in `QueueMap`); once the
    partition serves, a task builds them a shard per loop turn, so the columns are freed
    without any request's help."""
    from vqueues.snapshot import codec as snap
    from vqueues.state.partition_state import PartitionState

    source = PartitionState(1, RecordCache(1 << 20))
    names = [f"warm-{i}" for i in range(2000)]
    source.apply_records([(n, Record(i, 1, b"x", ())) for i, n in enumerate(names)], None)
    chunks, manifest = snap.encode(await snap.capture(source, 0), 1)
    snapshots = MemoryLog()
    await snapshots.append(1, [(k, v, None) for k, v in
                               [*chunks, (snap.manifest_key(1), manifest)]])
    own = make(logs, snapshots)
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

    from vqueues.snapshot import codec as snap

    q = queue_in(1)
    snapshots = await snapshot_log_of(1, q, 5)
    release = threading.Event()
    real_build = snap.build

    def slow_build(image):
        assert release.wait(5)
        return real_build(image)

    monkeypatch.setattr(snap, "build", slow_build)
    own = make(logs, snapshots)
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
    from vqueues.snapshot import codec as snap

    q = queue_in(2)
    snapshots = await snapshot_log_of(2, q, 3)

    def broken_build(image):
        raise MemoryError("no room")

    monkeypatch.setattr(snap, "build", broken_build)
    own = make(logs, snapshots)
    assert await asyncio.to_thread(own.assigned, [2]) == {2: 3}
    await asyncio.to_thread(own.reached_end, 2, 3)
    await until(lambda: own.failure is not None)
    assert "snapshot could not be built" in own.failure
    assert not own.states[2].ready.is_set() and not own.ready


def test_an_answer_that_comes_as_the_wait_ends_stands():
    """The loop answered between the group's timeout and its cancel: the loop restores the
    snapshot, so the group must start at its position, not from the beginning."""
    import concurrent.futures

    from vqueues.ownership.ownership import wait_for_starts

    class AnsweredAtTheTimeout(concurrent.futures.Future[dict[int, int]]):
        def result(self, timeout=None):
            if not self.done():
                self.set_result({1: 5})
                raise concurrent.futures.TimeoutError
            return super().result(timeout)

    assert wait_for_starts(AnsweredAtTheTimeout(), 0.0, [1]) == {1: 5}
    silent: concurrent.futures.Future[dict[int, int]] = concurrent.futures.Future()
    assert wait_for_starts(silent, 0.0, [1]) == {} and silent.cancelled()
