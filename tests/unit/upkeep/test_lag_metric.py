"""vq_consumer_lag_top: the consumers furthest behind, computed in the maintenance pass's chunks
and exported with a bounded label set; and vq_event_loop_lag_seconds, the loop's own lag."""

import pytest
from prometheus_client import generate_latest

from tests.narrow import known
from vqueues.metrics import Metrics
from vqueues.records import ConsumerAcked, Record
from vqueues.state import committed_offsets
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState

pytestmark = pytest.mark.unit


def test_lags_are_counted_per_consumer_and_exported_for_the_furthest_behind():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", Record(i, 0, b"", ())) for i in range(10)], None)
    s.apply_offset_entries([ConsumerAcked("a", "slow", 2), ConsumerAcked("a", "fast", 9)])
    lags = sorted(committed_offsets.walk(s.queues.items(), -1, None).lags)
    assert lags == [(1, "a", "fast"), (8, "a", "slow")]
    m = Metrics()
    m.lag_source = lambda: [(8, "a", "slow")]
    text = generate_latest(m.registry).decode()
    assert 'vq_consumer_lag_top{consumer="slow",queue="a"} 8.0' in text


async def test_a_blocked_loop_shows_in_the_loop_lag_metric():
    import asyncio
    import time

    from vqueues.metrics import Metrics
    from vqueues.upkeep.maintenance import Maintenance

    m = Maintenance.__new__(Maintenance)  # only the metrics are needed here
    m.metrics = Metrics()
    task = asyncio.create_task(m.loop_lag_forever(every_s=0.01))
    await asyncio.sleep(0.03)
    time.sleep(0.12)  # a loop blocked for 120 ms runs its 10 ms timer at least 100 ms late  # noqa: ASYNC251
    await asyncio.sleep(0.03)
    task.cancel()
    worst = m.metrics.registry.get_sample_value("vq_event_loop_lag_max_seconds")
    assert worst is not None and worst >= 0.1
    assert known(m.metrics.registry.get_sample_value("vq_event_loop_lag_seconds_count")) >= 3
