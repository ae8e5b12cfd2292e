"""Concurrent producers and consumers on many queues: every record read exactly once, in order."""

import asyncio
import uuid

from tests.support import cursor_counts

QUEUES = 24
BATCHES = 10
PER_BATCH = 20


async def produce(client, node, queue, writer):
    for b in range(BATCHES):
        records = [{"value": f"{writer}:{b * PER_BATCH + i}"} for i in range(PER_BATCH)]
        async with client.post(f"{node.url}/v1/queues/{queue}/records",
                               json={"records": records}) as r:
            assert r.status == 200, await r.text()


async def consume(client, node, queue, expected):
    """Read with a named consumer, long-polling, acking each page after 'processing' it."""
    got: list[str] = []
    while len(got) < expected:
        async with client.get(f"{node.url}/v1/queues/{queue}/records",
                              params={"consumer": "worker", "limit": 37,
                                      "wait_ms": 2000}) as r:
            assert r.status == 200, await r.text()
            page = await r.json()
        if not page["records"]:
            continue
        got.extend(rec["value"] for rec in page["records"])
        async with client.post(f"{node.url}/v1/queues/{queue}/consumers/worker/ack",
                               json={"offset": page["next_offset"]}) as r:
            assert r.status == 200, await r.text()
    return got


async def test_concurrent_producers_and_consumers_see_every_record_once_in_order(client, node):
    run = uuid.uuid4().hex[:6]
    queues = [f"conc-{run}-{i}" for i in range(QUEUES)]
    writers = ("a", "b")
    expected = len(writers) * BATCHES * PER_BATCH
    consumers = [asyncio.create_task(consume(client, node, q, expected)) for q in queues]
    await asyncio.gather(*(produce(client, node, q, w) for q in queues for w in writers))
    results = await asyncio.wait_for(asyncio.gather(*consumers), 120)
    for q, got in zip(queues, results, strict=True):
        assert len(got) == expected, q
        assert len(set(got)) == expected, f"{q}: duplicates"
        for w in writers:
            mine = [int(v.split(":")[1]) for v in got if v.startswith(w + ":")]
            assert mine == list(range(BATCHES * PER_BATCH)), f"{q}/{w}: out of order or gaps"
    # Nothing left for the consumer, and its lag is zero.
    async with client.get(f"{node.url}/v1/queues/{queues[0]}") as r:
        info = await r.json()
    assert info["records"] == expected
    assert info["consumers"] == [{"consumer": "worker", "offset": info["last_offset"] + 1,
                                  "lag": 0, **cursor_counts(0)}]
