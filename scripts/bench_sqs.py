#!/usr/bin/env python3
"""The SQS-compatible API beside vqueues' own API, the same work through each (issue 59).

One node on the embedded broker (or the local Kafka cluster, --broker kafka), started and
stopped by this script. Each of 16 workers owns one queue and repeats a cycle of 10 records:
send them, receive them, delete them. The workers are spread over --processes client
processes (2 by default; boto3's threads in one process share its GIL).
  SQS (boto3)               a thread and a boto3 client per worker: SendMessageBatch of 10,
                            ReceiveMessage of 10 (WaitTimeSeconds 1), DeleteMessageBatch
  SQS (aiohttp, no SDK)     the same calls as aiohttp posts of the same JSON (an asyncio
                            task per worker): the surface's cost with a client that costs
                            little
  native, lease -> complete an asyncio task per worker, sharing its process's
                            vqueues_client AsyncClient: enqueue 10, lease 10 (wait 1 s),
                            complete them
  native, riding complete   the same, the completions riding on the next lease (ADR 16)
For each: records/s (records deleted or completed; the window includes each SQS worker's
CreateQueue), calls/s, the node's CPU (user + system, all threads) per call and per record,
the client processes' CPU per call (the clients share the machine with the node and the
broker), and the records/s beside the native lease -> complete.
Usage: .venv/bin/python scripts/bench_sqs.py [--seconds 10] [--workers 16] [--processes 2]
       [--broker embedded|kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "clients" / "python"))

import aiohttp  # noqa: E402
import bench  # noqa: E402
import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from vqueues_client import AsyncClient  # noqa: E402

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402

PARTITIONS = 16
BATCH = 10
VALUE = "x" * 100


def sqs_cycle(url: str, threads: int, stop_at: float) -> tuple[int, int, float]:
    """`threads` threads, each on a queue of its own: (records deleted, calls, CPU s)."""
    lock = threading.Lock()
    totals = [0, 0]

    def worker(i: int) -> None:
        sqs = boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x",
                           config=Config(retries={"max_attempts": 5}, read_timeout=30))
        q = sqs.create_queue(QueueName=f"sqs-{uuid.uuid4().hex[:8]}-{i}")["QueueUrl"]
        entries = [{"Id": str(k), "MessageBody": VALUE} for k in range(BATCH)]
        done = calls = 0
        while time.time() < stop_at:
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

    cpu0 = time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    return totals[0], totals[1], time.process_time() - cpu0


def lean_sqs_cycle(url: str, tasks: int, stop_at: float) -> tuple[int, int, float]:
    """The SQS calls of `sqs_cycle` as aiohttp posts of the same JSON, without an SDK: what
    the surface costs when the client costs little (records deleted, calls, CPU s)."""
    done = calls = 0
    entries = [{"Id": str(k), "MessageBody": VALUE} for k in range(BATCH)]

    async def worker(s: aiohttp.ClientSession, i: int) -> None:
        nonlocal done, calls

        async def call(action: str, body: dict[str, Any]) -> dict[str, Any]:
            async with s.post(url, data=json.dumps(body), headers={
                    "Content-Type": "application/x-amz-json-1.0",
                    "X-Amz-Target": f"AmazonSQS.{action}"}) as r:
                out: dict[str, Any] = await r.json(content_type=None)
                assert r.status == 200, out
                return out

        q = (await call("CreateQueue", {"QueueName": f"lean-{uuid.uuid4().hex[:8]}-{i}"}))[
            "QueueUrl"]
        while time.time() < stop_at:
            sent = await call("SendMessageBatch", {"QueueUrl": q, "Entries": entries})
            assert not sent.get("Failed"), sent
            got = (await call("ReceiveMessage", {"QueueUrl": q, "MaxNumberOfMessages": BATCH,
                                                 "WaitTimeSeconds": 1})).get("Messages", [])
            calls += 2
            if got:
                out = await call("DeleteMessageBatch", {"QueueUrl": q, "Entries": [
                    {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]}
                    for k, m in enumerate(got)]})
                assert not out.get("Failed"), out
                calls += 1
                done += len(got)

    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(worker(s, i) for i in range(tasks)))

    cpu0 = time.process_time()
    asyncio.run(run())
    return done, calls, time.process_time() - cpu0


def native_cycle(url: str, tasks: int, stop_at: float, riding: bool
                 ) -> tuple[int, int, float]:
    """`tasks` asyncio tasks, each on a queue of its own: (records completed, calls, CPU s)."""
    done = calls = 0
    values: list[Any] = [VALUE] * BATCH

    async def worker(vq: AsyncClient, i: int) -> None:
        nonlocal done, calls
        q = f"native-{uuid.uuid4().hex[:8]}-{i}"
        tokens: list[str] = []
        while time.time() < stop_at:
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

    async def run() -> None:
        async with AsyncClient([url]) as vq:
            await asyncio.gather(*(worker(vq, i) for i in range(tasks)))

    cpu0 = time.process_time()
    asyncio.run(run())
    return done, calls, time.process_time() - cpu0


def client_process(kind: str, url: str, workers: int, stop_at: float
                   ) -> tuple[int, int, float]:
    """One client process's share of the workers (run in a process of its own)."""
    if kind == "sqs":
        return sqs_cycle(url, workers, stop_at)
    if kind == "lean":
        return lean_sqs_cycle(url, workers, stop_at)
    return native_cycle(url, workers, stop_at, kind == "riding")


