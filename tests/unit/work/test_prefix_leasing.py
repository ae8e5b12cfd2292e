"""Prefix consumers through in-memory logs: one lease across every queue under a prefix, fair
between queues, with a per-queue in-flight cap; tokens of many queues settled at once; each
queue's state its own lease consumer's (ADR 13)."""

import asyncio

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import work_node
from vqueues.errors import VQError
from vqueues.records import now_ms
from vqueues.settings import Settings
from vqueues.state.prefix_consumers import RECORDS_PER_TURN
from vqueues.state.ready_queues import ReadyQueues
from vqueues.work.prefix_leasing import PrefixLeasing
from vqueues.work.work_service import COMPLETE, RETRY, Settle

pytestmark = pytest.mark.unit
PARTITIONS = 4


async def _node(data_log, offset_log, assignment_log, settings):
    svc, work = await work_node(data_log, offset_log, settings, assignment_log, PARTITIONS,
                                1 << 26)
    return svc, work, PrefixLeasing(work)


@pytest.fixture
def settings():
    return Settings(write_visible_timeout_ms=1000)


@pytest.fixture
async def node(settings):
    logs = MemoryLog(), MemoryLog(), MemoryLog()
    svc, work, prefix = await _node(*logs, settings)
    yield svc, work, prefix, logs
    svc.close()


async def _fill(svc, queue, n, headers=()):
    return (await svc.enqueue(queue, [(f"{queue}:{i}".encode(), list(headers))
                                      for i in range(n)])).offsets


async def _settle_all(prefix, consumer, got):
    return await prefix.settle(consumer, Settle(COMPLETE),
                               [(r.queue, r.leased.token) for r in got.records])


async def test_a_prefix_consumer_leases_from_every_queue_under_it_and_no_other(node):
    svc, work, prefix, _ = node
    await prefix.define("pool", {"prefix": "tenant-", "max_attempts": 3})
    for q in ("tenant-a", "tenant-b", "tenant-c", "other"):
        await _fill(svc, q, 3)
    got = await prefix.lease("pool", 100, 30_000, 0)
    assert sorted((r.queue, r.leased.record.value) for r in got.records) == sorted(
        (q, f"{q}:{i}".encode()) for q in ("tenant-a", "tenant-b", "tenant-c") for i in range(3))
    assert all(r.partition == svc.partition_of(r.queue) for r in got.records)
    assert (await prefix.lease("pool", 100, 30_000, 0)).records == []
    done = await _settle_all(prefix, "pool", got)
    assert sorted(r.queue for r in done.queues) == ["tenant-a", "tenant-b", "tenant-c"]
    # Each queue keeps its own lease consumer: shown with the queue, settings from the prefix.
    info = svc.queue_info("tenant-b")
    (c,) = info.consumers
    assert (c.consumer, c.mode, c.offset, c.in_flight) == ("pool", "lease", 3, 0)
    settings = work.consumer_settings("tenant-b", "pool")
    assert (settings.max_attempts, settings.prefix) == (3, "tenant-")
    assert svc.queue_info("other").consumers == []
    # A queue made after the definition is under it too.
    await _fill(svc, "tenant-new", 2)
    got = await prefix.lease("pool", 100, 30_000, 0)
    assert [r.queue for r in got.records] == ["tenant-new", "tenant-new"]


