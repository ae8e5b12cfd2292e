"""The ownership lifecycle through in-memory logs: assign -> replay -> ready -> revoke, and a
re-assignment without a revoke. The group's thread side is called from a thread, as in a node."""

import asyncio

import pytest

from tests.unit.nodes import ownership_of, queue_in, until
from vqueues.errors import Unavailable, VQError
from vqueues.ownership import ownership
from vqueues.ownership.cluster_map import encode_claim
from vqueues.records import ConsumerAcked, Record, encode_offset_entry


async def test_a_partition_serves_once_its_data_and_offsets_are_replayed(logs):
    offset_log, assignment_log = logs
    q = queue_in(1)
    await offset_log.append(1, [(*encode_offset_entry(ConsumerAcked(q, "c", 1)), None)])
    own = ownership_of(logs)
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
    own = ownership_of(logs)
    await asyncio.to_thread(own.assigned, [2])
    await asyncio.to_thread(own.reached_end, 2, 0)
    await until(lambda: 2 in own.states and own.states[2].ready.is_set())


async def test_a_revoked_partition_is_unavailable_until_an_owner_is_known(logs):
    """No 409 without an owner to follow: 503 partition_unavailable (retriable, with
    Retry-After) until the next owner's claim arrives, then 409 wrong_node naming it."""
    _, assignment_log = logs
    own = ownership_of(logs)
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
    own = ownership_of(logs)
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
    own = ownership_of(logs)
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
    own = ownership_of(logs)
    elsewhere = queue_in(2)
    await asyncio.to_thread(own.assigned, [1])
    await asyncio.to_thread(own.consumed, [(1, elsewhere.encode(), Record(0, 1, b"x", ())),
                                           (1, None, Record(1, 1, b"y", ()))], {1: 2},
                            {1: 2})
    await until(lambda: 1 in own.states and own.states[1].ready.is_set())
    assert own.states[1].select(elsewhere, 0, 10) == []
    assert own.states[1].next_offset == 2


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
