#!/usr/bin/env python3
"""Benchmark vqueues against the raw confluent-kafka client on the same broker, in one run.

Starts the embedded broker (or uses --bootstrap) and one node process, then measures:
  enqueue throughput   batches of 100 records of 100 bytes, --concurrency requests in flight
  enqueue latency      one record per request, sequential (p50/p99)
  read latency         100 cached records per request, sequential (p50/p99)
  end-to-end latency   enqueue -> a reader long-polling the queue (p50/p99): after 5 ms
                       idle (the reader parked, every thread gone idle), and back to back (a
                       steady stream of single records, the next written once the last is read)
  read throughput      cached pages of 100 records, --concurrency readers
  lease throughput     lease (10 records) -> complete, --concurrency workers over 10 queues
  lease end-to-end     enqueue -> a lease long-polling the queue (p50/p99)
  enqueue shapes       the throughput run with an idempotency key on every record, and with
                       10% of the records scheduled; scheduled records' lateness (p50/p99),
                       of one queue's and of records due at once in 5,000 queues
  prefix consumer      lease -> complete across the queues under a prefix (--prefix-queues
                       queues, each leased from once and idle, 1,000 with records) beside the
                       per-queue lease on the same node
and the same workloads through a raw Producer/Consumer (acks=all), printing the ratio.
With --cluster N (default 3) the same workloads also run on N nodes, clients routing by the
cluster map, reported beside the single node. Then, on a topic already holding --many-queues
queues x 2 records (100,000), one node's replay time, enqueue throughput spread over all of
them, and the embedded broker's CPU under that load and idle (the node's tail alone).
--baseline CHECKOUT runs an older vqueues package (a git worktree) as "before", alternating
with this one in the same run, and reports both.
--broker kafka then runs all of it again on a local three-broker Apache Kafka cluster (the raw
client on that cluster is its floor) and Kafka's share groups on it (ShareConsumerPerformance)
as the anchor for lease -> complete.
Usage: .venv/bin/python scripts/bench.py [--seconds 5] [--concurrency 16] [--cluster 3]
       [--baseline /tmp/old --rounds 3] [--broker kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vqueues.hashing import partition_for  # noqa: E402
from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin, TopicSpec  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster  # noqa: E402

VALUE = "x" * 100
# A pause before each request, as a reader parked on a quiet queue sees: every process and
# thread on the path has gone idle, and waking them costs on these VMs (see docs/benchmarks.md).
IDLE_S = 0.005
DEV_ENV = {"VQ_SESSION_TIMEOUT_MS": "6000", "VQ_HEARTBEAT_INTERVAL_MS": "500",
           "VQ_LOG_LEVEL": "warning"}


# The nodes' tail fetch wait, this checkout's and the baseline's (--fetch-wait-ms,
# --baseline-fetch-wait-ms).
FETCH_WAIT_MS = [100, 100]


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))] * 1000


# Raw confluent-kafka ----------------------------------------------------------------------------

def raw_throughput(bootstrap: str, topic: str, seconds: float) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2,
                  "enable.idempotence": True, "compression.type": "lz4",
                  "partitioner": "murmur2"})
    value = VALUE.encode()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            try:
                p.produce(topic, key=b"raw-tp", value=value)
            except BufferError:
                p.poll(0.01)
            n += 1
        p.poll(0)
    p.flush(60)
    return n / (time.perf_counter() - t0)


def raw_latency(bootstrap: str, topic: str, count: int, idle_s: float = 0.0) -> list[float]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                  "enable.idempotence": True, "partitioner": "murmur2"})
    out = []
    for _ in range(count):
        if idle_s:
            time.sleep(idle_s)
        t0 = time.perf_counter()
        p.produce(topic, key=b"raw-lat", value=VALUE.encode())
        p.flush(10)
        out.append(time.perf_counter() - t0)
    return out


def raw_read_latency(bootstrap: str, topic: str, partitions: int, count: int) -> list[float]:
    key = "raw-read"
    part = partition_for(key, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2"})
    for _ in range(100):
        p.produce(topic, key=key.encode(), value=VALUE.encode())
    p.flush(10)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    c.assign([TopicPartition(topic, part, 0)])
    c.consume(100, 5)  # warm up: connection, metadata
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        c.seek(TopicPartition(topic, part, 0))
        got = 0
        while got < 100:
            got += len(c.consume(100 - got, 5))
        out.append(time.perf_counter() - t0)
    c.close()
    return out


def raw_e2e(bootstrap: str, topic: str, partitions: int, count: int, idle_s: float = 0.0
            ) -> list[float]:
    key = f"raw-e2e-{uuid.uuid4().hex[:6]}"
    part = partition_for(key, partitions)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                  "partitioner": "murmur2"})
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                  "enable.partition.eof": False, "auto.offset.reset": "latest"})
    p.produce(topic, key=key.encode(), value=b"start")
    p.flush(10)
    c.assign([TopicPartition(topic, part, 0)])
    while c.consume(1000, 0.5):
        pass
    out = []
    for _ in range(count):
        if idle_s:
            time.sleep(idle_s)
        t0 = time.perf_counter()
        p.produce(topic, key=key.encode(), value=VALUE.encode())
        p.poll(0)
        while True:
            msgs = [m for m in c.consume(1, 1) if not m.error()]
            if msgs:
                break
        out.append(time.perf_counter() - t0)
        p.flush(1)
    c.close()
    return out


# vqueues over HTTP ------------------------------------------------------------------------------

async def vq_throughput(s: aiohttp.ClientSession, urls: list[str], seconds: float,
                        concurrency: int, route, queues: int = 0, body_of=None,
                        prefix: str = "tp") -> float:
    """Batches of 100 records, `concurrency` in flight; worker i cycles over queues tp-k with
    k = i, i + concurrency, ... below `queues` (default: one queue per worker). `body_of()`
    makes each request's body (default: 100 plain records, the same each time)."""
    plain = json.dumps({"records": [{"value": VALUE}] * 100})
    body_of = body_of or (lambda: plain)
    count = 0
    stop = time.perf_counter() + seconds
    queues = queues or concurrency

    async def worker(i: int) -> None:
        nonlocal count
        k = i % queues
        while time.perf_counter() < stop:
            q = f"{prefix}-{k}"
            k = (k + concurrency) % queues
            async with s.post(route(q) + f"/v1/queues/{q}/records", data=body_of(),
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
                await r.read()
            count += 100

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return count / (time.perf_counter() - t0)


async def vq_shaped_throughput(s: aiohttp.ClientSession, route, seconds: float,
                               concurrency: int, shape: str) -> float:
    """Like vq_throughput over 10 queues, with every record keyed (`keyed`: a fresh
    idempotency key each) or 10% of them scheduled 1 s ahead (`scheduled`).

    The client's cost per body is kept near the plain run's (one fixed body): the scheduled
    body is the same every time (its delay is relative), and a keyed body is a template
    filled with fresh keys (15 us per body; json.dumps of 100 dicts took 119 us, 6% of a
    core at this rate, on the cores the node shares)."""
    if shape != "keyed":
        fixed = json.dumps({"records": [
            {"value": VALUE, "delay_ms": 1000} if i % 10 == 0 else {"value": VALUE}
            for i in range(100)]})
        return await vq_throughput(s, [], seconds, concurrency, route, queues=10,
                                   body_of=lambda: fixed, prefix=shape)
    serial = 0
    head, tail = json.dumps({"value": VALUE, "idempotency_key": "KEY"}).split("KEY")
    head += uuid.uuid4().hex[:6] + "-"  # keys "<run>-<serial>"
    between = tail + ", " + head

    def body() -> str:
        nonlocal serial
        first, serial = serial, serial + 100
        keys = between.join(map(str, range(first, serial)))
        return '{"records": [' + head + keys + tail + "]}"

    return await vq_throughput(s, [], seconds, concurrency, route, queues=10, body_of=body,
                               prefix=shape)


async def vq_schedule_lateness_many(s: aiohttp.ClientSession, route, queues: int
                                    ) -> list[float]:
    """One record scheduled in each of `queues` queues, all due at the same moment, 2 s ahead:
    how late each moved copy was written, in seconds (pct() reports ms)."""
    due = int(time.time() * 1000) + 2000
    names = [f"late-many-{uuid.uuid4().hex[:6]}-{i}" for i in range(queues)]
    by_owner: dict[str, list[str]] = {}
    for q in names:
        by_owner.setdefault(route(q), []).append(q)
    for url, owned in by_owner.items():
        for i in range(0, len(owned), 1000):
            async with s.post(f"{url}/v1/records", json={"records": [
                    {"queue": q, "value": "x", "deliver_at": due}
                    for q in owned[i:i + 1000]]}) as r:
                body = await r.json()
                assert r.status == 200 and not body["failed"], body
    got: list[float] = []
    limit = asyncio.Semaphore(16)

    async def moved(q: str) -> None:
        async with limit, s.get(f"{route(q)}/v1/queues/{q}/records",
                                params={"limit": "1", "wait_ms": "10000"}) as r:
            page = await r.json()
        got.extend((x["timestamp"] - due) / 1000 for x in page["records"])

    await asyncio.sleep(max(0.0, due / 1000 - time.time()))
    await asyncio.gather(*(moved(q) for q in names))
    assert len(got) == queues, f"{len(got)} of {queues} moved"
    return got


async def vq_schedule_lateness(s: aiohttp.ClientSession, base: str, q: str, count: int
                               ) -> list[float]:
    """Records scheduled 0.5-1.5 s ahead: how late each moved copy was written (its broker
    timestamp minus its due time), in seconds (pct() reports ms)."""
    now = int(time.time() * 1000)
    dues = [now + 500 + (i * 1000) // count for i in range(count)]
    async with s.post(f"{base}/v1/queues/{q}/records", json={
            "records": [{"value": str(d), "deliver_at": d} for d in dues]}) as r:
        assert r.status == 200, await r.text()
    got: list[float] = []
    offset = 0
    deadline = time.perf_counter() + 30
    while len(got) < count and time.perf_counter() < deadline:
        async with s.get(f"{base}/v1/queues/{q}/records",
                         params={"offset": str(offset), "limit": "1000", "wait_ms": "1000"}) as r:
            page = await r.json()
        got += [(x["timestamp"] - int(x["value"])) / 1000 for x in page["records"]]
        offset = page["next_offset"]
    return got


async def vq_read_throughput(s: aiohttp.ClientSession, base: str, q: str, seconds: float,
                             concurrency: int) -> float:
    """Cached pages of 100 records, `concurrency` readers in flight: records/s."""
    async with s.post(f"{base}/v1/queues/{q}/records",
                      json={"records": [{"value": VALUE}] * 100}) as r:
        first = (await r.json())["offsets"][0]
    count = 0
    stop = time.perf_counter() + seconds

    async def reader() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            async with s.get(f"{base}/v1/queues/{q}/records",
                             params={"offset": str(first), "limit": "100"}) as r:
                count += len((await r.json())["records"])

    t0 = time.perf_counter()
    await asyncio.gather(*(reader() for _ in range(concurrency)))
    return count / (time.perf_counter() - t0)


async def vq_latency(s: aiohttp.ClientSession, base: str, q: str, count: int,
                     idle_s: float = 0.0) -> list[float]:
    body = json.dumps({"records": [{"value": VALUE}]})
    out = []
    for _ in range(count):
        if idle_s:
            await asyncio.sleep(idle_s)
        t0 = time.perf_counter()
        async with s.post(f"{base}/v1/queues/{q}/records", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            await r.read()
        out.append(time.perf_counter() - t0)
    return out


async def vq_http_floor(s: aiohttp.ClientSession, base: str, count: int,
                        idle_s: float = 0.0) -> list[float]:
    """GET /healthz: what HTTP alone costs between this client and the node."""
    out = []
    for _ in range(count):
        if idle_s:
            await asyncio.sleep(idle_s)
        t0 = time.perf_counter()
        async with s.get(f"{base}/healthz") as r:
            await r.read()
        out.append(time.perf_counter() - t0)
    return out


async def vq_read_latency(s: aiohttp.ClientSession, base: str, q: str, count: int
                          ) -> list[float]:
    async with s.post(f"{base}/v1/queues/{q}/records",
                      json={"records": [{"value": VALUE}] * 100}) as r:
        first = (await r.json())["offsets"][0]
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        async with s.get(f"{base}/v1/queues/{q}/records",
                         params={"offset": str(first), "limit": "100"}) as r:
            body = await r.json()
        out.append(time.perf_counter() - t0)
        assert len(body["records"]) == 100
    return out


async def vq_e2e(s: aiohttp.ClientSession, base: str, q: str, count: int
                 ) -> tuple[list[float], list[float]]:
    """Enqueue -> a parked long poll: the reader's times, and how long after the writer's
    answer the reader's came (what the node adds to a write to wake a reader)."""
    async with s.get(f"{base}/v1/queues/{q}/records") as r:
        nxt = (await r.json())["next_offset"]
    out, after_writer = [], []
    body = json.dumps({"records": [{"value": VALUE}]})

    async def write() -> float:
        async with s.post(f"{base}/v1/queues/{q}/records", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            await r.read()
        return time.perf_counter()

    async def read(offset: int) -> tuple[dict, float]:
        async with s.get(f"{base}/v1/queues/{q}/records",
                         params={"offset": str(offset), "wait_ms": "5000"}) as r:
            return await r.json(), time.perf_counter()

    for _ in range(count):
        reader = asyncio.create_task(read(nxt))
        await asyncio.sleep(0.005)  # the reader is parked in its long poll
        t0 = time.perf_counter()
        writer = asyncio.create_task(write())
        got, read_at = await reader
        written_at = await writer
        out.append(read_at - t0)
        after_writer.append(read_at - written_at)
        assert got["records"], got
        nxt = got["next_offset"]
    return out, after_writer


async def vq_e2e_back_to_back(s: aiohttp.ClientSession, base: str, q: str, count: int
                              ) -> list[float]:
    """Enqueue -> a reader that long-polls again as soon as it has a record, the writer
    writing the next record once the reader has the last: a steady stream of single records
    with no idle pause, as the raw client's end to end is measured."""
    async with s.get(f"{base}/v1/queues/{q}/records") as r:
        nxt = (await r.json())["next_offset"]
    body = json.dumps({"records": [{"value": VALUE}]})
    arrivals: asyncio.Queue[float] = asyncio.Queue()

    async def reader(offset: int) -> None:
        while True:
            async with s.get(f"{base}/v1/queues/{q}/records",
                             params={"offset": str(offset), "wait_ms": "5000"}) as r:
                page = await r.json()
            at = time.perf_counter()
            for _ in page["records"]:
                arrivals.put_nowait(at)
            offset = page["next_offset"]

    task = asyncio.create_task(reader(nxt))
    out = []
    try:
        await asyncio.sleep(0.005)  # the first poll is parked
        for _ in range(count):
            await asyncio.sleep(0)  # the reader's next poll goes out before the write
            t0 = time.perf_counter()
            async with s.post(f"{base}/v1/queues/{q}/records", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
            out.append(await asyncio.wait_for(arrivals.get(), 10) - t0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return out


async def vq_lease_throughput(s: aiohttp.ClientSession, route, seconds: float, workers: int,
                              batch: int = 10, queues: int = 10) -> float:
    """Lease -> complete with `workers` workers over `queues` prefilled queues, `batch` records
    per lease: records completed per second."""
    names = [f"lw-{uuid.uuid4().hex[:6]}-{i}" for i in range(queues)]
    per_queue = 6000 if batch <= 10 else 40_000  # enough not to run dry in the window
    body = json.dumps({"records": [{"value": VALUE}] * 500})
    for q in names:
        for _ in range(per_queue // 500):
            async with s.post(route(q) + f"/v1/queues/{q}/records", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
    count = 0
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal count
        k = i
        while time.perf_counter() < stop:
            q = names[k % queues]
            k += 1
            base = route(q) + f"/v1/queues/{q}/consumers/bench"
            async with s.post(base + "/lease", json={"max_records": batch}) as r:
                got = (await r.json())["records"]
            if got:
                async with s.post(base + "/complete",
                                  json={"tokens": [x["token"] for x in got]}) as r:
                    assert r.status == 200, await r.text()
                count += len(got)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return count / (time.perf_counter() - t0)


async def vq_lease_e2e(s: aiohttp.ClientSession, base: str, q: str, count: int,
                       after_writer: list[float] | None = None) -> list[float]:
    """Enqueue -> a lease long-polling the queue, then complete (outside the timing). With
    `after_writer`, also how long after the writer's answer the lease's came (the grant's
    write to the offset topic, the wake-up, the answer)."""
    out = []
    body = json.dumps({"records": [{"value": VALUE}]})
    lease_url = f"{base}/v1/queues/{q}/consumers/e2e/lease"

    async def lease() -> tuple[dict, float]:
        async with s.post(lease_url, json={"wait_ms": 5000}) as r:
            return await r.json(), time.perf_counter()

    for _ in range(count):
        leaser = asyncio.create_task(lease())
        await asyncio.sleep(0.005)  # parked in its long poll
        t0 = time.perf_counter()
        async with s.post(f"{base}/v1/queues/{q}/records", data=body,
                          headers={"Content-Type": "application/json"}) as r:
            await r.read()
        written_at = time.perf_counter()
        got, at = await leaser
        out.append(at - t0)
        if after_writer is not None:
            after_writer.append(at - written_at)
        assert got["records"], got
        async with s.post(f"{base}/v1/queues/{q}/consumers/e2e/complete",
                          json={"tokens": [x["token"] for x in got["records"]]}) as r:
            await r.read()
    return out


# Driver ------------------------------------------------------------------------------------------

def start_nodes(bootstrap: str, prefix: str, count: int, code: str | None = None
                ) -> tuple[list[subprocess.Popen], list[str]]:
    """`count` nodes; `code`: run the vqueues package of that checkout instead of this one."""
    procs, urls = [], []
    extra = {"PYTHONPATH": code} if code else {}
    extra["VQ_FETCH_WAIT_MAX_MS"] = str(FETCH_WAIT_MS[1 if code else 0])
    for i in range(count):
        port = free_port()
        env = {**os.environ, **DEV_ENV, **extra, "VQ_BOOTSTRAP": bootstrap,
               "VQ_HTTP_PORT": str(port),
               "VQ_NODE_ID": f"bench-{i}", "VQ_DATA_TOPIC": f"{prefix}-data",
               "VQ_OFFSET_TOPIC": f"{prefix}-offsets",
               "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assignments", "VQ_GROUP_ID": f"{prefix}-g"}
        # `-m` puts the working directory first on the path, before PYTHONPATH: run in the
        # checkout, or this checkout's package would be the one started (as it was, before).
        procs.append(subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env,
                                      cwd=code or None))
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls


def stop_nodes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every node, then wait for each (they leave the group together)."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


async def wait_ready(urls: list[str], partitions: int) -> dict[int, str]:
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            owners: dict[int, str] = {}
            ok = True
            for u in urls:
                try:
                    async with s.get(f"{u}/readyz") as r:
                        body = await r.json()
                        ok &= r.status == 200
                        owners.update({p: u for p in body.get("ready", [])})
                except aiohttp.ClientError:
                    ok = False
            if ok and len(owners) == partitions:
                return owners
            await asyncio.sleep(0.2)
    raise TimeoutError("nodes not ready")


async def measure_vqueues(args: argparse.Namespace, bootstrap: str, nodes: int,
                          code: str | None = None, broker_pids: Sequence[int] = (),
                          warm_s: float = 0.0) -> dict[str, float]:
    """Start `nodes` nodes on fresh topics, route by the cluster map as clients do, measure.
    `warm_s`: enqueue this long first, unmeasured (a JVM broker's JIT)."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", args.partitions))
    procs, urls = start_nodes(bootstrap, prefix, nodes, code)
    try:
        owners = await wait_ready(urls, args.partitions)

        def route(q: str) -> str:
            return owners[partition_for(q, args.partitions)]

        out: dict[str, float] = {}
        async with aiohttp.ClientSession() as s:
            if warm_s:
                await vq_throughput(s, urls, warm_s, args.concurrency, route, queues=10)
            # CPU time per record is steadier than a rate on a shared machine: the node's
            # (and the broker's) user + system seconds over the window, divided by the
            # records written.
            cpu0 = cpu_of([p.pid for p in procs])
            broker0 = cpu_of(broker_pids)
            t0 = time.perf_counter()
            out["throughput"] = await vq_throughput(s, urls, args.seconds, args.concurrency,
                                                    route, queues=10)
            records = out["throughput"] * (time.perf_counter() - t0)
            out["cpu_us_per_record"] = (cpu_of([p.pid for p in procs]) - cpu0) / max(
                records, 1) * 1e6
            if broker_pids:
                out["broker_us_per_record"] = (cpu_of(broker_pids) - broker0) / max(
                    records, 1) * 1e6
            out["read_throughput"] = await vq_read_throughput(
                s, route("rt-1"), "rt-1", args.seconds, args.concurrency)
            await vq_latency(s, route("lat-1"), "lat-1", 20)
            samples = {
                "enqueue": await vq_latency(s, route("lat-1"), "lat-1", args.samples),
                "enqueue_idle": await vq_latency(s, route("lat-1"), "lat-1", args.samples,
                                                 IDLE_S),
                "http": await vq_http_floor(s, route("lat-1"), args.samples),
                "http_idle": await vq_http_floor(s, route("lat-1"), args.samples, IDLE_S),
                "read": await vq_read_latency(s, route("read-1"), "read-1", args.samples),
            }
            samples["e2e"], after_writer = await vq_e2e(s, route("e2e-1"), "e2e-1",
                                                        args.samples)
            out["reader_after_writer_p50"] = pct(after_writer, .5)
            samples["e2e_busy"] = await vq_e2e_back_to_back(s, route("e2e-2"), "e2e-2",
                                                            args.samples)
            if code is None or not args.baseline_without_work:  # older ones: no leases
                out["lease_throughput"] = await vq_lease_throughput(
                    s, route, args.seconds, args.concurrency)
                out["lease_throughput_100"] = await vq_lease_throughput(
                    s, route, args.seconds, args.concurrency, batch=100)
                samples["lease_e2e"] = await vq_lease_e2e(s, route("le2e-1"), "le2e-1",
                                                          args.samples)
                # Plain enqueue again, before and after each shape (P K P S P), each shape
                # compared with the mean of the two beside it: the node now holds the
                # work-queue runs' state, and the embedded broker slows as it stores more
                # (plain enqueue fell from 130,000 to 89,000 rec/s over four such rounds in
                # one run, measured), which a shape run later than its plain one paid alone.
                def plain() -> Awaitable[float]:
                    return vq_throughput(s, urls, args.seconds, args.concurrency, route,
                                         queues=10, prefix="plain")

                plains = [await plain()]
                out["keyed_throughput"] = await vq_shaped_throughput(
                    s, route, args.seconds, args.concurrency, "keyed")
                plains.append(await plain())
                out["scheduled_throughput"] = await vq_shaped_throughput(
                    s, route, args.seconds, args.concurrency, "scheduled")
                plains.append(await plain())
                out["plain_throughput"] = statistics.mean(plains)
                out["plain_keyed"] = statistics.mean(plains[:2])
                out["plain_scheduled"] = statistics.mean(plains[1:])
                samples["lateness"] = await vq_schedule_lateness(s, route("late-1"), "late-1",
                                                                 args.samples)
                samples["lateness_many"] = await vq_schedule_lateness_many(s, route, 5000)
        for name, values in samples.items():
            out[f"{name}_p50"], out[f"{name}_p99"] = pct(values, .5), pct(values, .99)
        return out
    finally:
        stop_nodes(procs)


def median_of(results: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


@asynccontextmanager
async def broker_of(kind: str) -> AsyncIterator[str]:
    """A broker for one benchmark run, stopped by PID at the end: "embedded" (tansu) or
    "kafka" (the local three-broker Apache Kafka cluster). Yields its bootstrap address."""
    if kind == "kafka":
        cluster = await asyncio.to_thread(LocalKafkaCluster().start)
        try:
            yield cluster.bootstrap
        finally:
            await asyncio.to_thread(cluster.stop)
    else:
        broker = EmbeddedBroker().start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: Sequence[int]) -> float:
    """User + system CPU time of several processes so far (a broker's, a cluster's)."""
    return sum(cpu_seconds(pid) for pid in pids)


def prefill(bootstrap: str, topic: str, queues: int, per_queue: int, name: str = "tp-"
            ) -> None:
    """`queues` x `per_queue` records of 100 B with a plain producer (keys tp-0 ...)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2",
                  "queue.buffering.max.messages": 500000, "compression.type": "lz4"})
    value = VALUE.encode()
    for _ in range(per_queue):
        for k in range(queues):
            while True:
                try:
                    p.produce(topic, key=f"{name}{k}".encode(), value=value)
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(120) == 0


async def measure_many_queues(args: argparse.Namespace, bootstrap: str,
                              broker_pids: Sequence[int], code: str | None = None
                              ) -> dict[str, float]:
    """One node on a data topic already holding `--many-queues` queues x 2 records: enqueue
    throughput spread over all of them, and the broker's CPU while loaded and while idle."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", args.partitions))
    await asyncio.to_thread(prefill, bootstrap, f"{prefix}-data", args.many_queues, 2)
    procs, urls = start_nodes(bootstrap, prefix, 1, code)
    out: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        owners = await wait_ready(urls, args.partitions)
        out["replay_s"] = time.perf_counter() - t0

        def route(q: str) -> str:
            return owners[partition_for(q, args.partitions)]

        async with aiohttp.ClientSession() as s:
            cpu0, w0 = cpu_of(broker_pids), time.perf_counter()
            out["throughput"] = await vq_throughput(s, urls, args.seconds, args.concurrency,
                                                    route, queues=args.many_queues)
            if broker_pids:
                out["broker_cpu_load"] = (cpu_of(broker_pids) - cpu0) / (
                    time.perf_counter() - w0)
        if broker_pids:
            await asyncio.sleep(1.0)
            cpu0, w0 = cpu_of(broker_pids), time.perf_counter()
            await asyncio.sleep(3.0)
            out["broker_cpu_idle"] = (cpu_of(broker_pids) - cpu0) / (time.perf_counter() - w0)
        return out
    finally:
        stop_nodes(procs)


async def vq_prefix_throughput(s: aiohttp.ClientSession, url: str, consumer: str,
                               seconds: float, workers: int, batch: int) -> float:
    """Prefix lease -> complete (tokens of many queues in one call), `workers` workers on one
    node: records completed per second."""
    count = 0
    stop = time.perf_counter() + seconds
    base = f"{url}/v1/prefix-consumers/{consumer}"

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            async with s.post(base + "/lease", json={"max_records": batch}) as r:
                got = (await r.json())["records"]
            if got:
                async with s.post(base + "/complete", json={"tokens": [
                        {"queue": x["queue"], "token": x["token"]} for x in got]}) as r:
                    assert r.status == 200, await r.text()
                count += len(got)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return count / (time.perf_counter() - t0)


async def measure_prefix(args: argparse.Namespace, bootstrap: str) -> dict[str, float]:
    """A prefix consumer over `--prefix-queues` queues (100,000), every one leased from once
    and now idle, of which 1,000 get records: prefix lease -> complete beside the per-queue
    lease on the same node (16 workers over 10 queues), at 10 and 100 records per call."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", args.partitions))
    n = args.prefix_queues
    await asyncio.to_thread(prefill, bootstrap, f"{prefix}-data", n, 1, "pq-")
    procs, urls = start_nodes(bootstrap, prefix, 1)
    out: dict[str, float] = {}
    try:
        owners = await wait_ready(urls, args.partitions)

        def route(q: str) -> str:
            return owners[partition_for(q, args.partitions)]

        async with aiohttp.ClientSession() as s:
            definition: dict[str, object] = {"prefix": "pq-"}
            if args.prefix_records_per_turn is not None:
                definition["records_per_turn"] = args.prefix_records_per_turn
            async with s.put(f"{urls[0]}/v1/prefix-consumers/pool", json=definition) as r:
                assert r.status == 200, await r.text()
                out["records_per_turn"] = (await r.json())["records_per_turn"]
            t0, done = time.perf_counter(), 0  # every queue leased from once: then idle
            while done < n:
                async with s.post(f"{urls[0]}/v1/prefix-consumers/pool/lease",
                                  json={"max_records": 1000, "wait_ms": 1000}) as r:
                    got = (await r.json())["records"]
                assert got, f"{done} of {n} leased, then nothing"
                async with s.post(f"{urls[0]}/v1/prefix-consumers/pool/complete", json={
                        "tokens": [{"queue": x["queue"], "token": x["token"]}
                                   for x in got]}) as r:
                    assert r.status == 200, await r.text()
                done += len(got)
            out["first_pass"] = n / (time.perf_counter() - t0)
            busy = [f"pq-{k}" for k in range(0, n, max(1, n // 1000))][:1000]
            body = json.dumps({"records": [{"value": VALUE}] * 200})
            for batch in (10, 100):
                out[f"queue_{batch}"] = await vq_lease_throughput(
                    s, route, args.seconds, args.concurrency, batch=batch)
                # Written after the per-queue run's records, as they were before it: both
                # runs read from the record cache.
                for q in busy:
                    async with s.post(route(q) + f"/v1/queues/{q}/records", data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        assert r.status == 200, await r.text()
                out[f"prefix_{batch}"] = await vq_prefix_throughput(
                    s, urls[0], "pool", args.seconds, args.concurrency, batch)
        return out
    finally:
        stop_nodes(procs)


def _tool_time(text: str) -> float:
    """A time as Kafka's perf tools print it (yyyy-MM-dd HH:mm:ss:SSS), in seconds."""
    day, clock = text.strip().split(" ")
    h, m, sec, ms = (int(x) for x in clock.split(":"))
    return time.mktime(time.strptime(day, "%Y-%m-%d")) + h * 3600 + m * 60 + sec + ms / 1000


def share_group_run(cluster: LocalKafkaCluster, topic: str, records: int, threads: int,
                    per_poll: int | None = None) -> dict[str, float]:
    """Kafka's own ShareConsumerPerformance over `records` already in `topic`: each poll (of up
    to `per_poll` records: max.poll.records, 500 unless given) acknowledges the previous poll's
    records (implicit acknowledgement), as lease -> complete."""
    group = f"{topic}-share"
    # A share group starts at the latest offset unless told otherwise (KIP-932).
    cfg = cluster.tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server",
                       cluster.bootstrap, "--alter", "--entity-type", "groups",
                       "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest")
    if cfg.returncode != 0:
        raise RuntimeError(f"setting the share group's reset failed: {cfg.stdout}{cfg.stderr}")
    t0 = time.perf_counter()
    run = cluster.tool("org.apache.kafka.tools.ShareConsumerPerformance", "--bootstrap-server",
                       cluster.bootstrap, "--topic", topic, "--group", group, "--num-records",
                       str(records), "--threads", str(threads), "--timeout", "30000",
                       "--show-detailed-stats", "--reporting-interval", "100",
                       *(["--command-property", f"max.poll.records={per_poll}"] if per_poll
                         else []))
    wall = time.perf_counter() - t0
    # Only the tool's own rows (the header, per-consumer intervals, the total): its logs share
    # stdout with them.
    lines = [ln for ln in run.stdout.splitlines()
             if "nMsg.sec" in ln or re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}, ", ln)]
    head = next((i for i, ln in enumerate(lines) if "nMsg.sec" in ln), None)
    total = next((ln for ln in reversed(lines) if "for share consumer" not in ln), "")
    if run.returncode != 0 or head is None or total == lines[head]:
        raise RuntimeError(f"ShareConsumerPerformance failed: {run.stdout}{run.stderr}")
    header = [h.strip() for h in lines[head].split(",")]
    row = dict(zip(header, (v.strip() for v in total.split(",")), strict=False))
    # Each share consumer's first report ends when its first records came: before that it was
    # joining the share group (seconds). The steady rate counts from the first records.
    firsts: dict[str, tuple[float, float]] = {}
    for ln in lines[head + 1:]:
        if "for share consumer" in ln:
            cells = [c.strip() for c in ln.split(" for share consumer")[0].split(",")]
            who = ln.rsplit(" ", 1)[1]
            if who not in firsts and float(cells[5]) > 0:
                firsts[who] = (_tool_time(cells[1]), float(cells[5]))
    start, end = _tool_time(row["start.time"]), _tool_time(row["end.time"])
    first = min((t for t, _ in firsts.values()), default=start)
    steady = (float(row["data.consumed.in.nMsg"]) - sum(n for _, n in firsts.values())) \
        / max(end - first, 1e-9)
    return {"rate": float(row["nMsg.sec"]), "records": float(row["data.consumed.in.nMsg"]),
            "to_first_s": first - start, "steady_rate": steady,
            "wall_s": wall}


async def measure_share_groups(args: argparse.Namespace, cluster: LocalKafkaCluster
                               ) -> list[str]:
    """Kafka share groups (KIP-932) on the same cluster: the anchor for work queues."""
    topic = f"bench{uuid.uuid4().hex[:6]}-share"
    Admin({"bootstrap.servers": cluster.bootstrap}).create([TopicSpec(topic, args.partitions)])
    produce = await asyncio.to_thread(
        cluster.tool, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
        "--num-records", str(args.share_records), "--record-size", "100", "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={cluster.bootstrap}", "acks=all")
    if produce.returncode != 0:
        raise RuntimeError(f"ProducerPerformance failed: {produce.stdout}{produce.stderr}")
    res = await asyncio.to_thread(share_group_run, cluster, topic, args.share_records,
                                  args.share_threads)
    return [f"Kafka share groups (KIP-932), Kafka {KAFKA_VERSION}'s ShareConsumerPerformance: "
            f"{res['records']:,.0f} records of 100 B on {args.partitions} partitions, "
            f"{args.share_threads} share consumers, each poll (up to 500 records) "
            f"acknowledging the last: {res['rate']:,.0f} rec/s (tool's own figure; "
            f"{res['wall_s']:.1f} s with its JVM start)"]


async def measure_raw(args: argparse.Namespace, bootstrap: str, broker_pids: Sequence[int] = (),
                      warm_s: float = 0.0) -> dict[str, float]:
    topic = f"bench{uuid.uuid4().hex[:6]}-raw"
    Admin({"bootstrap.servers": bootstrap}).create([TopicSpec(topic, args.partitions)])
    if warm_s:
        await asyncio.to_thread(raw_throughput, bootstrap, topic, warm_s)
    broker0, t0 = cpu_of(broker_pids), time.perf_counter()
    out = {"throughput": await asyncio.to_thread(raw_throughput, bootstrap, topic,
                                                 args.seconds)}
    if broker_pids:
        out["broker_us_per_record"] = (cpu_of(broker_pids) - broker0) / max(
            out["throughput"] * (time.perf_counter() - t0), 1) * 1e6
    samples = {
        "enqueue": await asyncio.to_thread(raw_latency, bootstrap, topic, args.samples),
        "enqueue_idle": await asyncio.to_thread(raw_latency, bootstrap, topic, args.samples,
                                                IDLE_S),
        "read": await asyncio.to_thread(raw_read_latency, bootstrap, topic, args.partitions,
                                        args.samples),
        "e2e": await asyncio.to_thread(raw_e2e, bootstrap, topic, args.partitions,
                                       args.samples, IDLE_S),
        "e2e_busy": await asyncio.to_thread(raw_e2e, bootstrap, topic, args.partitions,
                                            args.samples),
    }
    for name, values in samples.items():
        out[f"{name}_p50"], out[f"{name}_p99"] = pct(values, .5), pct(values, .99)
    return out


ROWS = [("throughput", "enqueue throughput, batches of 100 x 100 B, 10 queues", "rec/s"),
        *((f"{m}_{p}", f"{label} {p}", "ms")
          for m, label in (("enqueue", "enqueue latency, 1 record,"),
                           ("enqueue_idle", "enqueue latency, 1 record after 5 ms idle,"),
                           ("read", "read latency, 100 records,"),
                           ("e2e", "end-to-end latency (enqueue after 5 ms idle -> parked "
                                   "long poll),"),
                           ("e2e_busy", "end-to-end latency, back to back (enqueue -> long "
                                        "poll),"))
          for p in ("p50", "p99"))]


async def run(args: argparse.Namespace) -> None:
    if args.bootstrap:
        print("\n".join(await measure_broker(args, args.bootstrap, args.bootstrap, [])))
        return
    broker = EmbeddedBroker().start()
    try:
        pids = [broker.process.pid] if broker.process else []
        lines = await measure_broker(args, broker.bootstrap, "embedded tansu", pids)
    finally:
        broker.stop()
    if args.broker == "kafka":
        # The same workloads on real Kafka in the same run, then Kafka's share groups.
        cluster = await asyncio.to_thread(LocalKafkaCluster().start)
        try:
            # The JVMs' JIT: each measure's workload runs once unmeasured first (the
            # first 5 s of vqueues' enqueue ran at half the rate of the next, measured).
            lines += ["", *await measure_broker(
                args, cluster.bootstrap, f"Apache Kafka {KAFKA_VERSION}, {cluster.size} brokers "
                "(replication 3, min.insync.replicas 2)",
                [p.process.pid for p in cluster.processes if p.process], warm_s=args.seconds)]
            lines += ["", *await measure_share_groups(args, cluster)]
        finally:
            await asyncio.to_thread(cluster.stop)
    print("\n".join(lines))


async def measure_nodes(args: argparse.Namespace, bootstrap: str, pids: list[int],
                        warm_s: float) -> tuple[dict[str, dict[str, float]],
                                                dict[str, dict[str, float]]]:
    """The node measures by mode ("1 node", the cluster, "before"), and the many-queues ones."""
    many: dict[str, dict[str, float]] = {}
    if args.baseline:
        # Before and after in one run: old and new nodes alternate, medians reported.
        rounds: dict[str, list[dict[str, float]]] = {"before": [], "1 node": []}
        many_rounds: dict[str, list[dict[str, float]]] = {"before": [], "1 node": []}
        for _ in range(args.rounds):
            for name, code in (("before", args.baseline), ("1 node", None)):
                rounds[name].append(await measure_vqueues(args, bootstrap, 1, code, pids,
                                                          warm_s))
                if args.many_queues:
                    many_rounds[name].append(
                        await measure_many_queues(args, bootstrap, pids, code))
        modes = {name: median_of(r) for name, r in rounds.items()}
        many = {name: median_of(r) for name, r in many_rounds.items() if r}
    else:
        modes = {"1 node": await measure_vqueues(args, bootstrap, 1, None, pids, warm_s)}
        if args.cluster:
            modes[f"{args.cluster} nodes"] = await measure_vqueues(
                args, bootstrap, args.cluster, None, pids, warm_s)
        if args.many_queues:
            many["1 node"] = await measure_many_queues(args, bootstrap, pids)
    return modes, many


async def measure_broker(args: argparse.Namespace, bootstrap: str, label: str,
                         pids: list[int], warm_s: float = 0.0) -> list[str]:
    """Every measure on one broker (`pids`: its processes, for their CPU): raw client, one
    node, the cluster, many queues. `warm_s`: the enqueue runs first this long, unmeasured."""
    raw = await measure_raw(args, bootstrap, pids, warm_s)
    modes, many = await measure_nodes(args, bootstrap, pids, warm_s)
    prefix = await measure_prefix(args, bootstrap) if args.prefix_queues else None
    head = " | ".join(f"vqueues {m} | ratio" for m in modes)
    lines = [f"# vqueues bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
             f"{args.partitions} partitions, broker {label}, "
             f"tail fetch wait {args.fetch_wait_ms} ms"
             + (f" (before: {FETCH_WAIT_MS[1]} ms)" if args.baseline else ""),
             f"| measure | raw confluent-kafka | {head} |",
             "|---" * (2 + 2 * len(modes)) + "|"]
    for key, label, unit in ROWS:
        cells = []
        for res in modes.values():
            ratio = res[key] / raw[key] if raw[key] else float("nan")
            cells.append(f"{res[key]:,.1f} {unit} | "
                         f"{ratio:.2f}{' of raw' if key == 'throughput' else 'x raw'}")
        lines.append(f"| {label} | {raw[key]:,.1f} {unit} | {' | '.join(cells)} |")
    lines.append(f"(latency samples: {args.samples}; throughput window {args.seconds}s with "
                 f"{args.concurrency} requests in flight over 10 queues; clients route by the "
                 "cluster map)")
    for name, res in modes.items():
        lines.append(f"read throughput, cached pages of 100 records, {args.concurrency} readers, "
                     f"{name}: {res['read_throughput']:,.0f} rec/s")
        broker_cpu = (f"; the broker's {res['broker_us_per_record']:.1f} µs (the raw "
                      f"client's records: {raw['broker_us_per_record']:.1f} µs)"
                      if "broker_us_per_record" in res and "broker_us_per_record" in raw
                      else "")
        lines.append(f"node CPU per enqueued record (user + system, batches of 100), {name}: "
                     f"{res['cpu_us_per_record']:.1f} µs{broker_cpu}; a parked reader answers "
                     f"{res['reader_after_writer_p50']:.2f} ms (p50) after the writer")
        lines.append(f"HTTP alone (GET /healthz), {name}: p50 {res['http_p50']:.2f} ms busy, "
                     f"{res['http_idle_p50']:.2f} ms after {IDLE_S * 1000:.0f} ms idle "
                     f"(p99 {res['http_p99']:.2f} / {res['http_idle_p99']:.2f} ms)")
    for name, res in modes.items():
        if "lease_throughput" in res:
            lines.append(
                f"work queues, {name}: lease -> complete {res['lease_throughput']:,.0f} rec/s "
                f"at 10 records per lease, {res.get('lease_throughput_100', 0):,.0f} at 100 "
                f"({args.concurrency} workers over 10 queues; cursor "
                f"enqueue above: {res['throughput']:,.0f}); enqueue -> long-polling lease "
                f"p50 {res['lease_e2e_p50']:.2f} ms, p99 {res['lease_e2e_p99']:.2f} ms "
                f"(cursor read: p50 {res['e2e_p50']:.2f} ms, p99 {res['e2e_p99']:.2f} ms)")
        if "keyed_throughput" in res:
            lines.append(
                f"enqueue shapes, {name}: plain {res['plain_throughput']:,.0f} rec/s (measured "
                f"again before and after each shape); an idempotency key on every record "
                f"{res['keyed_throughput']:,.0f} rec/s "
                f"({res['keyed_throughput'] / res['plain_keyed']:.2f}x the plain runs beside "
                f"it); 10% scheduled 1 s ahead {res['scheduled_throughput']:,.0f} rec/s "
                f"({res['scheduled_throughput'] / res['plain_scheduled']:.2f}x); scheduled "
                f"records' "
                f"lateness (moved copy's timestamp - due) p50 {res['lateness_p50']:.1f} ms, "
                f"p99 {res['lateness_p99']:.1f} ms; due at once in 5,000 queues p50 "
                f"{res['lateness_many_p50']:.1f} ms, p99 {res['lateness_many_p99']:.1f} ms")
    for name, res in many.items():
        lines.append(
            f"{args.many_queues:,} queues x 2 records already in the topic, {name}: replay to "
            f"ready {res['replay_s']:.1f} s; enqueue throughput spread over all of them "
            f"{res['throughput']:,.0f} rec/s ({res['throughput'] / raw['throughput']:.2f} of "
            "raw)" + (f"; broker CPU {res['broker_cpu_load']:.0%} of a core under that load, "
                      f"{res['broker_cpu_idle']:.0%} idle (the node's tail alone)"
                      if "broker_cpu_load" in res else ""))
    if prefix is not None:
        lines.append(
            f"prefix consumer over {args.prefix_queues:,} queues (records_per_turn "
            f"{prefix['records_per_turn']:.0f}; each leased from once, "
            f"{prefix['first_pass']:,.0f} rec/s, then idle), 1,000 of them with records, "
            f"{args.concurrency} workers on one node: lease -> complete "
            f"{prefix['prefix_10']:,.0f} rec/s at 10 per call "
            f"({prefix['prefix_10'] / prefix['queue_10']:.2f}x the per-queue lease's "
            f"{prefix['queue_10']:,.0f} on the same node), {prefix['prefix_100']:,.0f} at 100 "
            f"({prefix['prefix_100'] / prefix['queue_100']:.2f}x its "
            f"{prefix['queue_100']:,.0f})")
    if args.baseline:
        lines.append(f"(before = the vqueues package at {args.baseline}; before and after "
                     f"alternate, {args.rounds} rounds each, medians)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing Kafka/Redpanda (default: embedded broker)")
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded",
                    help="kafka: also a local three-broker Apache Kafka cluster in the same run, "
                    "beside the embedded broker, with Kafka share groups (needs Java and Maven)")
    ap.add_argument("--share-records", type=int, default=200_000,
                    help="records the share-group run consumes (--broker kafka)")
    ap.add_argument("--share-threads", type=int, default=4,
                    help="share consumers in the share-group run (--broker kafka)")
    ap.add_argument("--cluster", type=int, default=3,
                    help="also measure a cluster of this many nodes (0: single node only)")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="also run the vqueues package of this checkout (e.g. a git worktree of "
                         "an older commit) as 'before', alternating with this one")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each with --baseline")
    ap.add_argument("--baseline-without-work", action="store_true",
                    help="the baseline predates work queues and enqueue shapes: skip them there")
    ap.add_argument("--fetch-wait-ms", type=int, default=100,
                    help="the nodes' tail fetch.wait.max.ms (default 100, as the nodes')")
    ap.add_argument("--baseline-fetch-wait-ms", type=int,
                    help="the baseline's nodes' tail fetch.wait.max.ms (default: "
                         "--fetch-wait-ms), e.g. an older package's own default")
    ap.add_argument("--prefix-queues", type=int, default=100_000,
                    help="queues under the prefix consumer of the prefix run (0: no run)")
    ap.add_argument("--prefix-records-per-turn", type=int, default=None,
                    help="the prefix consumer's records_per_turn in the prefix run (default: "
                         "the server's)")
    ap.add_argument("--many-queues", type=int, default=100_000,
                    help="also measure one node over this many queues x 2 records (0: skip)")
    args = ap.parse_args()
    FETCH_WAIT_MS[:] = [args.fetch_wait_ms, args.fetch_wait_ms
                        if args.baseline_fetch_wait_ms is None else args.baseline_fetch_wait_ms]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
