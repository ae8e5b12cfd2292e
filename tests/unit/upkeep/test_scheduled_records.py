"""Scheduled records through the in-memory logs: invisible until due, moved in due order, each
once across a change of owner (a move written before a crash is not repeated), cancellable,
carried by snapshots."""

import asyncio

import pytest

from tests.narrow import known
from tests.unit.fakes import MemoryLog
from tests.unit.nodes import work_node
from vqueues.errors import VQError
from vqueues.records import Record, now_ms
from vqueues.settings import Settings
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.state.schedule import DELIVER_AT_HEADER, FROM_HEADER, Schedule, control_of
from vqueues.upkeep.scheduler import Scheduler

pytestmark = pytest.mark.unit


def later(value: bytes, due: int):
    return (value, [(DELIVER_AT_HEADER, str(due).encode())])


@pytest.fixture
async def node():
    data_log, offset_log = MemoryLog(), MemoryLog()
    data_log.timestamp = now_ms()
    svc, _ = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    yield svc, data_log, offset_log, Scheduler(svc, svc.ownership, 10)
    svc.close()


async def test_a_scheduled_record_is_invisible_until_due_then_moved_in_due_order(node):
    svc, _, _, scheduler = node
    now = now_ms()
    ids = (await svc.enqueue("s", [later(b"second", now + 200), later(b"first", now + 100),
                                   (b"now", [])])).offsets
    page = await svc.read("s", None, 0, 10, 0)
    assert [r.value for r in page.records] == [b"now"]
    info = svc.queue_info("s")
    assert (info.scheduled, info.next_due) == (2, now + 100)
    state = svc.ownership.require(svc.partition_of("s"))
    assert await scheduler.move_due(state) == 0  # nothing due yet
    await asyncio.sleep(0.21)
    assert await scheduler.move_due(state) == 2
    page = await svc.read("s", None, 0, 10, 0)
    assert [r.value for r in page.records] == [b"now", b"first", b"second"]
    assert dict(page.records[1].headers)[FROM_HEADER] == str(ids[1]).encode()
    assert DELIVER_AT_HEADER not in dict(page.records[1].headers)
    assert svc.queue_info("s").scheduled == 0
    assert await scheduler.move_due(state) == 0  # moved once


async def test_a_new_owner_delivers_each_scheduled_record_exactly_once(node):
    svc, data_log, offset_log, scheduler = node
    now = now_ms()
    await svc.enqueue("f", [later(f"r{i}".encode(), now + 50) for i in range(4)])
    state = svc.ownership.require(svc.partition_of("f"))
    await asyncio.sleep(0.06)
    assert await scheduler.move_due(state) == 4
    await svc.enqueue("f", [later(b"pending", now + 100)])
    # The node dies; another replays the partition from the log.
    svc2, _ = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    state2 = svc2.ownership.require(svc.partition_of("f"))
    assert svc2.queue_info("f").scheduled == 1
    await asyncio.sleep(0.1)
    assert await Scheduler(svc2, svc2.ownership, 10).move_due(state2) == 1
    page = await svc2.read("f", None, 0, 100, 0)
    assert sorted(r.value for r in page.records) == [b"pending", b"r0", b"r1", b"r2", b"r3"]
    svc2.close()


async def test_a_scheduled_record_can_be_cancelled_before_it_is_due(node):
    svc, data_log, offset_log, _ = node
    record_id = (await svc.enqueue("c", [later(b"never", now_ms() + 60_000)])).offsets[0]
    assert svc.queue_info("c").scheduled == 1
    res = await svc.cancel_scheduled("c", record_id)
    assert res.cancelled
    with pytest.raises(VQError) as err:
        svc.queue_info("c")  # no record, nothing scheduled
    assert err.value.code == "queue_not_found"
    with pytest.raises(VQError) as err:
        await svc.cancel_scheduled("c", record_id)
    assert (err.value.code, err.value.status) == ("scheduled_not_found", 404)
    svc2, _ = await work_node(data_log, offset_log, Settings(write_visible_timeout_ms=1000))
    with pytest.raises(VQError):
        svc2.queue_info("c")  # the cancellation is in the log: nothing scheduled any more
    svc2.close()


async def test_the_api_turns_delays_into_due_times_and_refuses_too_long_ones():
    from vqueues.api.enqueue_body import decode_records

    settings = Settings(max_schedule_delay_ms=10_000)
    before = now_ms()
    [(_, headers)] = decode_records({"records": [{"value": "v", "delay_ms": 5000}]}, settings)
    due = int(dict(headers)[DELIVER_AT_HEADER])
    assert before + 5000 <= due <= now_ms() + 5000
    [(_, headers)] = decode_records({"records": [{"value": "v", "deliver_at": 1}]}, settings)
    assert headers == []  # due in the past: delivered at once
    for bad in ({"delay_ms": 20_000}, {"delay_ms": -1}, {"deliver_at": now_ms() + 60_000},
                {"delay_ms": 1, "deliver_at": 1}, {"delay_ms": "soon"}):
        with pytest.raises(VQError) as err:
            decode_records({"records": [{"value": "v", **bad}]}, settings)
        assert err.value.status == 400


