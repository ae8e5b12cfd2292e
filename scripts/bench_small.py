#!/usr/bin/env python3
"""Small records to many queues, in one run on the embedded broker (or --bootstrap):

  single requests   --records records of 100 B, one per `POST /v1/queues/{q}/records`, spread
                    over --queues queues, --writers requests in flight
  raw producer      the floor under single requests: the raw confluent-kafka producer, one
                    record per produce request, --writers in flight, with nothing reading and
                    with a consumer tailing every partition (as a node's group member does)
  BatchProducer     the same records through the Python client's BatchProducer (one
                    multi-queue `POST /v1/records` per owner node), fed by --writers tasks
  end to end        enqueue -> a reader long-polling the queue, aiohttp client: p50/p99 busy
                    (back to back) and after 5 ms idle, beside the raw confluent-kafka
                    produce -> consume round trip on the same broker (the floor); and where
                    the idle figure goes: an HTTP exchange alone, the broker's acknowledgement
                    (raw), the node's own work on the write, the reader's wake-up and answer

Each load writes to fresh topics on the same broker, through one node started as `scripts/run`
starts it. The node's and the broker's CPU (user + system seconds per second) are printed
beside each figure (and this script's own: the client), and the records per produce request the
node's data producer sent.
Usage: .venv/bin/python scripts/bench_small.py [--records 200000] [--queues 100000]
       [--writers 16] [--samples 300]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import threading
import time
import uuid
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from vqueues_client import AsyncClient, BatchProducer  # noqa: E402

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402

VALUE = "x" * 100


def fresh_topics(bootstrap: str, partitions: int) -> str:
    prefix = f"small{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", partitions))
    return prefix


async def produce_requests(s: aiohttp.ClientSession, url: str) -> float:
    """Produce requests the node's data producer sent so far (its Prometheus counter)."""
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    m = re.search(r'^vq_produce_requests_total\{topic="data"\} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else float("nan")


async def single_requests(url: str, records: int, queues: int, writers: int) -> float:
    """`records` single-record enqueues over `queues` queues, `writers` in flight: rec/s."""
    names = [f"sq-{i}" for i in range(queues)]
    order = [names[i % queues] for i in range(records)]
    random.Random(7).shuffle(order)
    body = json.dumps({"records": [{"value": VALUE}]})
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=writers)
    async with aiohttp.ClientSession(connector=connector) as s:
        it = iter(order)

        async def writer() -> None:
            for q in it:
                async with s.post(f"{url}/v1/queues/{q}/records", data=body,
                                  headers=headers) as r:
                    assert r.status == 200, await r.text()
                    await r.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        return records / (time.perf_counter() - t0)


async def batch_producer(url: str, records: int, queues: int, writers: int) -> float:
    """The same load through BatchProducer, `writers` tasks each sending its share and
    awaiting each send as a caller of `send` does: rec/s."""
    names = [f"bq-{i}" for i in range(queues)]
    order = [names[i % queues] for i in range(records)]
    random.Random(7).shuffle(order)
    async with AsyncClient(url) as vq:
        await vq.refresh_map()
        producer = BatchProducer(vq, linger_ms=5)
        it = iter(order)

        async def writer() -> None:
            pending: list[asyncio.Future[int | None]] = []
            for q in it:
                pending.append(producer.send_nowait(q, VALUE))
                if len(pending) >= 1000 // writers * 4:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)

        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        await producer.flush()
        return records / (time.perf_counter() - t0)


