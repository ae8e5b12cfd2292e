"""Enqueue and read through real HTTP against a node on the real broker."""

import asyncio
import base64
import time
import uuid

import pytest

from tests.http_calls import qname
from tests.support import enqueue, read
from vqueues.hashing import partition_for


@pytest.mark.both_brokers
async def test_enqueued_records_are_read_back_in_order_with_headers(client, node, topics):
    q = qname()
    body = await enqueue(client, node, q, "one", "two", "three", headers={"trace": "t-1"})
    assert body["partition"] == partition_for(q, topics.partitions)
    assert len(body["offsets"]) == 3 and body["offsets"] == sorted(body["offsets"])
    got = await read(client, node, q)
    assert [r["value"] for r in got["records"]] == ["one", "two", "three"]
    assert [r["offset"] for r in got["records"]] == body["offsets"]
    assert all(r["headers"] == {"trace": "t-1"} for r in got["records"])
    assert all(r["timestamp"] > 1_600_000_000_000 for r in got["records"])
    assert got["next_offset"] == body["offsets"][-1] + 1


async def test_base64_round_trips_arbitrary_bytes(client, node):
    q = qname()
    payload = bytes(range(256))
    async with client.post(f"{node.url}/v1/queues/{q}/records", json={"records": [
            {"value": base64.b64encode(payload).decode(), "encoding": "base64"}]}) as r:
        assert r.status == 200
    got = await read(client, node, q, encoding="base64")
    assert base64.b64decode(got["records"][0]["value"]) == payload
    # Asked for utf8, a value that is not UTF-8 comes back base64 and says so.
    got = await read(client, node, q)
    assert got["records"][0]["encoding"] == "base64"
    assert base64.b64decode(got["records"][0]["value"]) == payload


async def test_null_values_are_kept(client, node):
    q = qname()
    async with client.post(f"{node.url}/v1/queues/{q}/records",
                           json={"records": [{"value": None}]}) as r:
        assert r.status == 200
    assert (await read(client, node, q))["records"][0]["value"] is None


async def test_explicit_offset_and_limit_page_through_a_queue(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, *[f"m{i}" for i in range(10)]))["offsets"]
    page1 = await read(client, node, q, limit=4)
    assert [r["value"] for r in page1["records"]] == ["m0", "m1", "m2", "m3"]
    page2 = await read(client, node, q, offset=page1["next_offset"], limit=4)
    assert [r["value"] for r in page2["records"]] == ["m4", "m5", "m6", "m7"]
    tail = await read(client, node, q, offset=offsets[8])
    assert [r["value"] for r in tail["records"]] == ["m8", "m9"]


async def test_an_empty_read_still_returns_next_offset(client, node):
    q = qname()
    got = await read(client, node, q)
    assert got["records"] == [] and got["next_offset"] == 0
    offsets = (await enqueue(client, node, q, "a"))["offsets"]
    got = await read(client, node, q, offset=offsets[0] + 1)
    assert got["records"] == [] and got["next_offset"] == offsets[0] + 1


@pytest.mark.both_brokers
async def test_a_read_starts_at_the_consumers_committed_offset(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "a", "b", "c"))["offsets"]
    async with client.post(f"{node.url}/v1/queues/{q}/consumers/worker/ack",
                           json={"offset": offsets[1]}) as r:
        assert r.status == 200
    got = await read(client, node, q, consumer="worker")
    assert [r["value"] for r in got["records"]] == ["b", "c"]
    # A consumer without a committed offset starts at the first retained record.
    got = await read(client, node, q, consumer="newcomer")
    assert [r["value"] for r in got["records"]] == ["a", "b", "c"]


@pytest.mark.both_brokers
async def test_a_long_poll_returns_as_soon_as_a_record_arrives(client, node):
    q = qname()
    start = (await read(client, node, q))["next_offset"]
    t0 = time.monotonic()
    reader = asyncio.create_task(read(client, node, q, offset=start, wait_ms=20000))
    await asyncio.sleep(0.5)
    assert not reader.done()
    await enqueue(client, node, q, "wake up")
    got = await asyncio.wait_for(reader, 10)
    waited = time.monotonic() - t0
    assert [r["value"] for r in got["records"]] == ["wake up"]
    assert waited < 5, f"long poll took {waited:.1f}s to notice the record"


async def test_a_long_poll_with_nothing_to_read_ends_after_wait_ms(client, node):
    q = qname()
    t0 = time.monotonic()
    got = await read(client, node, q, wait_ms=600)
    waited = time.monotonic() - t0
    assert got["records"] == []
    assert 0.55 <= waited < 5


async def test_records_of_other_queues_do_not_wake_or_appear(client, node, topics):
    q = qname()
    other = next(f"o-{i}" for i in range(10**6)
                 if partition_for(f"o-{i}", topics.partitions)
                 == partition_for(q, topics.partitions))
    await enqueue(client, node, other, "not yours")
    got = await read(client, node, q, wait_ms=300)
    assert got["records"] == []


async def test_queue_names_with_slashes_colons_and_unicode_work(client, node):
    for q in ("tenant-42/jobs/" + uuid.uuid4().hex[:6], "a::b::" + uuid.uuid4().hex[:6],
              "ünïcødé-😀-" + uuid.uuid4().hex[:6]):
        from urllib.parse import quote
        path = quote(q, safe="")
        async with client.post(f"{node.url}/v1/queues/{path}/records",
                               json={"records": [{"value": q}]}) as r:
            assert r.status == 200, await r.text()
        async with client.get(f"{node.url}/v1/queues/{path}/records") as r:
            assert [x["value"] for x in (await r.json())["records"]] == [q]
        async with client.get(f"{node.url}/v1/queues/{path}") as r:
            assert (await r.json())["queue"] == q


async def produce_requests(client, node) -> float:
    """The node's data-topic produce requests so far (librdkafka's statistics, every second)."""
    await asyncio.sleep(1.2)
    async with client.get(f"{node.url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith('vq_produce_requests_total{topic="data"}'):
                return float(line.split()[-1])
    raise AssertionError("no vq_produce_requests_total for the data topic")


async def test_concurrent_single_record_enqueues_to_one_partition_share_produce_requests(
        client, node, topics):
    """A write made while others are in flight goes through the lingering producer, so
    concurrent single-record enqueues to one partition reach the broker in a few produce
    requests, as a multi-queue call's records do; a lone write goes out at once."""
    run = uuid.uuid4().hex[:6]
    queues = [q for q in (f"co-{run}-{i}" for i in range(2000))
              if partition_for(q, topics.partitions) == 3][:40]
    before = await produce_requests(client, node)
    for _ in range(3):
        answers = await asyncio.gather(*(enqueue(client, node, q, f"v-{q}") for q in queues))
        assert all(a["partition"] == 3 for a in answers)
    after = await produce_requests(client, node)
    sent = after - before
    print(f"\n{3 * len(queues)} concurrent single-record enqueues to one partition: "
          f"{sent:.0f} produce requests")
    assert 1 <= sent <= 3 * len(queues) / 4
    for q in queues:  # each readable, once
        assert [r["value"] for r in (await read(client, node, q))["records"]] == [f"v-{q}"] * 3
