"""Consumer settings and lease windows as the offset topic's entries make them."""

from array import array
from typing import cast

from vqueues.records import ConsumerConfigured, DeliveryCleared, DeliveryUpdated
from vqueues.state.consumer_config import CURSOR, LEASE
from vqueues.state.lease_windows import LeaseWindows

OFFSETS = array("q", [2, 4, 6, 8])


def configured(mode, queue="q", consumer="w"):
    return ConsumerConfigured(queue, consumer, mode, 5, None, 30_000)


def test_a_lease_consumer_starts_its_window_at_its_committed_offset():
    w = LeaseWindows()
    w.configured(configured(LEASE), committed=4)
    assert w.configs[("q", "w")].mode == LEASE and w.windows[("q", "w")].frontier == 4
    w.configured(configured(LEASE), committed=8)  # settings again: the window stays
    assert w.windows[("q", "w")].frontier == 4
    w.configured(configured(CURSOR), committed=4)
    assert ("q", "w") not in w.windows and w.configs[("q", "w")].mode == CURSOR


def test_deliveries_are_leased_completed_and_cleared():
    w = LeaseWindows()
    w.configured(configured(LEASE), committed=2)
    w.delivery_updated(DeliveryUpdated("q", "w", 4, 1, 99, True, False, "k", None), 2,
                       lambda q: OFFSETS)
    work = w.windows[("q", "w")]
    assert work.deliveries[4].attempts == 1 and work.deliveries[4].order_key == "k"
    assert work.frontier == 5
    w.delivery_updated(DeliveryUpdated("q", "w", 4, 0, 0, False, True), 2, lambda q: OFFSETS)
    assert 4 not in work.deliveries and 4 in work.done
    w.delivery_updated(DeliveryUpdated("q", "w", 6, 1, 99, True, False), 2, lambda q: OFFSETS)
    w.delivery_cleared(DeliveryCleared("q", "w", 6))
    assert 6 not in work.deliveries


def test_an_update_below_the_committed_offset_is_settled_already():
    w = LeaseWindows()
    w.configured(configured(LEASE), committed=6)

    def never(queue):
        raise AssertionError("offsets asked for")

    w.delivery_updated(DeliveryUpdated("q", "w", 4, 0, 0, False, True), 6, never)
    assert not w.windows[("q", "w")].deliveries and 4 not in w.windows[("q", "w")].done


def test_an_ack_moves_the_low_water_mark_and_settles_below_it():
    w = LeaseWindows()
    w.configured(configured(LEASE), committed=2)
    w.delivery_updated(DeliveryUpdated("q", "w", 2, 1, 99, True, False), 2, lambda q: OFFSETS)
    w.acked("q", "w", 6, dead_lettered=3)
    work = w.windows[("q", "w")]
    assert work.frontier == 6 and not work.deliveries and work.dead_lettered == 3
    w.acked("q", "other", 6, 0)  # a cursor consumer: nothing here


def test_a_deleted_queue_or_consumer_leaves_nothing_behind():
    w = LeaseWindows()
    for queue, consumer in (("q", "a"), ("q", "b"), ("r", "a")):
        w.configured(configured(LEASE, queue, consumer), committed=0)
    w.forget("q", "a")
    assert set(w.configs) == set(w.windows) == {("q", "b"), ("r", "a")}
    w.drop_queue("q")
    assert set(w.configs) == set(w.windows) == {("r", "a")}


def test_tombstones_cover_every_delivery_key_and_the_window():
    w = LeaseWindows()
    assert w.tombstones("q", "w", OFFSETS, 0) == []
    w.configured(configured(LEASE), committed=2)
    w.delivery_updated(DeliveryUpdated("q", "w", 6, 1, 99, True, False), 2, lambda q: OFFSETS)
    # No window keys were written: every tombstone is a per-record one.
    assert [cast(DeliveryCleared, e).offset for e in w.tombstones("q", "w", OFFSETS, 2)] == [
        2, 4, 6]
    assert [cast(DeliveryCleared, e).offset for e in w.tombstones("q", "w", None, 2)] == [6]


def test_its_snapshot_section_restores_the_same_windows():
    w = LeaseWindows()
    w.configured(configured(LEASE), committed=2)
    w.delivery_updated(DeliveryUpdated("q", "w", 4, 2, 99, False, False, "k", "why"), 2,
                       lambda q: OFFSETS)
    w.delivery_updated(DeliveryUpdated("q", "w", 6, 0, 0, False, True), 2, lambda q: OFFSETS)
    w.acked("q", "w", 2, 1)
    configs, work = w.capture()
    fresh = LeaseWindows()
    fresh.restore(configs, work)
    assert fresh.configs == w.configs
    a, b = fresh.windows[("q", "w")], w.windows[("q", "w")]
    assert (a.frontier, a.dead_lettered, list(a.done.ranges())) == \
        (b.frontier, b.dead_lettered, list(b.done.ranges()))
    d = a.deliveries[4]
    assert (d.attempts, d.until, d.leased, d.order_key, d.reason) == (2, 99, False, "k", "why")


def test_seek_finds_what_bisect_finds_from_any_hint():
    import random
    from bisect import bisect_left

    from vqueues.state.queue_index import seek
    rnd = random.Random(7)
    for _ in range(300):
        offsets = array("q", sorted(rnd.sample(range(5000), rnd.randint(0, 1200))))
        for _ in range(20):
            offset = rnd.randint(-5, 5005)
            hint = rnd.randint(0, len(offsets) + 10)
            assert seek(offsets, offset, hint) == bisect_left(offsets, offset)


def test_a_snapshot_row_of_an_older_format_restores_without_cap_or_prefix():
    windows = LeaseWindows()
    windows.restore([("q", "c", LEASE, 3, None, 1000)], [])
    config = windows.configs[("q", "c")]
    assert (config.max_attempts, config.max_in_flight, config.prefix) == (3, None, None)
    rows, _ = windows.capture()
    assert rows == [("q", "c", LEASE, 3, None, 1000, None, None, False, None)]
    # format 7's rows end after the prefix: grants written behind (ADR 16)
    windows.restore([("q", "c", LEASE, 3, None, 1000, 2, "q")], [])
    config = windows.configs[("q", "c")]
    assert (config.max_in_flight, config.prefix, config.durable_grants) == (2, "q", False)
    windows.restore([("q", "c", LEASE, 3, None, 1000, 2, "q", True)], [])
    assert windows.configs[("q", "c")].durable_grants is True
    assert windows.configs[("q", "c")].attributes == ()  # format 8's rows end there


def test_a_consumers_attributes_survive_capture_and_restore():
    windows = LeaseWindows()
    row = ("q", "sqs", LEASE, 3, None, 1000, None, None, True, {"b": "2", "a": "1"})
    windows.restore([row], [])
    assert windows.configs[("q", "sqs")].attributes == (("a", "1"), ("b", "2"))
    rows, _ = windows.capture()
    assert rows == [("q", "sqs", LEASE, 3, None, 1000, None, None, True, {"a": "1", "b": "2"})]