def raw_single(bootstrap: str, topic: str, partitions: int, records: int, in_flight: int,
               tailed: bool) -> float:
    """The floor under single requests: the raw confluent-kafka producer (configured as the
    node's data producer) writing `records` records one per produce request, `in_flight` at
    once, spread over the partitions; with `tailed`, while a consumer tails every partition
    as a node's group member does (its fetch wait). Records/s."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0,
                         "compression.type": "lz4", "metadata.recovery.strategy": "none"})
    stop = threading.Event()
    tail = None
    if tailed:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4()}",
                             "enable.auto.commit": False, "metadata.recovery.strategy": "none",
                             "fetch.wait.max.ms": bench.FETCH_WAIT_MS[0]})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

        def follow() -> None:
            while not stop.is_set():
                consumer.consume(2000, 0.05)
            consumer.close()

        tail = threading.Thread(target=follow, daemon=True)
        tail.start()
    waiting = 0

    def acked(err: object, msg: object) -> None:
        nonlocal waiting
        assert err is None, err
        waiting -= 1

    value = VALUE.encode()
    try:
        t0 = time.perf_counter()
        for i in range(records):
            while waiting >= in_flight:
                producer.poll(0.001)
            producer.produce(topic, value, b"raw", partition=i % partitions, on_delivery=acked)
            waiting += 1
        producer.flush(30)
        return records / (time.perf_counter() - t0)
    finally:
        stop.set()
        if tail is not None:
            tail.join(5)


async def measure_raw(bootstrap: str, partitions: int, broker_pid: int | None,
                      args: argparse.Namespace, tailed: bool) -> dict[str, float]:
    topic = f"{fresh_topics(bootstrap, partitions)}-data"
    broker0 = bench.cpu_seconds(broker_pid) if broker_pid else 0.0
    w0 = time.perf_counter()
    rate = await asyncio.to_thread(raw_single, bootstrap, topic, partitions, args.records,
                                   args.writers, tailed)
    wall = time.perf_counter() - w0
    broker_cpu = (bench.cpu_seconds(broker_pid) - broker0) / wall if broker_pid else float("nan")
    print(f"raw producer, one record per produce request, {args.writers} in flight"
          f"{', a consumer tailing every partition' if tailed else ', nothing reading'}: "
          f"{rate:,.0f} records/s; broker {broker_cpu:.0%} of a core, "
          f"{broker_cpu / rate * 1e6:,.0f} us per record", flush=True)
    return {"rate": rate, "broker_cpu": broker_cpu}


async def measure_load(name: str, fn, bootstrap: str, partitions: int, broker_pid: int | None,
                       args: argparse.Namespace) -> dict[str, float]:
    prefix = fresh_topics(bootstrap, partitions)
    procs, urls = bench.start_nodes(bootstrap, prefix, 1)
    try:
        await bench.wait_ready(urls, partitions)
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(1.2)
            req0 = await produce_requests(s, urls[0])
            node0 = bench.cpu_seconds(procs[0].pid)
            broker0 = bench.cpu_seconds(broker_pid) if broker_pid else 0.0
            client0 = bench.cpu_seconds(os.getpid())
            w0 = time.perf_counter()
            rate = await fn(urls[0], args.records, args.queues, args.writers)
            wall = time.perf_counter() - w0
            node_cpu = (bench.cpu_seconds(procs[0].pid) - node0) / wall
            client_cpu = (bench.cpu_seconds(os.getpid()) - client0) / wall
            broker_cpu = ((bench.cpu_seconds(broker_pid) - broker0) / wall
                          if broker_pid else float("nan"))
            await asyncio.sleep(1.2)  # librdkafka's statistics come every second
            reqs = await produce_requests(s, urls[0]) - req0
        print(f"{name}: {rate:,.0f} records/s; CPU (of a core): node {node_cpu:.0%}, broker "
              f"{broker_cpu:.0%}, client {client_cpu:.0%}; {args.records / reqs:.1f} records "
              "per produce request", flush=True)
        return {"rate": rate, "node_cpu": node_cpu, "broker_cpu": broker_cpu,
                "client_cpu": client_cpu,
                "per_request": args.records / reqs}
    finally:
        bench.stop_nodes(procs)


async def measure_e2e(bootstrap: str, partitions: int, samples: int) -> list[str]:
    prefix = fresh_topics(bootstrap, partitions)
    procs, urls = bench.start_nodes(bootstrap, prefix, 1)
    try:
        await bench.wait_ready(urls, partitions)
        async with aiohttp.ClientSession() as s:
            idle, after_writer = await bench.vq_e2e(s, urls[0], "e2e-idle", samples)
            busy = await bench.vq_e2e_back_to_back(s, urls[0], "e2e-busy", samples)
            # The parts of the idle end to end, each after the same 5 ms pause: an HTTP
            # exchange alone, and a write alone (HTTP, the broker's acknowledgement, indexing).
            http = await bench.vq_http_floor(s, urls[0], samples, bench.IDLE_S)
            write = await bench.vq_latency(s, urls[0], "e2e-write", samples, bench.IDLE_S)
    finally:
        bench.stop_nodes(procs)
    raw_idle = await asyncio.to_thread(bench.raw_e2e, bootstrap, f"{prefix}-data", partitions,
                                       samples, bench.IDLE_S)
    raw_busy = await asyncio.to_thread(bench.raw_e2e, bootstrap, f"{prefix}-data", partitions,
                                       samples)
    raw_ack = await asyncio.to_thread(bench.raw_latency, bootstrap, f"{prefix}-data", samples,
                                      bench.IDLE_S)
    busy_lat = busy

    def ms(xs: list[float], p: float) -> float:
        return float(bench.pct(xs, p / 100))  # bench.pct takes a fraction, gives ms

    return [
        f"end to end, after 5 ms idle: vqueues p50 {ms(idle, 50):.2f} / p99 {ms(idle, 99):.2f} "
        f"ms; raw confluent-kafka produce -> consume p50 {ms(raw_idle, 50):.2f} / p99 "
        f"{ms(raw_idle, 99):.2f} ms",
        f"end to end, back to back: vqueues p50 {ms(busy_lat, 50):.2f} / p99 "
        f"{ms(busy_lat, 99):.2f} ms; raw p50 {ms(raw_busy, 50):.2f} / p99 "
        f"{ms(raw_busy, 99):.2f} ms",
        f"raw produce -> broker acknowledgement (acks=all) after 5 ms idle, the part of a "
        f"vqueues write the broker takes: p50 {ms(raw_ack, 50):.2f} / p99 "
        f"{ms(raw_ack, 99):.2f} ms",
        # p50s of separate measures: they add up only roughly to the end to end's p50.
        f"where the idle end to end goes, p50s: the HTTP exchange (GET /healthz) "
        f"{ms(http, 50):.2f} ms + the broker's acknowledgement (raw) {ms(raw_ack, 50):.2f} "
        f"ms + the node's own work on the write (a single enqueue, {ms(write, 50):.2f} ms, "
        f"less those two) {ms(write, 50) - ms(http, 50) - ms(raw_ack, 50):.2f} ms + the "
        f"reader's wake-up and answer after the writer's answer {ms(after_writer, 50):.2f} "
        f"ms = {ms(write, 50) + ms(after_writer, 50):.2f} ms (measured end to end: "
        f"{ms(idle, 50):.2f} ms)"]


async def on_broker(args: argparse.Namespace, work):
    """`work(bootstrap, broker_pid)` on --bootstrap, or on a fresh embedded broker of its own
    (tansu slows down as it stores more: each load starts from the same state)."""
    if args.bootstrap:
        return await work(args.bootstrap, None)
    broker = EmbeddedBroker().start()
    try:
        return await work(broker.bootstrap, broker.process.pid if broker.process else None)
    finally:
        broker.stop()


async def run(args: argparse.Namespace) -> None:
    print(f"# small records, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"{args.records:,} records over {args.queues:,} queues, {args.writers} writers, "
          f"{args.partitions} partitions, one node, "
          + ("each load on a fresh embedded broker" if not args.bootstrap else args.bootstrap),
          flush=True)
    parts = set(args.only or ("single", "raw", "batch", "e2e"))
    if "single" in parts:
        single = await on_broker(args, lambda b, pid: measure_load(
            "single requests", single_requests, b, args.partitions, pid, args))
    if "raw" in parts:
        raws = [await on_broker(args, lambda b, pid, t=tailed: measure_raw(
            b, args.partitions, pid, args, t)) for tailed in (False, True)]
        if "single" in parts:
            print(f"single requests / the raw producer: {single['rate'] / raws[0]['rate']:.2f}x "
                  f"with nothing reading, {single['rate'] / raws[1]['rate']:.2f}x tailed")
    if "batch" in parts:
        batch = await on_broker(args, lambda b, pid: measure_load(
            "BatchProducer (multi-queue requests)", batch_producer, b, args.partitions, pid,
            args))
    if {"single", "batch"} <= parts:
        print(f"BatchProducer / single requests: {batch['rate'] / single['rate']:.1f}x")
    if args.samples and "e2e" in parts:
        lines = await on_broker(args, lambda b, pid: measure_e2e(b, args.partitions,
                                                                 args.samples))
        print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing Kafka/Redpanda (default: embedded broker)")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--samples", type=int, default=300, help="end-to-end samples (0: skip)")
    ap.add_argument("--node-env", action="append", default=[], metavar="VQ_X=VALUE",
                    help="a setting for the node (repeatable), e.g. VQ_PRODUCER_BUSY_LINGER_MS=0")
    ap.add_argument("--only", choices=("single", "raw", "batch", "e2e"), action="append",
                    help="run only these parts (repeatable)")
    args = ap.parse_args()
    bench.DEV_ENV.update(dict(kv.split("=", 1) for kv in args.node_env))
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
