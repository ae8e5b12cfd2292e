"""Prefix consumers against the real broker and node processes: defined over HTTP for the whole
cluster, leased and settled across queues, and a prefix `Worker` draining every queue under
the prefix once across a two-node cluster while one node stops and comes back (it follows
the cluster map; docs/work-queues.md, ADR 13)."""

import asyncio
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest
from vqueues_client import AsyncClient, NewRecord, VQError, Worker

from tests.support import create_topics, http, start_cluster, wait_settled
from vqueues.hashing import partition_for


def prefix() -> str:
    return f"pfx{uuid.uuid4().hex[:6]}-"


async def fill(vq: AsyncClient, queue: str, n: int) -> None:
    await vq.enqueue(queue, [NewRecord(f"{queue}:{i}") for i in range(n)])


async def test_a_prefix_consumer_is_defined_leased_and_settled_over_http(node):
    p = prefix()
    async with AsyncClient(node.url) as vq:
        defined = await vq.configure_prefix_consumer("pool", p, max_attempts=4,
                                                     dead_letter_queue="dead-{queue}",
                                                     max_in_flight=3)
        assert (defined["prefix"], defined["max_attempts"], defined["max_in_flight"]) == (
            p, 4, 3)
        queues = [f"{p}{i}" for i in range(12)]
        for q in queues:
            await fill(vq, q, 5)
        await fill(vq, "elsewhere-" + p, 5)
        got = await vq.lease_prefix("pool", node.url, max_records=100, visibility_ms=60_000)
        assert sorted(Counter(x.queue for x in got).items()) == sorted(
            (q, 3) for q in queues)  # three each: the in-flight cap
        assert {x.partition for x in got} <= set(range(16))
        stale = [*got[:5], got[5].__class__(got[5].record, "999999.1.abc", 1, 0, got[5].queue)]
        with pytest.raises(VQError) as err:
            await vq.complete_prefix("pool", node.url, stale)
        assert err.value.code == "lease_expired"
        assert err.value.details["stale"] == [{"queue": got[5].queue, "token": "999999.1.abc"}]
        done = await vq.complete_prefix("pool", node.url, got)
        assert sum(len(q["done"]) for q in done["queues"]) == 36
        info = await vq.queue_info(queues[0])
        assert info is not None
        pool = next(c for c in info["consumers"] if c["consumer"] == "pool")
        assert (pool["mode"], pool["lag"], pool["in_flight"]) == ("lease", 2, 0)
        settings = await vq.consumer_settings(queues[0], "pool")
        assert settings is not None
        assert (settings["prefix"], settings["dead_letter_queue"]) == (p, f"dead-{queues[0]}")
        listed = await vq.prefix_consumers()
        mine = next(x for x in listed if x["consumer"] == "pool")
        assert (mine["prefix"], mine["queues"], mine["in_flight"]) == (p, 12, 0)
        assert mine["ready_queues"] >= 1
    status, body = http("POST", f"{node.url}/v1/prefix-consumers/nobody/lease", {})
    assert (status, body["error"]["code"]) == (404, "prefix_consumer_not_found")
    status, body = http("PUT", f"{node.url}/v1/prefix-consumers/bad",
                        {"prefix": p, "dead_letter_queue": "{queue}-dead"})
    assert (status, body["error"]["code"]) == (400, "invalid_parameter")
    status, body = http("POST", f"{node.url}/v1/prefix-consumers/pool/complete",
                        {"tokens": ["1.1.a"]})
    assert (status, body["error"]["code"]) == (400, "invalid_token")
    status, body = http("DELETE", f"{node.url}/v1/prefix-consumers/pool")
    assert status == 200
    status, _ = http("GET", f"{node.url}/v1/prefix-consumers/pool")
    assert status == 404