async def test_a_snapshot_carries_the_scheduled_records():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", Record(0, 0, b"x", ((DELIVER_AT_HEADER, b"999"),))),
                     ("q", Record(1, 0, b"y", ()))], None)
    image = await capture(s, 0)
    chunks, manifest = encode(image, 1)
    loaded = known(latest(0, [*chunks, (manifest_key(0), manifest)]))
    fresh = PartitionState(0, RecordCache(1 << 20))
    restore(fresh, loaded, build(loaded))
    assert fresh.schedule.by_queue == {"q": {0: 999}}
    assert fresh.select("q", 0, 10) == [1]


def test_the_schedule_hands_out_due_records_once_in_due_order():
    sch = Schedule()
    sch.add("a", 5, 300)
    sch.add("b", 6, 100)
    sch.add("a", 7, 200)
    assert sch.take_due(250) == [(100, 6, "b"), (200, 7, "a")]
    assert sch.take_due(250) == []  # being moved
    sch.release([(200, 7, "a")])
    assert sch.take_due(250) == [(200, 7, "a")]
    assert sch.remove("a", 7) and not sch.remove("a", 7)
    assert sch.next_due("a") == 300 and len(sch) == 2
    assert sch.drop_below(None, 6) == 1 and len(sch) == 1
    assert control_of([(DELIVER_AT_HEADER, b"12")]) == ("at", 12)
    assert control_of([(DELIVER_AT_HEADER, b"x")]) is None


def test_the_schedules_snapshot_section_keeps_the_records_written_below_the_cut():
    schedule = Schedule()
    schedule.add("q", 3, 1_000)
    schedule.add("q", 8, 500)
    schedule.add("r", 4, 2_000)
    rows = schedule.capture(5)
    assert sorted(rows) == [("q", 3, 1_000), ("r", 4, 2_000)]
    fresh = Schedule()
    fresh.restore(rows)
    assert fresh.by_queue == {"q": {3: 1_000}, "r": {4: 2_000}}
    assert [(due, i) for due, i, _ in fresh.take_due(5_000)] == [(1_000, 3), (2_000, 4)]


async def test_the_scheduler_wakes_at_the_due_time_not_at_the_next_tick(node):
    """With a 10 s tick, records due in 50 and 120 ms (two partitions) are moved once due,
    each by then and none early: the scheduler sleeps until the earliest due time."""
    import asyncio

    svc, _, _, _ = node
    scheduler = Scheduler(svc, svc.ownership, 10_000)
    queues = ["s-a", next(f"s-{i}" for i in range(100)
                          if svc.partition_of(f"s-{i}") != svc.partition_of("s-a"))]
    now = now_ms()
    dues = {queues[0]: now + 50, queues[1]: now + 120}
    for q, due in dues.items():
        await svc.enqueue(q, [later(b"x", due)])
    runner = asyncio.create_task(scheduler.run_forever())
    try:
        for q, due in dues.items():
            while not (await svc.read(q, None, 0, 10, 0)).records:
                assert now_ms() < due + 5_000, "not moved long after its due time"
                await asyncio.sleep(0.005)
            assert now_ms() >= due  # none early
            assert now_ms() < now + 5_000  # well before the 10 s tick
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert not scheduler._moving  # stopping it stopped its moves


@pytest.mark.parametrize("batch", [1000, 7])
async def test_the_due_records_of_a_partitions_queues_are_moved_together(node, monkeypatch,
                                                                         batch):
    """One write (of up to MOVE_BATCH records) for all the partition's queues, each queue's
    records in due order, not a write per queue one after the other: records due at once in
    5,000 queues were moved up to 2.2 s late so."""
    svc, data_log, _, scheduler = node
    monkeypatch.setattr("vqueues.upkeep.scheduler.MOVE_BATCH", batch)
    now = now_ms()
    p = svc.partition_of("m-0")
    queues = [q for q in (f"m-{i}" for i in range(2000)) if svc.partition_of(q) == p][:60]
    assert len(queues) == 60
    for q in queues:
        await svc.enqueue(q, [later(b"second", now + 60), later(b"first", now + 50),
                              later(b"third", now + 70)])
    writes: list[int] = []
    append = data_log.append

    async def counted(partition, records):
        writes.append(len(records))
        return await append(partition, records)

    monkeypatch.setattr(data_log, "append", counted)
    state = svc.ownership.require(p)
    await asyncio.sleep(0.08)
    assert await scheduler.move_due(state) == 3 * len(queues)
    assert writes == [min(batch, 180 - i) for i in range(0, 180, batch)]
    for q in queues:
        page = await svc.read(q, None, 0, 10, 0)
        assert [r.value for r in page.records] == [b"first", b"second", b"third"]
        assert svc.queue_info(q).scheduled == 0
    assert await scheduler.move_due(state) == 0  # moved once
