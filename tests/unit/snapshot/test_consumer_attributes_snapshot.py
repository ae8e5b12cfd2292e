"""A consumer's attributes (an SQS queue's, format 9) in snapshots; a format-8 snapshot, whose
settings rows end before them, still loads."""

import json

import pytest

from tests.narrow import known
from tests.unit.partitions import rec
from vqueues.records import ConsumerAcked, ConsumerConfigured
from vqueues.snapshot import wire
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import LEASE
from vqueues.state.partition_state import PartitionState

pytestmark = pytest.mark.unit

ATTRIBUTES = (("CreatedTimestamp", "1700000000"), ("DelaySeconds", "3"),
              ("FifoQueue", "true"))


def owner():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("orders.fifo", rec(0)), ("plain", rec(1))], None)
    s.apply_offset_entries([
        ConsumerAcked("orders.fifo", "sqs", 0, 1),
        ConsumerConfigured("orders.fifo", "sqs", LEASE, 4, "dead.fifo", 30_000, None, None,
                           True, ATTRIBUTES),
        ConsumerAcked("plain", "workers", 0, 1),
        ConsumerConfigured("plain", "workers", LEASE, 5, None, 1000)])
    return s


async def loaded_from(chunks, manifest):
    image = known(latest(0, [*chunks, (manifest_key(0), manifest)]))
    fresh = PartitionState(0, RecordCache(1 << 20))
    restore(fresh, image, build(image))
    return fresh


async def test_attributes_survive_a_snapshot():
    s = owner()
    fresh = await loaded_from(*encode(await capture(s, 0), 1))
    assert fresh.configs[("orders.fifo", "sqs")] == s.configs[("orders.fifo", "sqs")]
    assert fresh.configs[("orders.fifo", "sqs")].attributes == ATTRIBUTES
    assert fresh.configs[("plain", "workers")].attributes == ()


async def test_a_format_8_snapshot_loads_with_no_attributes(monkeypatch):
    image = await capture(owner(), 0)
    image.configs = [row[:9] for row in image.configs]  # format 8's rows
    monkeypatch.setattr(wire, "FORMAT_VERSION", 8)
    chunks, manifest = encode(image, 1)
    assert json.loads(manifest)["v"] == 8
    fresh = await loaded_from(chunks, manifest)
    config = fresh.configs[("orders.fifo", "sqs")]
    assert (config.max_attempts, config.durable_grants, config.attributes) == (4, True, ())
