"""The node's request limits, published in the cluster map, and the Python client's
multi-queue enqueues against a real node: requests kept within them, a 413 split, a bad record
failed alone."""

import asyncio
import re
import uuid
from typing import cast

import pytest
from vqueues_client import AsyncClient, BatchProducer, NewRecord, VQError
from vqueues_client.types import Value

from tests.narrow import failed_with, known
from tests.support import NodeProcess, http

MAX_BODY, MAX_RECORD = 256 * 1024, 64 * 1024
SETTLE_S = 60  # a send that never settles fails the test instead of hanging it


@pytest.fixture(scope="module")
def small_node(topics):
    """A node whose body and record limits are far below their defaults."""
    n = NodeProcess(topics, extra_env={"VQ_MAX_BODY_BYTES": str(MAX_BODY),
                                       "VQ_MAX_RECORD_BYTES": str(MAX_RECORD),
                                       "VQ_MAX_BATCH_RECORDS": "500"}).start()
    try:
        yield n
    finally:
        n.terminate()


def run_id() -> str:
    return uuid.uuid4().hex[:6]


def values(node, queue):
    body = http("GET", f"{node.url}/v1/queues/{queue}/records?limit=1000")[1]
    return [r["value"] for r in body["records"]]


def test_the_cluster_map_publishes_the_nodes_request_limits(small_node):
    status, body = http("GET", f"{small_node.url}/v1/partitions")
    assert status == 200
    assert body["limits"] == {"max_body_bytes": MAX_BODY, "max_batch_records": 500,
                              "max_record_bytes": MAX_RECORD}
    schema = http("GET", f"{small_node.url}/v1/openapi.json")[1]["components"]["schemas"]
    assert "limits" in schema["PartitionsInfo"]["required"]
    assert set(schema["NodeLimits"]["properties"]) == set(body["limits"])


async def test_the_batch_producer_sends_within_the_published_body_limit(small_node):
    run = run_id()
    queues = [f"lim-{run}-{i}" for i in range(10)]
    async with AsyncClient(small_node.url) as vq:
        async with BatchProducer(vq, linger_ms=50) as producer:
            # 100 records of 17 KB: 1.7 MB, in one linger window
            sent = [producer.send_nowait(queues[i % 10], f"{i:04}" + "x" * 17_000)
                    for i in range(100)]
            offsets = await asyncio.wait_for(asyncio.gather(*sent), SETTLE_S)
        assert (vq.max_body_bytes, vq.max_record_bytes, vq.max_records_per_call) == \
            (MAX_BODY, MAX_RECORD, 500)
        assert producer.requests >= 7
    assert all(isinstance(o, int) for o in offsets)
    for k, q in enumerate(queues):
        assert [v[:4] for v in values(small_node, q)] == [f"{i:04}" for i in range(k, 100, 10)]


async def test_a_client_assuming_a_larger_limit_splits_on_the_nodes_413(small_node):
    run = run_id()
    items = [(f"split-{run}-{i % 10}", f"{i:04}" + "y" * 17_000) for i in range(100)]
    async with AsyncClient(small_node.url, refresh_interval_s=3600) as vq:
        await vq.refresh_map()
        vq.max_body_bytes = 16 * 1024 * 1024  # as a client that has not seen the map yet
        # the same str pairs go to `producer.send` (a Value) below; `list` is invariant
        results = await vq.enqueue_many(cast(list[tuple[str, Value | NewRecord]], items))
        assert vq.max_body_bytes < 16 * 1024 * 1024
        vq.max_body_bytes = 16 * 1024 * 1024
        async with BatchProducer(vq, linger_ms=50) as producer:
            offsets = await asyncio.wait_for(
                asyncio.gather(*(producer.send(q, v) for q, v in items)), SETTLE_S)
    assert all(r.ok for r in results), [r.error for r in results if r.error][:2]
    assert all(isinstance(o, int) for o in offsets)
    for k in range(10):
        expected = [f"{i:04}" for i in range(k, 100, 10)]
        assert [v[:4] for v in values(small_node, f"split-{run}-{k}")] == expected * 2


async def test_a_record_the_node_refuses_fails_alone_and_the_others_are_written(small_node):
    run = run_id()
    good = [f"good-{run}-{i}" for i in range(20)]
    async with AsyncClient(small_node.url) as vq:
        producer = BatchProducer(vq, linger_ms=50)
        sent = [producer.send_nowait(q, "v") for q in good[:10]]
        bad = producer.send_nowait(f"bad-{run}", "v", tags=["a,b"])  # the node refuses it
        big = producer.send_nowait(f"big-{run}", "z" * (MAX_RECORD + 1))
        sent += [producer.send_nowait(q, "v") for q in good[10:]]
        await asyncio.wait_for(producer.flush(), SETTLE_S)
        results = await vq.enqueue_many([
            *((q, "w") for q in good[:5]), (f"bad-{run}", NewRecord("v", tags=["a,b"])),
            *((q, "w") for q in good[5:])])
    assert all(isinstance(f.result(), int) for f in sent)
    err = failed_with(bad, VQError)
    assert (err.status, err.code, err.retriable) == (400, "invalid_record", False)
    assert f"'bad-{run}'" in err.message and not re.search(r"records\[\d+\]", err.message)
    assert failed_with(big, VQError).code == "record_too_large"
    assert [i for i, r in enumerate(results) if not r.ok] == [5]
    error = known(results[5].error)
    assert error.code == "invalid_record" and "records[5]" in error.message
    for q in good:
        assert values(small_node, q) == ["v", "w"]
    assert values(small_node, f"bad-{run}") == [] and values(small_node, f"big-{run}") == []
