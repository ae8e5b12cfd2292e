"""Work queues through in-memory logs: leases, complete, retry, extend, dead letters, per-key
order, the window's bound, and state rebuilt from the offset log (failover) with fencing."""

import asyncio
import itertools
from array import array

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import fill, snapshot_round_trip, work_node
from vqueues.errors import VQError
from vqueues.records import (
    DeliveryUpdated,
    encode_offset_entry,
    generation_header,
)
from vqueues.settings import Settings
from vqueues.state.leases import DoneRanges, parse_token, token

pytestmark = pytest.mark.unit


@pytest.fixture
def settings():
    return Settings(write_visible_timeout_ms=1000, max_lease_window=50)


@pytest.fixture
async def node(settings):
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, settings)
    yield svc, work, data_log, offset_log
    svc.close()


async def test_leases_hand_each_record_to_one_worker_and_complete_moves_the_mark(node):
    svc, work, *_ = node
    offsets = await fill(svc, "jobs", 6)
    a = await work.lease("jobs", "w", 3, 1000, 0)
    b = await work.lease("jobs", "w", 3, 1000, 0)
    assert [r.record.offset for r in a.records] == offsets[:3]
    assert [r.record.offset for r in b.records] == offsets[3:]
    assert {r.attempt for r in a.records + b.records} == {1}
    assert (await work.lease("jobs", "w", 3, 1000, 0)).records == []
    done = await work.complete("jobs", "w", [r.token for r in b.records])
    assert done.offset == offsets[0]  # out of order: the mark waits for the first three
    info = svc.queue_info("jobs").consumers[0]
    assert (info.mode, info.in_flight, info.available) == ("lease", 3, 0)
    done = await work.complete("jobs", "w", [r.token for r in a.records])
    assert done.offset == offsets[-1] + 1
    info = svc.queue_info("jobs").consumers[0]
    assert (info.offset, info.lag, info.in_flight, info.available) == (offsets[-1] + 1, 0, 0, 0)
    # Completing again is idempotent.
    assert (await work.complete("jobs", "w", [a.records[0].token])).done == [a.records[0].token]


async def test_concurrent_leases_never_share_a_record(node):
    svc, work, *_ = node
    await fill(svc, "many", 40)
    got = await asyncio.gather(*(work.lease("many", "w", 7, 1000, 0) for _ in range(8)))
    offsets = [r.record.offset for page in got for r in page.records]
    assert len(offsets) == len(set(offsets)) == 40


async def test_an_expired_lease_is_delivered_again_and_the_old_token_is_stale(node):
    svc, work, *_ = node
    await fill(svc, "slow", 1)
    first = (await work.lease("slow", "w", 1, 100, 0)).records[0]
    assert (await work.lease("slow", "w", 1, 100, 0)).records == []
    again = (await work.lease("slow", "w", 1, 1000, 500)).records[0]  # waits for the expiry
    assert (again.record.offset, again.attempt) == (first.record.offset, 2)
    with pytest.raises(VQError) as err:
        await work.complete("slow", "w", [first.token])
    assert (err.value.code, err.value.status) == ("lease_expired", 409)
    assert err.value.details["stale"] == [first.token]
    await work.complete("slow", "w", [again.token])


async def test_an_expired_lease_not_yet_leased_again_can_still_be_completed(node):
    svc, work, *_ = node
    await fill(svc, "late", 1)
    first = (await work.lease("late", "w", 1, 100, 0)).records[0]
    await asyncio.sleep(0.15)
    assert (await work.complete("late", "w", [first.token])).done == [first.token]
    assert (await work.lease("late", "w", 1, 100, 0)).records == []


