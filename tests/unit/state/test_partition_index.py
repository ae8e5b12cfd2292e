"""A partition's queue index: offsets, listing, deletion floors and retention."""

from tests.narrow import known
from vqueues.records import Record
from vqueues.state.partition_index import PartitionIndex


def rec(offset):
    return Record(offset, 1, b"v", ())


def test_appended_records_list_their_queue_in_name_order():
    index = PartitionIndex()
    assert index.append("b", [rec(0), rec(1)]) and index.append("a", [rec(2)])
    assert list(index.names) == ["a", "b"] and index.select("b", 1, 10) == [1]
    assert list(index.queue_names("a", after="a")) == ["b"]
    assert index.end_of("b", 0) == 2 and index.end_of("none", 4) == 4
    assert index.first_offset("a") == 2 and index.first_offset("none") == 0


def test_records_below_a_deletion_floor_are_dropped():
    index = PartitionIndex()
    index.append("q", [rec(0), rec(1)])
    index.commit("q", "c", 1, 0)
    assert index.delete("q", 5) == 5
    assert index.delete("q", 3) == 5  # a floor never goes down
    assert list(index.names) == [] and index.committed("q", "c") is None
    assert list(index.append("q", [rec(4)])) == []
    assert list(index.append("q", [rec(4), rec(6)])) == [rec(6)]
    assert index.select("q", 0, 10) == [6] and index.first_offset("q") == 6


def test_a_consumer_keeps_an_empty_queue_listed_until_it_is_deleted():
    index = PartitionIndex()
    index.commit("q", "c", 0, 0)
    assert list(index.names) == ["q"] and known(index.stats("q")).records == 0
    index.delete_consumer("q", "c")
    assert list(index.names) == [] and "q" not in index.queues and index.stats("q") is None


def test_retention_trims_queues_and_drops_the_empty_ones_but_keeps_a_floor_above_it():
    index = PartitionIndex()
    index.append("a", [rec(0), rec(1), rec(4)])
    index.append("b", [rec(2)])
    index.delete("c", 9)  # a deletion floor above the log start
    trimmed = []
    dropped = index.trim(3, list(index.queues), lambda q, below: trimmed.append((q, below)))
    assert dropped == 1 and sorted(trimmed) == [("a", 3), ("b", 3)]
    assert index.log_start == 3 and index.select("a", 0, 10) == [4]
    assert list(index.names) == ["a"] and "b" not in index.queues and "c" in index.queues
    assert index.trim(9, list(index.queues), lambda q, below: None) == 2
    assert len(index.queues) == 0
