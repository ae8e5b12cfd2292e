"""Consumers' committed offsets, read through their queue's deletion floor."""

from array import array

from vqueues.state import committed_offsets as co
from vqueues.state.queue_index import NO_CONSUMERS, QueueIndex, StatefulQueueIndex
from vqueues.state.queue_map import QueueMap


def test_a_first_consumer_makes_its_queue_stateful_and_others_share_nothing():
    queues = QueueMap()
    plain = queues["q"] = QueueIndex()
    queues["r"] = QueueIndex()
    co.commit(queues, "q", plain, "c", 3, 100)
    q = queues["q"]
    assert isinstance(q, StatefulQueueIndex) and q.consumers == {"c": (3, 100)}
    assert queues["r"].consumers is NO_CONSUMERS and NO_CONSUMERS == {}
    co.commit(queues, "q", q, "d", 5, 200)
    assert queues["q"] is q and co.committed(q, "d") == 5


def test_a_committed_offset_below_the_deletion_floor_reads_as_the_floor():
    q = StatefulQueueIndex()
    q.consumers = {"c": (2, 0)}
    q.deleted_before = 7
    assert co.committed(q, "c") == 7
    assert co.committed(q, "missing") is None and co.committed(None, "c") is None


def test_idle_and_expired_consumers_by_their_last_ack():
    q = StatefulQueueIndex()
    q.consumers = {"old": (0, 100), "new": (0, 900)}
    assert co.idle(q, "old", 500) and not co.idle(q, "new", 500)
    assert not co.idle(q, "missing", 500) and not co.idle(None, "old", 500)
    assert co.walk([("q", q)], 10**9, 500).idle == [("q", "old")]
    assert co.walk([("q", q)], 10**9, 500).oldest_ack == 100
    assert co.walk([("q", q)], 10**9, None).oldest_ack is None


def test_lags_and_stats_count_retained_records_from_the_committed_offset():
    q = StatefulQueueIndex(array("q", [3, 5, 8, 9]))
    q.consumers = {"b": (8, 0), "a": (0, 0)}
    assert sorted(co.walk([("q", q)], -1, None).lags) == [(2, "q", "b"), (4, "q", "a")]
    assert co.walk([("q", q)], 2, None).lags == [(4, "q", "a")]  # only those over `above`
    s = co.stats("q", q)
    assert (s.queue, s.records, s.first_offset, s.last_offset) == ("q", 4, 3, 9)
    assert list(s.consumers.items()) == [("a", (0, 4)), ("b", (8, 2))]
    empty = co.stats("e", QueueIndex())
    assert (empty.records, empty.first_offset, empty.last_offset) == (0, None, None)
