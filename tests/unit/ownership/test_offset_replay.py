"""Offset replay through in-memory logs: a new owner rebuilds the lease state its predecessor
answered from out of the offset log, random histories included, and ignores the writes of an
owner fenced off (ADR 2, ADR 8)."""

import itertools

import pytest

from tests.unit.nodes import fill, snapshot_round_trip, work_node
from vqueues.records import (
    DeliveryUpdated,
    encode_offset_entry,
    generation_header,
)

pytestmark = pytest.mark.unit


async def test_a_new_owner_rebuilds_the_same_lease_state_from_the_offset_log(node, settings):
    svc, work, data_log, offset_log = node
    await work.configure("f", "w", "lease", 4, None, None)
    offsets = await fill(svc, "f", 8)
    first = await work.lease("f", "w", 3, 60_000, 0)
    second = await work.lease("f", "w", 2, 60_000, 0)
    await work.complete("f", "w", [second.records[0].token])  # out of order
    await work.retry("f", "w", [first.records[1].token], 60_000, "later")
    await work.complete("f", "w", [first.records[0].token])
    before = svc.ownership.require(svc.partition_of("f"))
    svc2, work2 = await work_node(data_log, offset_log, settings)
    after = svc2.ownership.require(svc.partition_of("f"))
    assert after.committed("f", "w") == before.committed("f", "w") == offsets[1]
    key = ("f", "w")
    assert list(after.windows[key].done.ranges()) == list(before.windows[key].done.ranges())
    assert {o: (d.attempts, d.until, d.leased, d.reason)
            for o, d in after.windows[key].deliveries.items() if d.attempts} == \
        {o: (d.attempts, d.until, d.leased, d.reason)
         for o, d in before.windows[key].deliveries.items() if d.attempts}
    assert after.generation > before.generation
    # The leased records are not handed out again before their deadline, the retried one not
    # before its time: the new owner leases only the records never delivered.
    got = await work2.lease("f", "w", 10, 1000, 0)
    assert [r.record.offset for r in got.records] == offsets[5:]
    # A token handed out by the old owner still works with the new one.
    assert (await work2.complete("f", "w", [first.records[2].token])).done
    svc2.close()


async def test_writes_of_a_fenced_off_owner_are_ignored_by_replay(node, settings):
    svc, work, data_log, offset_log = node
    offsets = await fill(svc, "z", 2)
    rec = (await work.lease("z", "w", 1, 60_000, 0)).records[0]
    old = svc.ownership.require(svc.partition_of("z"))
    svc2, _ = await work_node(data_log, offset_log, settings)  # takes over, writes its fence
    # The old owner, not knowing, writes a state that would hand the record out again.
    stale = DeliveryUpdated("z", "w", rec.record.offset, 0, 0, False)
    await offset_log.append(old.partition, [(*encode_offset_entry(stale),
                                             generation_header(old.generation))])
    svc3, work3 = await work_node(data_log, offset_log, settings)
    state = svc3.ownership.require(old.partition)
    assert state.fenced_entries == 1
    assert state.windows[("z", "w")].deliveries[rec.record.offset].attempts == 1
    got = await work3.lease("z", "w", 10, 1000, 0)
    assert [r.record.offset for r in got.records] == offsets[1:]
    svc2.close()
    svc3.close()


@pytest.mark.parametrize("seed", range(5))
async def test_random_histories_rebuild_to_the_same_state(node, settings, seed):
    import random
    svc, work, data_log, offset_log = node
    rnd = random.Random(seed)
    await work.configure("h", "w", "lease", 3, "h-dlq", None)
    held = []
    for _ in itertools.repeat(None, 120):
        action = rnd.random()
        if action < 0.3:
            await fill(svc, "h", rnd.randint(1, 4), key=rnd.choice([None, "x", "y"]))
        elif action < 0.55:
            held += (await work.lease("h", "w", rnd.randint(1, 5), 60_000, 0)).records
        elif held and action < 0.8:
            rec = held.pop(rnd.randrange(len(held)))
            await work.complete("h", "w", [rec.token])
        elif held:
            rec = held.pop(rnd.randrange(len(held)))
            await work.retry("h", "w", [rec.token], 0, "r")
    before = svc.ownership.require(svc.partition_of("h"))
    svc2, _ = await work_node(data_log, offset_log, settings)
    after = svc2.ownership.require(svc.partition_of("h"))
    key = ("h", "w")
    assert after.committed(*key) == before.committed(*key)
    assert after.windows[key].dead_lettered == before.windows[key].dead_lettered
    # The same records are done (the ranges may be cut differently: replay applies entries
    # before the data records they merge across are indexed).
    offsets = before.queues["h"].offsets
    assert [o for o in offsets if o in after.windows[key].done] == \
        [o for o in offsets if o in before.windows[key].done]
    assert {o: (d.attempts, d.leased) for o, d in after.windows[key].deliveries.items()
            if d.attempts} == {o: (d.attempts, d.leased)
                               for o, d in before.windows[key].deliveries.items() if d.attempts}
    svc2.close()


async def test_a_consumers_cap_and_prefix_survive_replay_and_a_snapshot(node):
    svc, work, *_ = node
    from vqueues.records import ConsumerConfigured, decode_offset_entry, encode_offset_entry
    entry = ConsumerConfigured("q", "c", "lease", 3, "q-dead", 1000, 7, "q")
    assert decode_offset_entry(*encode_offset_entry(entry)) == entry
    plain = ConsumerConfigured("q", "c", "lease", 3, None, 1000)
    key, value = encode_offset_entry(plain)
    assert value is not None
    assert b"max_in_flight" not in value and b"prefix" not in value
    assert decode_offset_entry(key, value) == plain
    await fill(svc, "snapcap", 2)
    await work.configure("snapcap", "w", "lease", 2, None, 1000, 9)
    state = svc.ownership.require(svc.partition_of("snapcap"))
    fresh, _ = await snapshot_round_trip(state)
    assert fresh.configs[("snapcap", "w")] == state.configs[("snapcap", "w")]
    assert fresh.configs[("snapcap", "w")].max_in_flight == 9