async def test_retry_with_a_delay_is_not_delivered_early(node):
    svc, work, *_ = node
    await fill(svc, "later", 1)
    rec = (await work.lease("later", "w", 1, 1000, 0)).records[0]
    await work.retry("later", "w", [rec.token], 300, "busy")
    info = svc.queue_info("later").consumers[0]
    assert (info.delayed, info.in_flight, info.available) == (1, 0, 0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    again = (await work.lease("later", "w", 1, 1000, 2000)).records[0]
    assert loop.time() - started >= 0.25
    assert again.attempt == 2


async def test_extend_moves_the_deadline(node):
    svc, work, *_ = node
    await fill(svc, "long", 1)
    rec = (await work.lease("long", "w", 1, 200, 0)).records[0]
    res = await work.extend("long", "w", [rec.token], 5000)
    assert res.deadline is not None and res.deadline > rec.deadline
    await asyncio.sleep(0.3)
    assert (await work.lease("long", "w", 1, 200, 0)).records == []  # still held


async def test_a_poison_record_goes_to_the_dead_letter_queue_after_max_attempts(node):
    svc, work, *_ = node
    await work.configure("src", "w", "lease", 3, "src-dlq", None)
    await fill(svc, "src", 1)
    for attempt in (1, 2, 3):
        rec = (await work.lease("src", "w", 1, 1000, 0)).records[0]
        assert rec.attempt == attempt
        res = await work.retry("src", "w", [rec.token], 0, f"boom {attempt}")
    assert res.dead_lettered == [rec.token]
    assert (await work.lease("src", "w", 1, 1000, 0)).records == []
    info = svc.queue_info("src").consumers[0]
    assert (info.dead_lettered, info.lag) == (1, 0)
    dead = (await svc.read("src-dlq", None, None, 10, 1000)).records
    assert len(dead) == 1 and dead[0].value == b"r0"
    headers = dict(dead[0].headers)
    assert headers["vq-dlq-source-queue"] == b"src"
    assert headers["vq-dlq-attempts"] == b"3"
    assert headers["vq-dlq-reason"] == b"boom 3"
    assert headers["vq-dlq-consumer"] == b"w"


async def test_an_expired_last_attempt_is_dead_lettered_at_the_next_lease(node):
    svc, work, *_ = node
    await work.configure("exp", "w", "lease", 1, None, None)  # no DLQ: counted and skipped
    await fill(svc, "exp", 2)
    first = (await work.lease("exp", "w", 1, 100, 0)).records[0]
    await asyncio.sleep(0.15)
    nxt = (await work.lease("exp", "w", 1, 1000, 0)).records[0]
    assert nxt.record.offset > first.record.offset
    assert svc.queue_info("exp").consumers[0].dead_lettered == 1


async def test_records_with_one_ordering_key_go_one_at_a_time_in_order(node):
    svc, work, *_ = node
    a = await fill(svc, "ordered", 3, key="a")
    b = await fill(svc, "ordered", 2, key="b")
    free = await fill(svc, "ordered", 2)
    got = await work.lease("ordered", "w", 10, 1000, 0)
    assert [r.record.offset for r in got.records] == [a[0], b[0], *free]
    assert (await work.lease("ordered", "w", 10, 1000, 0)).records == []
    by_offset = {r.record.offset: r for r in got.records}
    await work.complete("ordered", "w", [by_offset[a[0]].token])
    nxt = await work.lease("ordered", "w", 10, 1000, 0)
    assert [r.record.offset for r in nxt.records] == [a[1]]
    # A retried record keeps its key busy: the next one of that key waits for it.
    await work.retry("ordered", "w", [nxt.records[0].token], 200, None)
    assert (await work.lease("ordered", "w", 10, 1000, 0)).records == []


async def test_leasing_waits_while_the_window_is_full(node, settings):
    svc, work, *_ = node
    await fill(svc, "big", settings.max_lease_window + 10)
    first = await work.lease("big", "w", 1000, 1000, 0)
    assert len(first.records) == settings.max_lease_window
    assert (await work.lease("big", "w", 10, 1000, 0)).records == []
    await work.complete("big", "w", [first.records[0].token])
    assert len((await work.lease("big", "w", 10, 1000, 0)).records) == 1


async def test_modes_do_not_mix_and_bad_input_gets_registry_errors(node):
    svc, work, *_ = node
    await fill(svc, "m", 2)
    await work.lease("m", "leaser", 1, 1000, 0)
    with pytest.raises(VQError) as err:
        await svc.ack("m", "leaser", 1, allow_rewind=False)
    assert err.value.code == "consumer_mode_mismatch"
    await work.configure("m", "reader", "cursor", None, False, None)
    with pytest.raises(VQError) as err:
        await work.lease("m", "reader", 1, 1000, 0)
    assert err.value.code == "consumer_mode_mismatch"
    for call in (lambda: work.parse_tokens(["nope"]), lambda: work.parse_tokens([])):
        with pytest.raises(VQError) as err:
            call()
        assert (err.value.code, err.value.status) == ("invalid_token", 400)
    rec = (await work.lease("m", "leaser", 1, 1000, 0)).records[0]
    with pytest.raises(VQError) as err:
        await work.retry("m", "leaser", [rec.token], -1, None)
    assert err.value.code == "limit_out_of_range"
    with pytest.raises(VQError) as err:
        await work.extend("m", "leaser", [rec.token], 10)
    assert err.value.code == "limit_out_of_range"
    with pytest.raises(VQError) as err:
        await work.complete("m", "leaser", [token(10_000, 1)])
    assert err.value.code == "lease_expired"


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
    assert list(after.work[key].done.ranges()) == list(before.work[key].done.ranges())
    assert {o: (d.attempts, d.until, d.leased, d.reason)
            for o, d in after.work[key].deliveries.items() if d.attempts} == \
        {o: (d.attempts, d.until, d.leased, d.reason)
         for o, d in before.work[key].deliveries.items() if d.attempts}
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
    assert state.work[("z", "w")].deliveries[rec.record.offset].attempts == 1
    got = await work3.lease("z", "w", 10, 1000, 0)
    assert [r.record.offset for r in got.records] == offsets[1:]
    svc2.close()
    svc3.close()


async def test_deleting_a_lease_consumer_leaves_only_tombstones_for_its_keys(node):
    svc, work, _, offset_log = node
    await fill(svc, "d", 3)
    await work.lease("d", "w", 2, 60_000, 0)
    p = svc.partition_of("d")
    await svc.delete_consumer("d", "w")
    latest = {}
    for key, value, _ in offset_log.partitions[p]:
        latest[key] = value
    assert [k for k, v in latest.items() if v is not None and b'"d"' in k] == []
    state = svc.ownership.require(p)
    assert ("d", "w") not in state.work and ("d", "w") not in state.configs


def test_done_ranges_merge_across_other_queues_records():
    queue = array("q", [2, 5, 9, 14, 20])
    done = DoneRanges()
    for off in (9, 2, 5):
        done.add(off, queue)
    assert list(done.ranges()) == [(2, 10)]
    done.add(20, queue)
    assert list(done.ranges()) == [(2, 10), (20, 21)]
    done.add(14, queue)
    assert list(done.ranges()) == [(2, 21)]
    assert 7 in done and 21 not in done
    assert done.count(queue) == 5
    done.drop_below(9)
    assert list(done.ranges()) == [(9, 21)] and done.count(queue) == 3


def test_tokens_name_the_record_and_the_delivery():
    assert parse_token(token(17, 3)) == (17, 3, 0)  # ADR 8's tokens: no grant
    assert parse_token(token(17, 3, 0xBEEF)) == (17, 3, 0xBEEF)
    for bad in ("", "17", "a.b", "1.2.x", "1.2.3.4", None, 5, "-1.2", "1.2.F"):
        assert parse_token(bad) is None


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
    assert after.work[key].dead_lettered == before.work[key].dead_lettered
    # The same records are done (the ranges may be cut differently: replay applies entries
    # before the data records they merge across are indexed).
    offsets = before.queues["h"].offsets
    assert [o for o in offsets if o in after.work[key].done] == \
        [o for o in offsets if o in before.work[key].done]
    assert {o: (d.attempts, d.leased) for o, d in after.work[key].deliveries.items()
            if d.attempts} == {o: (d.attempts, d.leased)
                               for o, d in before.work[key].deliveries.items() if d.attempts}
    svc2.close()


async def test_a_snapshot_carries_the_lease_state_and_the_fence(node):
    svc, work, *_ = node
    await work.configure("s", "w", "lease", 2, "s-dlq", 5000)
    await fill(svc, "s", 6, key="k")
    await fill(svc, "s", 3)
    leased = (await work.lease("s", "w", 3, 60_000, 0)).records
    await work.complete("s", "w", [leased[-1].token])
    await work.retry("s", "w", [leased[1].token], 1000, "why")
    state = svc.ownership.require(svc.partition_of("s"))
    fresh, _ = await snapshot_round_trip(state)
    assert fresh.fence == state.fence > 0
    assert fresh.configs == state.configs
    key = ("s", "w")
    assert list(fresh.work[key].done.ranges()) == list(state.work[key].done.ranges())
    assert fresh.work[key].frontier == state.work[key].frontier
    assert {o: (d.attempts, d.until, d.leased, d.order_key, d.reason)
            for o, d in fresh.work[key].deliveries.items()} == \
        {o: (d.attempts, d.until, d.leased, d.order_key, d.reason)
         for o, d in state.work[key].deliveries.items()}


async def test_one_slow_record_does_not_hold_back_the_queue():
    """The default window (100,000 records in flight or done out of order): one record held
    for long, thousands of others leased and completed past it."""
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    try:
        assert Settings().max_lease_window >= 100_000
        offsets = await fill(svc, "slow", 5000)
        held = (await work.lease("slow", "w", 1, 600_000, 0)).records
        assert [r.record.offset for r in held] == offsets[:1]
        done = 0
        while True:
            got = (await work.lease("slow", "w", 1000, 60_000, 0)).records
            if not got:
                break
            await work.complete("slow", "w", [r.token for r in got])
            done += len(got)
        assert done == 4999
        info = svc.queue_info("slow").consumers[0]
        assert (info.offset, info.in_flight, info.available) == (offsets[0], 1, 0)
        await work.complete("slow", "w", [held[0].token])
        assert svc.queue_info("slow").consumers[0].offset == offsets[-1] + 1
    finally:
        svc.close()


async def test_an_expired_last_attempt_is_dead_lettered_when_it_expires(node):
    from vqueues.upkeep.lease_expiry import LeaseExpiry
    svc, work, *_ = node
    await work.configure("late", "w", "lease", 1, "late-dlq", None)
    await fill(svc, "late", 2)
    leased = (await work.lease("late", "w", 1, 100, 0)).records
    expiry = asyncio.create_task(LeaseExpiry(work, svc.ownership, 20).run_forever())
    try:
        for _ in range(100):  # no lease call meanwhile
            await asyncio.sleep(0.02)
            if svc.queue_info("late").consumers[0].dead_lettered:
                break
        assert svc.queue_info("late").consumers[0].dead_lettered == 1
        dead = (await svc.read("late-dlq", None, None, 10, 1000)).records
        assert [d.value for d in dead] == [leased[0].record.value]
        assert dict(dead[0].headers)["vq-dlq-reason"] == b"lease expired"
    finally:
        expiry.cancel()


async def test_consumers_whose_leases_expire_together_are_dead_lettered_together(
        node, monkeypatch):
    """Each dead-lettering waits for two writes: one consumer after the other, the last of
    1,000 consumers whose leases expired together waited for 2,000 of them."""
    from vqueues.upkeep.lease_expiry import LeaseExpiry
    svc, work, data_log, _ = node
    queues = [f"expiring-{i}" for i in range(20)]
    for q in queues:
        await work.configure(q, "w", "lease", 1, "expiring-dlq", None)
        await fill(svc, q, 1)
    for q in queues:
        assert (await work.lease(q, "w", 1, 100, 0)).records
    writing = most = 0
    append = data_log.append

    async def slow(partition, records):
        nonlocal writing, most
        writing += 1
        most = max(most, writing)
        try:
            await asyncio.sleep(0.05)
            return await append(partition, records)
        finally:
            writing -= 1

    monkeypatch.setattr(data_log, "append", slow)
    expiry = asyncio.create_task(LeaseExpiry(work, svc.ownership, 20).run_forever())
    try:
        for _ in range(300):
            await asyncio.sleep(0.02)
            if all(svc.queue_info(q).consumers[0].dead_lettered for q in queues):
                break
        assert [svc.queue_info(q).consumers[0].dead_lettered for q in queues] == [1] * 20
        assert most > 1  # the dead letters of several consumers were written at once
        monkeypatch.setattr(data_log, "append", append)
        dead = (await svc.read("expiring-dlq", None, None, 100, 1000)).records
        assert sorted(dict(d.headers)["vq-dlq-source-queue"] for d in dead) == \
            sorted(q.encode() for q in queues)
    finally:
        expiry.cancel()


async def test_an_in_flight_cap_holds_exactly_under_concurrent_leases(node):
    svc, work, *_ = node
    await fill(svc, "capped", 30)
    settings = await work.configure("capped", "w", "lease", None, False, None, 4)
    assert settings.max_in_flight == 4
    pages = await asyncio.gather(*(work.lease("capped", "w", 3, 150, 0) for _ in range(6)))
    held = [r for page in pages for r in page.records]
    assert len(held) == 4  # 6 concurrent calls of 3: never more than the cap
    assert (await work.lease("capped", "w", 10, 150, 0)).records == []
    await work.complete("capped", "w", [held[0].token])
    more = (await work.lease("capped", "w", 10, 150, 0)).records
    assert len(more) == 1  # one slot freed
    await asyncio.sleep(0.2)  # every lease ran out: the cap counts only leases running
    again = (await work.lease("capped", "w", 10, 1000, 0)).records
    assert len(again) == 4
    assert work.consumer_settings("capped", "w").max_in_flight == 4
    await work.configure("capped", "w", None, None, False, None, None)  # the cap cleared
    assert len((await work.lease("capped", "w", 10, 1000, 0)).records) == 10


async def test_a_long_poll_on_a_capped_consumer_wakes_when_a_lease_is_completed(node):
    svc, work, *_ = node
    await fill(svc, "capwait", 5)
    await work.configure("capwait", "w", "lease", None, False, None, 1)
    first = (await work.lease("capwait", "w", 5, 30_000, 0)).records
    waiting = asyncio.ensure_future(work.lease("capwait", "w", 5, 30_000, 5000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await work.complete("capwait", "w", [first[0].token])
    got = (await asyncio.wait_for(waiting, 2)).records
    assert len(got) == 1 and got[0].record.offset != first[0].record.offset


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
