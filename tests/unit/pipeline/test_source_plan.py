"""The Spark source's range planning, without Spark or a broker: failOnDataLoss, the queue
filter's partitions in every layout, minPartitions, where the deletion markers are."""

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra (pyspark) is not installed")

from vqueues.hashing import partition_for
from vqueues.pipeline.source import Reading, deletion_partitions, plan

pytestmark = pytest.mark.unit


def test_offsets_deleted_by_retention_fail_the_read_unless_told_otherwise():
    start, end = {"t": {"0": 5, "1": 0}}, {"t": {"0": 100, "1": 10}}
    earliest = {"t": {"0": 40, "1": 0}}
    with pytest.raises(RuntimeError, match="failOnDataLoss"):
        plan(start, end, earliest, Reading(), {"t": 2})
    ranges = plan(start, end, earliest, Reading(fail_on_data_loss=False), {"t": 2})
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 40, 100), (1, 0, 10)]


def test_a_queue_filter_plans_only_the_partitions_its_queues_route_to():
    end = {"t": {str(p): 10 for p in range(8)}}
    start = {"t": dict.fromkeys(end["t"], 0)}
    ranges = plan(start, end, start, Reading(queues=("a", "b")), {"t": 8})
    assert {r.partition for r in ranges} == {partition_for("a", 8), partition_for("b", 8)}


def test_a_queue_filter_plans_in_each_layout_the_partition_the_queue_had_there():
    queues = ("orders", "tenant/42/jobs", "k=v")
    end = {"vq-data": {str(p): 10 for p in range(4)},
           "vq-data.l1": {str(p): 10 for p in range(8)},
           "vq-data.l2": {str(p): 10 for p in range(32)}}
    start = {t: dict.fromkeys(parts, 0) for t, parts in end.items()}
    routes = {"vq-data": 4, "vq-data.l1": 8, "vq-data.l2": 32}
    ranges = plan(start, end, start, Reading(queues=queues), routes)
    got = {(r.topic, r.partition) for r in ranges}
    assert got == {(t, partition_for(q, n)) for t, n in routes.items() for q in queues}
    assert {r.route for r in ranges if r.topic == "vq-data.l1"} == {8}


def test_min_partitions_splits_the_largest_ranges():
    ranges = plan({"t": {"0": 0, "1": 0}}, {"t": {"0": 100, "1": 3}}, {},
                  Reading(min_partitions=6), {"t": 2})
    assert len(ranges) >= 6
    covered = sorted((r.partition, r.start, r.end) for r in ranges)
    assert sum(e - s for _, s, e in covered) == 103


def test_deletion_markers_are_read_in_the_layout_and_where_its_queues_moved_later():
    names = [f"queue-{i}" for i in range(2000)]
    where = deletion_partitions(0, 1, 4, ((1, 8), (2, 32)))
    assert where == {0: [1], 1: [1, 5], 2: [1, 5, 9, 13, 17, 21, 25, 29]}
    # Exactly the partitions the queues of partition 1 (of 4) route to in each later layout.
    mine = [q for q in names if partition_for(q, 4) == 1]
    assert {partition_for(q, 8) for q in mine} == set(where[1])
    assert {partition_for(q, 32) for q in mine} == set(where[2])
    assert deletion_partitions(1, 5, 8, ((2, 32),)) == {1: [5], 2: [5, 13, 21, 29]}
    assert deletion_partitions(1, 5, 8, ()) == {1: [5]}


def test_deletion_markers_carry_the_later_layouts_only_when_skipping_deleted_queues():
    end = {"vq-data": {"0": 3}, "vq-data.l1": {"0": 3}}
    start = {t: {"0": 0} for t in end}
    routes, layouts = {"vq-data": 4, "vq-data.l1": 8}, {0: 4, 1: 8, 2: 16}
    ranges = plan(start, end, start, Reading(deletion_topic="vq-offsets"), routes, layouts)
    assert {r.topic: r.later for r in ranges} == {"vq-data": ((1, 8), (2, 16)),
                                                  "vq-data.l1": ((2, 16),)}
    assert all(r.later == () for r in plan(start, end, start, Reading(), routes, layouts))
