"""vq_consumer_lag_top: the consumers furthest behind, computed in the maintenance pass's chunks
and exported with a bounded label set."""

import pytest
from prometheus_client import generate_latest

from vqueues.cache import RecordCache
from vqueues.metrics import Metrics
from vqueues.partition_state import PartitionState
from vqueues.records import ConsumerAcked, Record

pytestmark = pytest.mark.unit


def test_lags_are_counted_per_consumer_and_exported_for_the_furthest_behind():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", Record(i, 0, b"", ())) for i in range(10)], None)
    s.apply_offset_entries([ConsumerAcked("a", "slow", 2), ConsumerAcked("a", "fast", 9)])
    lags = sorted(s.consumer_lags(["a", "missing"]))
    assert lags == [(1, "a", "fast"), (8, "a", "slow")]
    m = Metrics()
    m.lag_source = lambda: [(8, "a", "slow")]
    text = generate_latest(m.registry).decode()
    assert 'vq_consumer_lag_top{consumer="slow",queue="a"} 8.0' in text
