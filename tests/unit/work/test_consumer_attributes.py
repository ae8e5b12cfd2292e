"""Attributes kept with a consumer's settings (an SQS queue's, ADR 17): written to the offset
topic and replayed by a new owner, never expired by consumer_retention_ms, kept through a
purge (a queue deletion that keeps one consumer)."""

import asyncio

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import work_node
from vqueues.settings import Settings
from vqueues.upkeep.maintenance import Maintenance

pytestmark = pytest.mark.unit
ATTRIBUTES = {"CreatedTimestamp": "1700000000", "DelaySeconds": "2"}


async def test_attributes_are_replayed_by_a_new_owner(node, settings):
    _, work, data_log, offset_log = node
    await work.configure("q", "sqs", "lease", 3, None, 1000, False, None, True, ATTRIBUTES)
    assert work.configs.attributes_of("q", "sqs") == ATTRIBUTES
    await work.configure("q", "sqs", None, 4, False, None)  # other settings keep them
    svc2, work2 = await work_node(data_log, offset_log, settings)
    assert work2.configs.attributes_of("q", "sqs") == ATTRIBUTES
    assert work2.consumer_settings("q", "sqs").max_attempts == 4
    assert work2.configs.with_attributes("sqs", "") == ["q"]
    assert work2.configs.with_attributes("sqs", "x") == []
    svc2.close()


async def test_a_consumer_with_attributes_never_expires():
    settings = Settings(write_visible_timeout_ms=1000, consumer_retention_ms=1)
    svc, work = await work_node(MemoryLog(), MemoryLog(), settings)
    await work.configure("kept", "sqs", "lease", 3, None, 1000, False, None, True, ATTRIBUTES)
    await work.configure("plain", "sqs", "lease", 3, None, 1000)
    await asyncio.sleep(0.01)
    await Maintenance(settings, svc.ownership, svc).follow_retention()
    assert [c.consumer for c in svc.queue_info("kept").consumers] == ["sqs"]
    assert svc.list_queues("plain", None, 10).queues == []  # its only consumer expired
    svc.close()


async def test_a_purge_drops_the_records_and_keeps_the_consumer(node):
    svc, work, _, _ = node
    await work.configure("p", "sqs", "lease", 3, None, 1000, False, None, True, ATTRIBUTES)
    await work.configure("p", "other", "lease", 3, None, 1000)
    await svc.enqueue("p", [(b"1", []), (b"2", [])])
    assert len((await work.lease("p", "sqs", 10, None, 0)).records) == 2
    await svc.delete_queue("p", keep="sqs")
    assert [c.consumer for c in svc.queue_info("p").consumers] == ["sqs"]
    assert work.configs.attributes_of("p", "sqs") == ATTRIBUTES
    assert (await work.lease("p", "sqs", 10, None, 0)).records == []
    await svc.enqueue("p", [(b"3", [])])
    assert [r.record.value for r in (await work.lease("p", "sqs", 10, None, 0)).records] == \
        [b"3"]
