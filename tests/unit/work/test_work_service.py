"""Work queues through in-memory logs: leases, complete, retry, extend, expiry, modes and their
errors, tokens and done ranges, and the lease state a snapshot carries. Which records a lease
hands out: test_lease_choice.py; dead letters: test_dead_letters.py; the state rebuilt by a new
owner: ../ownership/test_offset_replay.py."""

import asyncio
from array import array

import pytest

from tests.unit.nodes import fill, snapshot_round_trip, work_node
from vqueues.errors import VQError
from vqueues.records import now_ms
from vqueues.state.done_ranges import DoneRanges
from vqueues.state.tokens import parse_token, token

pytestmark = pytest.mark.unit


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


async def test_deleting_a_lease_consumer_leaves_only_tombstones_for_its_keys(node):
    svc, work, _, offset_log = node
    await fill(svc, "d", 3)
    await work.lease("d", "w", 2, 60_000, 0)
    p = svc.partition_of("d")
    await svc.delete_consumer("d", "w")
    latest = {key: value for key, value, _ in offset_log.partitions[p]}
    assert [k for k, v in latest.items() if v is not None and b'"d"' in k] == []
    state = svc.ownership.require(p)
    assert ("d", "w") not in state.windows and ("d", "w") not in state.configs


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
    assert list(fresh.windows[key].done.ranges()) == list(state.windows[key].done.ranges())
    assert fresh.windows[key].frontier == state.windows[key].frontier
    assert {o: (d.attempts, d.until, d.leased, d.order_key, d.reason)
            for o, d in fresh.windows[key].deliveries.items()} == \
        {o: (d.attempts, d.until, d.leased, d.order_key, d.reason)
         for o, d in state.windows[key].deliveries.items()}


async def test_a_records_first_lease_time_stays_through_its_leases_on_one_owner(node):
    svc, work, data_log, offset_log = node
    await fill(svc, "firsts", 1)
    t0 = now_ms()
    first = (await work.lease("firsts", "w", 1, 100, 0)).records[0]
    assert t0 <= first.first_leased <= now_ms()
    again = (await work.lease("firsts", "w", 1, 1000, 1000)).records[0]  # after the expiry
    assert (again.attempt, again.first_leased) == (2, first.first_leased)
    await asyncio.sleep(0.01)
    await fill(svc, "firsts", 1)
    other = (await work.lease("firsts", "w", 1, 1000, 0)).records[0]  # never leased before
    assert other.attempt == 1 and other.first_leased > first.first_leased
    await work.retry("firsts", "w", [again.token], 0, None)
    svc.close()
    # A new owner replays the grants without their times: its first lease of the record is
    # its first.
    svc2, work2 = await work_node(data_log, offset_log, work.settings)
    t1 = now_ms()
    later = (await work2.lease("firsts", "w", 1, 1000, 1000)).records[0]
    assert (later.record.offset, later.attempt) == (first.record.offset, 3)
    assert later.first_leased >= t1 > first.first_leased
    svc2.close()


async def test_a_lease_whose_write_failed_leaves_the_first_lease_time_unset(node):
    svc, work, *_ = node
    await fill(svc, "undone", 1)
    state = svc.ownership.require(svc.partition_of("undone"))
    config = await work.configure("undone", "w", "lease", 5, None, 1000)
    work_window = state.windows[("undone", "w")]
    decision = await work.decide_lease(state, "undone", "w", work_window,
                                       state.configs[("undone", "w")], 1, None, None, 77)
    assert decision is not None and config.mode == "lease"
    [off] = decision.chosen
    assert work_window.deliveries[off].first == decision.at
    decision.undo()
    assert work_window.deliveries[off].first == 0
    leased = (await work.lease("undone", "w", 1, 1000, 0)).records[0]
    assert leased.attempt == 1 and leased.first_leased >= decision.at