async def measured(name: str, kind: str, node: int, url: str, args: argparse.Namespace
                   ) -> dict[str, Any]:
    """The workers spread over `args.processes` client processes, for `args.seconds`."""
    shares = [args.workers // args.processes + (i < args.workers % args.processes)
              for i in range(args.processes)]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(args.processes, mp_context=mp.get_context("spawn")) as pool:
        # Started (and their imports done) before the window opens.
        await asyncio.gather(*(loop.run_in_executor(pool, time.sleep, 0.5)
                               for _ in range(args.processes)))
        cpu0 = bench.cpu_seconds(node)
        t0 = time.perf_counter()
        stop_at = time.time() + args.seconds
        parts = await asyncio.gather(*(loop.run_in_executor(
            pool, client_process, kind, url, n, stop_at) for n in shares if n))
        el = time.perf_counter() - t0
        cpu = bench.cpu_seconds(node) - cpu0
    records, calls = sum(p[0] for p in parts), sum(p[1] for p in parts)
    own = sum(p[2] for p in parts)
    out = {"name": name, "records": records / el, "calls": calls / el,
           "us_call": cpu / max(calls, 1) * 1e6, "us_record": cpu / max(records, 1) * 1e6,
           "client_us_call": own / max(calls, 1) * 1e6}
    print(f"  {name}: {out['records']:,.0f} rec/s, {out['calls']:,.0f} calls/s", flush=True)
    return out


async def main(args: argparse.Namespace) -> None:
    async with bench.broker_of(args.broker) as bootstrap:
        prefix = f"bs{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", PARTITIONS))
        procs, urls = bench.start_nodes(bootstrap, prefix, 1)
        try:
            await bench.wait_ready(urls, PARTITIONS)
            node, url = procs[0].pid, urls[0]
            print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: one node on the "
                  f"{args.broker} broker, {args.workers} workers in {args.processes} client "
                  f"processes, {BATCH} records per call, {args.seconds:g} s each", flush=True)
            rows = [
                await measured("SQS (boto3): send batch, receive, delete batch", "sqs",
                               node, url, args),
                await measured("SQS (aiohttp, no SDK): the same calls", "lean", node, url,
                               args),
                await measured("native: enqueue, lease -> complete", "native", node, url,
                               args),
                await measured("native: enqueue, lease + riding complete", "riding", node,
                               url, args),
            ]
        finally:
            bench.stop_nodes(procs)
    base = rows[2]["records"]
    print("\n| route | records/s | calls/s | node CPU µs per call | node CPU µs per record | "
          "client CPU µs per call | records/s vs native lease -> complete |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['records']:,.0f} | {r['calls']:,.0f} | {r['us_call']:.0f} | "
              f"{r['us_record']:.0f} | {r['client_us_call']:.0f} | {r['records'] / base:.2f}× |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded",
                    help="the embedded broker, or the local three-broker Kafka cluster")
    ap.add_argument("--processes", type=int, default=2,
                    help="client processes the workers are spread over (boto3's threads "
                         "share one GIL per process)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=16)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main(ap.parse_args()))
