"""The Spark source's range planning, without Spark or a broker: failOnDataLoss, the queue
filter's partitions, minPartitions."""

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra (pyspark) is not installed")

from vqueues.hashing import partition_for
from vqueues.pipeline.source import Reading, plan

pytestmark = pytest.mark.unit


def test_offsets_deleted_by_retention_fail_the_read_unless_told_otherwise():
    start, end, earliest = {"0": 5, "1": 0}, {"0": 100, "1": 10}, {"0": 40, "1": 0}
    with pytest.raises(RuntimeError, match="failOnDataLoss"):
        plan("t", start, end, earliest, Reading(), 2)
    ranges = plan("t", start, end, earliest, Reading(fail_on_data_loss=False), 2)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 40, 100), (1, 0, 10)]


def test_a_queue_filter_plans_only_the_partitions_its_queues_route_to():
    end = {str(p): 10 for p in range(8)}
    start = dict.fromkeys(end, 0)
    ranges = plan("t", start, end, start, Reading(queues=("a", "b")), 8)
    assert {r.partition for r in ranges} == {partition_for("a", 8), partition_for("b", 8)}


def test_min_partitions_splits_the_largest_ranges():
    ranges = plan("t", {"0": 0, "1": 0}, {"0": 100, "1": 3}, {}, Reading(min_partitions=6), 2)
    assert len(ranges) >= 6
    covered = sorted((r.partition, r.start, r.end) for r in ranges)
    assert sum(e - s for _, s, e in covered) == 103
