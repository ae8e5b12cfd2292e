#!/usr/bin/env python3
"""The SQS-compatible API beside vqueues' own API, the same work through each (issue 59).

One node on the embedded broker (or --bootstrap), started and stopped by this script. Each
of 16 workers owns one queue and repeats a cycle of 10 records: send them, receive them,
delete them.
  SQS (boto3)               16 threads, a boto3 client each: SendMessageBatch of 10,
                            ReceiveMessage of 10 (WaitTimeSeconds 1), DeleteMessageBatch
  native, lease -> complete 16 asyncio tasks sharing a vqueues_client AsyncClient: enqueue
                            10, lease 10 (wait 1 s), complete them
  native, riding complete   the same, the completions riding on the next lease (ADR 16)
For each: records/s (records deleted or completed; the window includes each SQS worker's
CreateQueue), calls/s, the node's CPU (user + system, all threads) per call and per record,
this client process's CPU per call (boto3 and vqueues_client share the machine with the node),
and the records/s beside the native lease -> complete.
Usage: .venv/bin/python scripts/bench_sqs.py [--seconds 10] [--workers 16] [--bootstrap H:P]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "clients" / "python"))

import bench  # noqa: E402
import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from vqueues_client import AsyncClient  # noqa: E402

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402

PARTITIONS = 16
BATCH = 10
VALUE = "x" * 100


def sqs_cycle(url: str, workers: int, seconds: float) -> tuple[int, int]:
    """`workers` threads, each on a queue of its own: (records deleted, calls)."""
    stop = time.perf_counter() + seconds
    lock = threading.Lock()
    totals = [0, 0]

    def worker(i: int) -> None:
        sqs = boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x",
                           config=Config(retries={"max_attempts": 5}, read_timeout=30))
        q = sqs.create_queue(QueueName=f"sqs-{uuid.uuid4().hex[:8]}-{i}")["QueueUrl"]
        entries = [{"Id": str(k), "MessageBody": VALUE} for k in range(BATCH)]
        done = calls = 0
        while time.perf_counter() < stop:
            sent = sqs.send_message_batch(QueueUrl=q, Entries=entries)  # type: ignore[arg-type]
            assert not sent.get("Failed"), sent
            got = sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=BATCH,
                                      WaitTimeSeconds=1).get("Messages", [])
            calls += 2
            if got:
                out = sqs.delete_message_batch(QueueUrl=q, Entries=[
                    {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]}
                    for k, m in enumerate(got)])
                assert not out.get("Failed"), out
                calls += 1
                done += len(got)
        with lock:
            totals[0] += done
            totals[1] += calls

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, range(workers)))
    return totals[0], totals[1]


async def native_cycle(url: str, workers: int, seconds: float, riding: bool
                       ) -> tuple[int, int]:
    """`workers` asyncio tasks, each on a queue of its own: (records completed, calls)."""
    stop = time.perf_counter() + seconds
    done = calls = 0
    values: list[Any] = [VALUE] * BATCH

    async def worker(vq: AsyncClient, i: int) -> None:
        nonlocal done, calls
        q = f"native-{uuid.uuid4().hex[:8]}-{i}"
        tokens: list[str] = []
        while time.perf_counter() < stop:
            await vq.enqueue(q, values)
            if riding:
                page = await vq.lease(q, "bench", max_records=BATCH, wait_ms=1000,
                                      complete=tokens)
                calls += 2
                done += len(page.completed)
                tokens = [x.token for x in page]
            else:
                page = await vq.lease(q, "bench", max_records=BATCH, wait_ms=1000)
                calls += 2
                if page:
                    await vq.complete(q, "bench", list(page))
                    calls += 1
                    done += len(page)
        if tokens:  # the last lease's records, completed alone (outside the window)
            await vq.complete(q, "bench", tokens)

    async with AsyncClient([url]) as vq:
        await asyncio.gather(*(worker(vq, i) for i in range(workers)))
    return done, calls


async def measured(name: str, node: int, run: Callable[[], Awaitable[tuple[int, int]]]
                   ) -> dict[str, Any]:
    cpu0, own0 = bench.cpu_seconds(node), time.process_time()
    t0 = time.perf_counter()
    records, calls = await run()
    el = time.perf_counter() - t0
    cpu, own = bench.cpu_seconds(node) - cpu0, time.process_time() - own0
    out = {"name": name, "records": records / el, "calls": calls / el,
           "us_call": cpu / max(calls, 1) * 1e6, "us_record": cpu / max(records, 1) * 1e6,
           "client_us_call": own / max(calls, 1) * 1e6}
    print(f"  {name}: {out['records']:,.0f} rec/s, {out['calls']:,.0f} calls/s", flush=True)
    return out


async def main(args: argparse.Namespace) -> None:
    broker = None if args.bootstrap else EmbeddedBroker().start()
    try:
        bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
        prefix = f"bs{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", PARTITIONS))
        procs, urls = bench.start_nodes(bootstrap, prefix, 1)
        try:
            await bench.wait_ready(urls, PARTITIONS)
            node, url, w, secs = procs[0].pid, urls[0], args.workers, args.seconds
            print(f"one node, {w} workers, {BATCH} records per call, {secs:g} s each:",
                  flush=True)
            rows = [
                await measured("SQS (boto3): send batch, receive, delete batch", node,
                               lambda: asyncio.to_thread(sqs_cycle, url, w, secs)),
                await measured("native: enqueue, lease -> complete", node,
                               lambda: native_cycle(url, w, secs, False)),
                await measured("native: enqueue, lease + riding complete", node,
                               lambda: native_cycle(url, w, secs, True)),
            ]
        finally:
            bench.stop_nodes(procs)
    finally:
        if broker:
            broker.stop()
    base = rows[1]["records"]
    print("\n| route | records/s | calls/s | node CPU µs per call | node CPU µs per record | "
          "client CPU µs per call | records/s vs native lease -> complete |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['records']:,.0f} | {r['calls']:,.0f} | {r['us_call']:.0f} | "
              f"{r['us_record']:.0f} | {r['client_us_call']:.0f} | {r['records'] / base:.2f}× |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: the embedded broker)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=16)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(ap.parse_args()))