def test_a_queues_consumer_follows_the_prefix_consumer_however_it_was_first_touched(node):
    """The new user's path: a per-queue lease first, then the pool; the cap of 2 holds, the
    settings are the prefix consumer's, and an acked cursor by that name stays a cursor."""
    p = prefix()
    url = node.url
    status, _ = http("PUT", f"{url}/v1/prefix-consumers/pm", {
        "prefix": p, "max_attempts": 2, "dead_letter_queue": "dead-{queue}",
        "max_in_flight": 2})
    assert status == 200
    q = f"{p}2"
    status, _ = http("POST", f"{url}/v1/queues/{q}/records",
                     {"records": [{"value": f"r{i}"} for i in range(6)]})
    assert status == 200
    status, one = http("POST", f"{url}/v1/queues/{q}/consumers/pm/lease", {"max_records": 1})
    assert (status, len(one["records"])) == (200, 1)
    status, got = http("GET", f"{url}/v1/queues/{q}/consumers/pm")
    assert (got["max_attempts"], got["dead_letter_queue"], got["max_in_flight"],
            got["prefix"]) == (2, f"dead-{q}", 2, p)
    status, pool = http("POST", f"{url}/v1/prefix-consumers/pm/lease", {"max_records": 10})
    assert (status, len(pool["records"])) == (200, 1)  # 2 in flight: the cap
    # a cursor consumer by the pool's name keeps its queue out, and is never converted
    cur = f"{p}cursor"
    http("POST", f"{url}/v1/queues/{cur}/records", {"records": [{"value": "c"}]})
    status, _ = http("POST", f"{url}/v1/queues/{cur}/consumers/pm/ack", {"offset": 0})
    assert status == 200
    status, body = http("POST", f"{url}/v1/queues/{cur}/consumers/pm/lease", {})
    assert (status, body["error"]["code"], body["error"]["mode"]) == (
        409, "consumer_mode_mismatch", "cursor")
    status, pool = http("POST", f"{url}/v1/prefix-consumers/pm/lease", {"max_records": 10})
    assert status == 200 and all(r["queue"] != cur for r in pool["records"])
    assert http("GET", f"{url}/v1/queues/{cur}/consumers/pm")[1]["mode"] == "cursor"
    # a dead-letter queue too long for a name is shortened, and readable
    long = p + "L" * (249 - len(p.encode()))
    http("POST", f"{url}/v1/queues/{long}/records", {"records": [{"value": "poison"}]})
    deadline = time.monotonic() + 20
    retried = 0
    while retried < 2 and time.monotonic() < deadline:  # max_attempts 2: two failures
        status, page = http("POST", f"{url}/v1/prefix-consumers/pm/lease",
                            {"max_records": 10, "wait_ms": 500})
        for r in page["records"]:
            if r["queue"] == long:
                status, _ = http("POST", f"{url}/v1/prefix-consumers/pm/retry", {
                    "tokens": [{"queue": long, "token": r["token"]}], "reason": "x"})
                assert status == 200
                retried += 1
    assert retried == 2
    dlq = http("GET", f"{url}/v1/queues/{quote(long, safe='')}/consumers/pm")[1][
        "dead_letter_queue"]
    assert len(dlq.encode()) == 249 and dlq.startswith("dead-" + p)
    records: list[Any] = []
    while not records and time.monotonic() < deadline:
        status, page = http("GET", f"{url}/v1/queues/{quote(dlq, safe='')}/records?limit=5"
                            "&wait_ms=500")
        assert status == 200, page
        records = page["records"]
    assert [r["value"] for r in records] == ["poison"]
    assert records[0]["headers"]["vq-dlq-source-queue"] == long


async def test_a_long_poll_across_a_prefix_wakes_on_a_new_queue(node):
    p = prefix()
    async with AsyncClient(node.url) as vq:
        await vq.configure_prefix_consumer("waiter", p)
        await asyncio.sleep(0.2)
        started = time.monotonic()
        poll = asyncio.ensure_future(vq.lease_prefix("waiter", node.url, max_records=10,
                                                     wait_ms=5000))
        await asyncio.sleep(0.3)
        await fill(vq, f"{p}fresh", 1)
        got = await poll
        assert [x.queue for x in got] == [f"{p}fresh"]
        assert time.monotonic() - started < 3


def test_a_prefix_worker_drains_every_queue_once_across_a_cluster_while_a_node_stops(
        default_bootstrap):
    topics = create_topics(default_bootstrap, partitions=8)
    nodes = start_cluster(topics, 2)
    p = prefix()
    seen: Counter[str] = Counter()

    async def go() -> None:
        before = await asyncio.to_thread(wait_settled, nodes, topics.partitions)
        async with AsyncClient([n.url for n in nodes], deadline_s=60) as vq:
            await vq.configure_prefix_consumer("pool", p, visibility_ms=3000)
            queues = [f"{p}{i}" for i in range(40)]
            for q in queues:
                await fill(vq, q, 50)

            async def handle(lease: object) -> None:
                seen[f"{lease.queue}/{lease.text}"] += 1  # type: ignore[attr-defined]
                await asyncio.sleep(0.001)

            # A fixed room (the adaptive default moves), so that it bounds the records that
            # can come twice below.
            worker = Worker(vq, None, "pool", handle, prefix=True, concurrency=8,
                            wait_ms=300, visibility_ms=3000, map_refresh_s=1.0, prefetch=80)
            runner = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 120
            while len(seen) < 600 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(nodes[1].terminate)  # its partitions move to node 0
            while len(seen) < 2000 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert len(seen) == 2000
            # A node joins: the worker finds it in the cluster map and leases from it (a
            # prefix lease answers from the node's own partitions only).
            await asyncio.to_thread(nodes[1].start, False)
            owners = await asyncio.to_thread(wait_settled, nodes, topics.partitions)
            assert nodes[1].url in owners.values()
            for q in queues:
                await vq.enqueue(q, [NewRecord(f"{q}:late")])
            while len(seen) < 2040 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            await worker.stop()
            await runner
            assert len(seen) == 2040
            # Records completed were never handed out again; only records leased from the
            # stopped node and not completed by its end could come twice: the worker's
            # buffer, and the handled records whose completion that node no longer took.
            twice = [key.split("/")[0] for key, n in seen.items() if n > 1]
            assert all(before[partition_for(q, topics.partitions)] == nodes[1].url
                       for q in twice), twice
            assert sum(seen.values()) - 2040 <= worker.capacity + worker.max_batch
            for q in queues[:3]:
                info = await vq.queue_info(q)
                assert info is not None
                pool = next(c for c in info["consumers"] if c["consumer"] == "pool")
                assert (pool["lag"], pool["in_flight"]) == (0, 0)

    try:
        asyncio.run(go())
    finally:
        for n in nodes:
            n.kill()