@pytest.mark.parametrize("per_turn", [None, 10, 1])
async def test_a_backlog_delays_no_other_queue_by_more_than_a_round(node, per_turn):
    svc, _, prefix, _ = node
    definition: dict[str, object] = {"prefix": "t-"}
    if per_turn is not None:
        definition["records_per_turn"] = per_turn
    await prefix.define("fair", definition)
    turn = per_turn or RECORDS_PER_TURN
    await _fill(svc, "t-big", 100_000)
    for i in range(99):
        await _fill(svc, f"t-small-{i}", 10)
    big = small = 0
    while small < 990:
        got = await prefix.lease("fair", 10, 60_000, 0)
        assert got.records
        for r in got.records:
            if r.queue == "t-big":
                big += 1
            else:
                small += 1
        await _settle_all(prefix, "fair", got)
    # Every small queue's 10 records went out before the big queue's 2,000th: the big queue
    # had one turn per round, and the small queues' records took 10 / turn rounds.
    assert big < 2000
    assert big <= turn * -(-10 // turn)


async def test_a_queue_gets_as_many_turns_as_any_other_whatever_its_partition(node):
    svc, _, prefix, _ = node
    await prefix.define("spread", {"prefix": "sp-", "records_per_turn": 5})
    names = [f"sp-{i}" for i in range(200)]
    alone = names[0]
    crowd = [n for n in names if svc.partition_of(n) != svc.partition_of(alone)][:12]
    assert len({svc.partition_of(n) for n in crowd}) >= 2
    for q in [alone, *crowd]:
        await _fill(svc, q, 200)
    counts = dict.fromkeys([alone, *crowd], 0)
    for _ in range(30):  # 5 rounds of 13 turns of 5 records: 65 records a round
        got = await prefix.lease("spread", 11, 60_000, 0)
        for r in got.records:
            counts[r.queue] += 1
        await _settle_all(prefix, "spread", got)
    # 330 records: every queue had 5 turns (25 records) or 6 (the round under way).
    assert set(counts.values()) <= {25, 30}, counts


async def test_leases_at_once_start_in_different_partitions(node):
    svc = node[0]
    prefix, _ = await _pool(node, "pa", 40, 50, records_per_turn=10)
    pages = await asyncio.gather(*(prefix.lease("pa", 10, 60_000, 0) for _ in range(4)))
    firsts = [svc.partition_of(page.records[0].queue) for page in pages]
    assert len(set(firsts)) == PARTITIONS  # each call wrote to its own offset partition
    assert all(len({svc.partition_of(r.queue) for r in page.records}) == 1 for page in pages)


async def test_weights_give_a_queue_more_records_per_turn(node):
    svc, _, prefix, _ = node
    await prefix.define("w", {"prefix": "w-", "weights": {"w-vip": 3}, "records_per_turn": 1})
    await _fill(svc, "w-vip", 30)
    await _fill(svc, "w-std", 30)
    counts = {"w-vip": 0, "w-std": 0}
    for _ in range(4):
        got = await prefix.lease("w", 8, 60_000, 0)
        for r in got.records:
            counts[r.queue] += 1
        await _settle_all(prefix, "w", got)
    assert counts == {"w-vip": 24, "w-std": 8}


async def test_a_turn_takes_records_per_turn_from_a_queue_then_the_next_queue_goes(node):
    svc, _, prefix, _ = node
    await prefix.define("q", {"prefix": "q-", "records_per_turn": 4})
    same = [n for n in (f"q-{i}" for i in range(100))
            if svc.partition_of(n) == svc.partition_of("q-0")][:3]  # one partition's turns
    for q in same:
        await _fill(svc, q, 10)
    got = await prefix.lease("q", 10, 60_000, 0)
    # 4 from the first queue in turn, 4 from the second, 2 from the third; the third's turn
    # goes on in the next call, then the first queue's next turn.
    a, b, c = same
    assert [r.queue for r in got.records] == [a] * 4 + [b] * 4 + [c] * 2
    got = await prefix.lease("q", 6, 60_000, 0)
    assert [r.queue for r in got.records] == [c] * 2 + [a] * 4


async def test_a_per_queue_in_flight_cap_holds_across_concurrent_prefix_leases(node):
    svc, _, prefix, _ = node
    await prefix.define("cap", {"prefix": "c-", "max_in_flight": 2})
    queues = [f"c-{i}" for i in range(5)]
    for q in queues:
        await _fill(svc, q, 10)
    pages = await asyncio.gather(*(prefix.lease("cap", 10, 60_000, 0) for _ in range(8)))
    held = [r for page in pages for r in page.records]
    per_queue = {q: sum(1 for r in held if r.queue == q) for q in queues}
    assert per_queue == {q: 2 for q in queues}
    assert (await prefix.lease("cap", 10, 60_000, 0)).records == []
    one = next(r for r in held if r.queue == "c-3")
    await prefix.settle("cap", Settle(COMPLETE), [("c-3", one.leased.token)])
    got = await prefix.lease("cap", 10, 60_000, 0)
    assert [r.queue for r in got.records] == ["c-3"]  # the one slot it freed


async def test_a_long_poll_wakes_on_a_record_in_any_queue_under_the_prefix(node):
    svc, _, prefix, _ = node
    await prefix.define("lp", {"prefix": "lp-"})
    waiting = asyncio.ensure_future(prefix.lease("lp", 5, 60_000, 5000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await _fill(svc, "lp-late", 1)
    got = await asyncio.wait_for(waiting, 2)
    assert [r.queue for r in got.records] == ["lp-late"]


async def test_retries_and_expired_leases_come_back_at_their_time(node):
    svc, _, prefix, _ = node
    await prefix.define("t", {"prefix": "tm-"})
    await _fill(svc, "tm-a", 1)
    await _fill(svc, "tm-b", 1)
    got = await prefix.lease("t", 10, 200, 0)  # visibility 200 ms
    a = next(r for r in got.records if r.queue == "tm-a")
    await prefix.settle("t", Settle(RETRY, 300, "later"), [("tm-a", a.leased.token)])
    loop = asyncio.get_running_loop()
    started = loop.time()
    again = await prefix.lease("t", 10, 60_000, 2000)  # tm-b's lease runs out first
    assert [r.queue for r in again.records] == ["tm-b"] and again.records[0].leased.attempt == 2
    later = await prefix.lease("t", 10, 60_000, 2000)
    assert [r.queue for r in later.records] == ["tm-a"]
    assert loop.time() - started >= 0.25


async def test_settling_many_queues_is_all_or_nothing(node):
    svc, _, prefix, _ = node
    await prefix.define("s", {"prefix": "s-"})
    for q in ("s-1", "s-2", "s-3"):
        await _fill(svc, q, 2)
    got = await prefix.lease("s", 10, 60_000, 0)
    pairs = [(r.queue, r.leased.token) for r in got.records]
    with pytest.raises(VQError) as err:
        await prefix.settle("s", Settle(COMPLETE), [*pairs, ("s-2", "99.1.abc")])
    assert (err.value.code, err.value.details["stale"]) == (
        "lease_expired", [{"queue": "s-2", "token": "99.1.abc"}])
    for q in ("s-1", "s-2", "s-3"):
        assert svc.queue_info(q).consumers[0].in_flight == 2  # nothing was completed
    with pytest.raises(VQError) as err:
        await prefix.settle("s", Settle(COMPLETE), [("elsewhere", "1.1.a")])
    assert err.value.code == "invalid_parameter"
    done = await prefix.settle("s", Settle(COMPLETE), pairs)
    assert sum(len(r.done) for r in done.queues) == 6


async def test_a_queue_consumer_of_the_same_name_shares_the_window_and_others_coexist(node):
    svc, work, prefix, _ = node
    await prefix.define("shared", {"prefix": "sh-"})
    await _fill(svc, "sh-q", 6)
    by_queue_route = await work.lease("sh-q", "shared", 3, 60_000, 0)
    by_prefix = await prefix.lease("shared", 10, 60_000, 0)
    offsets = [r.record.offset for r in by_queue_route.records] + \
        [r.leased.record.offset for r in by_prefix.records]
    assert len(offsets) == len(set(offsets)) == 6  # one window: no record twice
    other = await work.lease("sh-q", "auditor", 10, 60_000, 0)  # another consumer: all of it
    assert len(other.records) == 6


async def test_queues_follow_a_change_of_the_prefix_consumers_settings_unless_set_alone(node):
    svc, work, prefix, _ = node
    await prefix.define("chg", {"prefix": "ch-", "max_attempts": 5})
    await _fill(svc, "ch-a", 2)
    await _fill(svc, "ch-b", 2)
    got = await prefix.lease("chg", 1, 60_000, 0)
    got = await prefix.lease("chg", 10, 60_000, 0)
    await work.configure("ch-b", "chg", None, 9, False, None)  # ch-b set on its own
    await prefix.define("chg", {"prefix": "ch-", "max_attempts": 2})
    await prefix.settle("chg", Settle(RETRY, 0, None),
                        [(r.queue, r.leased.token) for r in got.records])
    await prefix.lease("chg", 10, 60_000, 0)
    assert work.consumer_settings("ch-a", "chg").max_attempts == 2
    assert work.consumer_settings("ch-b", "chg").max_attempts == 9
    assert work.consumer_settings("ch-b", "chg").prefix is None


async def test_a_new_owner_replays_each_queues_state_and_serves_the_prefix(node, settings):
    logs: tuple[MemoryLog, MemoryLog, MemoryLog]  # the fixture's (data, offset, assignment)
    svc, _, prefix, logs = node
    await prefix.define("fo", {"prefix": "fo-", "max_attempts": 4})
    for i in range(6):
        await _fill(svc, f"fo-{i}", 4)
    first = await prefix.lease("fo", 9, 60_000, 0)
    await prefix.settle("fo", Settle(COMPLETE),
                        [(r.queue, r.leased.token) for r in first.records[:4]])
    before = {q: svc.ownership.require(svc.partition_of(q)).windows.get((q, "fo"))
              for q in (f"fo-{i}" for i in range(6))}
    svc2, _, prefix2 = await _node(*logs, settings)
    for q, work in before.items():
        if work is None:
            continue
        after = svc2.ownership.require(svc2.partition_of(q)).windows[(q, "fo")]
        assert list(after.done.ranges()) == list(work.done.ranges())
        assert {o: (d.attempts, d.until, d.leased, d.grant)
                for o, d in after.deliveries.items() if d.attempts} == \
            {o: (d.attempts, d.until, d.leased, d.grant)
             for o, d in work.deliveries.items() if d.attempts}
    await asyncio.sleep(0.05)  # the new owner's turns are built once its partitions serve
    rest = await prefix2.lease("fo", 100, 60_000, 0)
    # The 5 still leased are not handed out again; the other 15 are, once each.
    assert len(rest.records) == 24 - 9
    held = {(r.queue, r.leased.record.offset) for r in first.records}
    assert not held & {(r.queue, r.leased.record.offset) for r in rest.records}
    # A token the old owner handed out still works with the new one.
    done = await prefix2.settle("fo", Settle(COMPLETE),
                                [(r.queue, r.leased.token) for r in first.records[4:]])
    assert sum(len(r.done) for r in done.queues) == 5
    svc2.close()


async def test_bad_definitions_get_the_registrys_errors(node):
    _, _, prefix, _ = node
    for body, code in [({}, "invalid_parameter"), ({"prefix": ""}, "invalid_parameter"),
                       ({"prefix": "x-", "nope": 1}, "invalid_parameter"),
                       ({"prefix": "x-", "dead_letter_queue": "x-dead"}, "invalid_parameter"),
                       ({"prefix": "x-", "dead_letter_queue": "{queue}-dead"},
                        "invalid_parameter"),
                       ({"prefix": "x-", "weights": {"y-1": 2}}, "invalid_parameter"),
                       ({"prefix": "x-", "weights": {"x-1": 0}}, "limit_out_of_range"),
                       ({"prefix": "x-", "max_in_flight": 0}, "limit_out_of_range"),
                       ({"prefix": "x-", "max_attempts": 0}, "limit_out_of_range")]:
        with pytest.raises(VQError) as err:
            await prefix.define("bad", body)
        assert err.value.code == code, body
    with pytest.raises(VQError) as err:
        await prefix.lease("missing", 1, None, 0)
    assert (err.value.code, err.value.status) == ("prefix_consumer_not_found", 404)
    pc = await prefix.define("ok", {"prefix": "x-", "dead_letter_queue": "dead-{queue}"})
    assert pc.dead_letter_queue == "dead-{queue}"
    assert prefix.get("ok").dead_letter_queue_of("x-1") == "dead-x-1"
    await prefix.delete("ok")
    with pytest.raises(VQError):
        prefix.info("ok")


async def test_queues_a_pool_emptied_take_no_turn_until_a_record_comes(node):
    svc, _, prefix, _ = node
    await prefix.define("e", {"prefix": "e-"})
    queues = [f"e-{i}" for i in range(40)]
    for q in queues:
        await _fill(svc, q, 3)
    while got := await prefix.lease("e", 50, 60_000, 0):
        if not got.records:
            break
        await _settle_all(prefix, "e", got)
    states = {svc.ownership.require(svc.partition_of(q)) for q in queues}
    assert sum(s.ready_queues.size("e") for s in states) == 0  # no idle queue left in turn
    await _fill(svc, "e-7", 1)
    assert sum(s.ready_queues.size("e") for s in states) == 1
    got = await prefix.lease("e", 50, 60_000, 0)
    assert [r.queue for r in got.records] == ["e-7"]


async def _pool(node, consumer: str, queues: int, records: int, **settings: object):
    """A prefix consumer `consumer` (with `settings`) over `queues` queues "<consumer>-i" of
    `records` records: the leasing and the partitions' states."""
    svc, _, prefix, _ = node
    await prefix.define(consumer, {"prefix": f"{consumer}-", **settings})
    names = [f"{consumer}-{i}" for i in range(queues)]
    for q in names:
        await _fill(svc, q, records)
    return prefix, {svc.ownership.require(svc.partition_of(q)) for q in names}


async def test_a_queue_with_nothing_to_lease_leaves_the_turns_at_once(node):
    """Leasing or completing a queue's last records takes it out of turn: no later lease pays
    a turn to find it empty. It comes back when one of its leases runs out."""
    prefix, states = await _pool(node, "x", 30, 2)
    got = await prefix.lease("x", 60, 300, 0)
    assert len(got.records) == 60
    assert sum(s.ready_queues.size("x") for s in states) == 0  # all in flight
    back = [r for r in got.records if r.queue == "x-3"]
    await prefix.settle("x", Settle(COMPLETE), [(r.queue, r.leased.token) for r in got.records
                                                if r.queue != "x-3"])
    assert sum(s.ready_queues.size("x") for s in states) == 0  # done, or in flight
    again = await prefix.lease("x", 60, 60_000, 2000)  # x-3's leases run out
    assert {r.queue for r in again.records} == {"x-3"} and len(again.records) == len(back)


async def test_a_queue_whose_leases_were_all_settled_has_no_timer_left(node):
    """A lease times its queue for the lease's expiry; completing every record of it drops
    that timer, so no recheck comes due for a queue with nothing to wait for (a pool that
    leased once from 100,000 queues and completed everything rechecked each of them at
    its old expiry)."""
    prefix, states = await _pool(node, "y", 20, 1)
    got = await prefix.lease("y", 100, 60_000, 0)
    assert len(got.records) == 20
    await prefix.settle("y", Settle(COMPLETE), [(r.queue, r.leased.token) for r in got.records
                                                if r.queue != "y-7"])
    later = now_ms() + 10**9
    assert [q for s in states for q in s.ready_queues.due("y", later)] == ["y-7"]


def test_a_queue_timed_again_and_again_keeps_one_timer_and_comes_due_once():
    rq = ReadyQueues()
    for at in (500, 400, 450, 900, 300):
        rq.later("c", "q", at)
    rq.later("c", "other", 350)
    assert rq.next_at("c") == 300
    assert rq.due("c", 299) == []
    assert rq.due("c", 1000) == ["q", "other"]  # each once, the earliest time first
    assert rq.due("c", 2000) == [] and rq.size("c") == 0  # the caller decides what to add


async def test_a_per_queue_lease_first_makes_the_queues_consumer_with_the_prefix_settings(node):
    svc, work, prefix, _ = node
    await prefix.define("pm", {"prefix": "pm-", "max_attempts": 2, "max_in_flight": 2,
                               "dead_letter_queue": "dead-{queue}"})
    await _fill(svc, "pm-2", 6)
    first = await work.lease("pm-2", "pm", 1, 60_000, 0)
    assert len(first.records) == 1
    s = work.consumer_settings("pm-2", "pm")
    assert (s.max_attempts, s.dead_letter_queue, s.max_in_flight, s.prefix) == (
        2, "dead-pm-2", 2, "pm-")
    got = await prefix.lease("pm", 10, 60_000, 0)
    assert len(got.records) == 1  # the cap of 2 holds across both routes
    assert (await work.lease("pm-2", "pm", 10, 60_000, 0)).records == []


async def test_a_consumer_a_lease_made_before_the_prefix_consumer_follows_it_once_defined(
        node):
    svc, work, prefix, _ = node
    await _fill(svc, "late-q", 6)
    await work.lease("late-q", "late", 1, 60_000, 0)
    assert work.consumer_settings("late-q", "late").prefix is None
    await prefix.define("late", {"prefix": "late-", "max_attempts": 3, "max_in_flight": 2})
    got = await prefix.lease("late", 10, 60_000, 2000)  # once the queue takes its turn
    assert len(got.records) == 1
    s = work.consumer_settings("late-q", "late")
    assert (s.max_attempts, s.max_in_flight, s.prefix) == (3, 2, "late-")
    # and through the per-queue route too, once the prefix consumer changes
    await prefix.define("late", {"prefix": "late-", "max_attempts": 3, "max_in_flight": 3})
    assert len((await work.lease("late-q", "late", 10, 60_000, 0)).records) == 1
    assert work.consumer_settings("late-q", "late").max_in_flight == 3


async def test_an_acked_cursor_consumer_is_never_turned_into_a_lease_consumer(node):
    svc, work, prefix, _ = node
    await prefix.define("cur", {"prefix": "cu-"})
    await _fill(svc, "cu-a", 3)
    await _fill(svc, "cu-b", 3)
    await svc.ack("cu-a", "cur", 1, allow_rewind=False)
    with pytest.raises(VQError) as err:
        await work.lease("cu-a", "cur", 1, 60_000, 0)
    assert (err.value.code, err.value.details["mode"]) == ("consumer_mode_mismatch", "cursor")
    got = await prefix.lease("cur", 10, 60_000, 0)
    assert {r.queue for r in got.records} == {"cu-b"}  # the cursor keeps cu-a out
    s = work.consumer_settings("cu-a", "cur")
    assert (s.mode, s.offset) == ("cursor", 1)
    await work.configure("cu-a", "cur", "lease", None, False, None)  # the way to change it
    assert [r.record.offset for r in (await work.lease("cu-a", "cur", 10, 60_000, 0)).records
            ] == [1, 2]


async def test_a_dead_letter_queue_too_long_for_a_name_is_shortened_and_readable(node):
    svc, work, prefix, _ = node
    queue = "dl-" + "q" * 246  # 249 bytes: "dead-" makes its dead-letter queue 254
    await prefix.define("dl", {"prefix": "dl-", "max_attempts": 1,
                               "dead_letter_queue": "dead-{queue}"})
    await _fill(svc, queue, 1)
    got = await prefix.lease("dl", 1, 60_000, 0)
    await prefix.settle("dl", Settle(RETRY, 0, "boom"), [(queue, got.records[0].leased.token)])
    dlq = work.consumer_settings(queue, "dl").dead_letter_queue
    assert dlq is not None and len(dlq.encode()) == 249
    assert dlq.startswith("dead-dl-qqq") and dlq[-17] == "~"
    page = await svc.read(dlq, None, 0, 10, 0)
    assert [r.value for r in page.records] == [f"{queue}:0".encode()]
    assert dict(page.records[0].headers)["vq-dlq-source-queue"] == queue.encode()


async def test_put_with_the_prefix_puts_a_queues_consumer_back_under_the_prefix_consumer(node):
    svc, work, prefix, _ = node
    await prefix.define("back", {"prefix": "bk-", "max_attempts": 3, "max_in_flight": 1})
    await _fill(svc, "bk-q", 3)
    await work.configure("bk-q", "back", "lease", 9, False, None)  # set on its own
    assert work.consumer_settings("bk-q", "back").prefix is None
    with pytest.raises(VQError) as err:
        await work.configure("bk-q", "back", None, None, False, None, False, "other-")
    assert err.value.code == "invalid_parameter"
    with pytest.raises(VQError) as err:
        await work.configure("bk-q", "back", None, 4, False, None, False, "bk-")
    assert err.value.code == "invalid_parameter"
    s = await work.configure("bk-q", "back", None, None, False, None, False, "bk-")
    assert (s.max_attempts, s.max_in_flight, s.prefix) == (3, 1, "bk-")
    assert work.consumer_settings("bk-q", "back").prefix == "bk-"
    await prefix.define("back", {"prefix": "bk-", "max_attempts": 4, "max_in_flight": 2})
    assert len((await prefix.lease("back", 10, 60_000, 2000)).records) == 2
    assert work.consumer_settings("bk-q", "back").max_attempts == 4


async def test_a_prefix_consumers_durable_grants_reaches_its_queues_consumers(node):
    svc, work, prefix, _ = node
    info = await prefix.define("dg", {"prefix": "dg-", "durable_grants": True})
    assert info.durable_grants is True
    await _fill(svc, "dg-a", 2)
    got = await prefix.lease("dg", 10, 60_000, 0)
    assert len(got.records) == 2
    assert work.consumer_settings("dg-a", "dg").durable_grants is True
    await prefix.define("dg", {"prefix": "dg-"})  # the default: written behind
    await prefix.settle("dg", Settle(COMPLETE), [(r.queue, r.leased.token) for r in got.records])
    await _fill(svc, "dg-a", 1)
    assert len((await prefix.lease("dg", 10, 60_000, 2000)).records) == 1
    assert work.consumer_settings("dg-a", "dg").durable_grants is False


async def test_a_prefix_lease_completes_what_it_carries_in_each_partitions_write(node):
    svc, _, prefix, _ = node
    await prefix.define("ride", {"prefix": "rd-", "records_per_turn": 1})
    queues = [f"rd-{i}" for i in range(8)]
    for q in queues:
        await _fill(svc, q, 2)
    first = await prefix.lease("ride", 8, 60_000, 0)
    assert len(first.records) == 8
    pairs = [(r.queue, r.leased.token) for r in first.records]
    second = await prefix.lease("ride", 8, 60_000, 0,
                                complete=[*pairs, ("rd-0", "bogus"), ("rd-1", "7.9.abc")])
    assert second.completed is not None and second.refused is not None
    assert sorted((t.queue, t.token) for t in second.completed) == sorted(pairs)
    assert sorted((r.queue, r.token, r.code) for r in second.refused) == [
        ("rd-0", "bogus", "invalid_token"), ("rd-1", "7.9.abc", "lease_expired")]
    assert len(second.records) == 8
    assert not {r.leased.record.offset for r in second.records} & \
        {r.leased.record.offset for r in first.records if r.queue == "rd-0"}
    for q in queues:
        info = next(c for c in svc.queue_info(q).consumers if c.consumer == "ride")
        assert (info.in_flight, info.lag) == (1, 1)  # one done, one leased
    with pytest.raises(VQError) as err:
        await prefix.lease("ride", 1, 60_000, 0, complete=[("elsewhere", "1.1.a")])
    assert err.value.code == "invalid_parameter"
    # one queue, one partition: the completions and the grants make one write
    await _fill(svc, "rd-solo", 4)
    solo = await prefix.lease("ride", 20, 60_000, 0)
    mine = [(r.queue, r.leased.token) for r in solo.records if r.queue == "rd-solo"]
    assert mine
    writes = svc.entries.writes
    page = await prefix.lease("ride", 20, 60_000, 0, complete=mine)
    assert len(page.completed or []) == len(mine)
    assert svc.entries.writes - writes == 1


async def test_a_prefix_lease_with_nothing_to_lease_still_writes_its_completions(node):
    svc, _, prefix, logs = node
    await prefix.define("ride2", {"prefix": "r2-"})
    await _fill(svc, "r2-a", 1)
    got = await prefix.lease("ride2", 5, 60_000, 0)
    page = await prefix.lease("ride2", 5, 60_000, 0,
                              complete=[(r.queue, r.leased.token) for r in got.records])
    assert page.records == [] and len(page.completed or []) == 1
    info = next(c for c in svc.queue_info("r2-a").consumers if c.consumer == "ride2")
    assert (info.in_flight, info.lag) == (0, 0)
    # the completion is durable: a new owner has it
    svc2, _ = await work_node(logs[0], logs[1], svc.settings, logs[2], PARTITIONS, 1 << 26)
    try:
        info = next(c for c in svc2.queue_info("r2-a").consumers if c.consumer == "ride2")
        assert info.lag == 0
    finally:
        svc2.close()
