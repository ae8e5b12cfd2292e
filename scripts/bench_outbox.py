#!/usr/bin/env python3
"""The transactional outbox's relay beside BatchProducer, in one run (issue 61).

Starts the embedded broker, one node and a PostgreSQL server (Debian's binaries, as the tests
start it: tests/postgres.py), all on loopback, and measures:
  BatchProducer          --rows records of --value-bytes over --queues queues, sent at once
                         through one BatchProducer (linger 5 ms): records/s
  relay drain            the same records as outbox rows, committed first (100 per
                         transaction), then one `vqueues outbox relay` process started: rows/s
                         from its first delete until the last row is deleted
  commit -> enqueued     one row per transaction, --lag-samples of them 50 ms apart, the relay
                         idle between them: from the commit's return to a long-polling read's
                         answer (p50/p99)
  idle enqueue           one record per AsyncClient.enqueue, 50 ms apart: the round trip
                         (p50/p99), and an idle read's answer after its enqueue returned
The ratio relay / BatchProducer is printed (issue 61 asks for at least 0.5).
Usage: .venv/bin/python scripts/bench_outbox.py [--rows 20000] [--queues 100]
       [--value-bytes 100] [--lag-samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "clients" / "python"))

import bench  # noqa: E402
import psycopg  # noqa: E402
from vqueues_client import AsyncClient, BatchProducer  # noqa: E402
from vqueues_client.outbox import add_async  # noqa: E402

from tests.postgres import PostgresServer, server_bin  # noqa: E402
from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402
from vqueues.outbox.schema import install  # noqa: E402

PARTITIONS = 16


def pcts(samples_ms: list[float]) -> str:
    s = sorted(samples_ms)

    def at(p: float) -> float:
        return s[min(len(s) - 1, int(len(s) * p))]
    return f"p50 {at(0.5):7.2f} ms   p99 {at(0.99):7.2f} ms   ({len(s)} samples)"


async def producer_rate(url: str, records: list[tuple[str, str]]) -> float:
    async with AsyncClient(url) as vq:
        await vq.enqueue(records[0][0], "warm-up")
        start = time.perf_counter()
        async with BatchProducer(vq, linger_ms=5) as producer:
            await asyncio.gather(*(producer.send(q, v) for q, v in records))
        return len(records) / (time.perf_counter() - start)


async def commit_rows(dsn: str, records: list[tuple[str, str]], per_txn: int = 100) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for i in range(0, len(records), per_txn):
            async with conn.transaction():
                # Sorted queues in a transaction: one lock order for every writer.
                for q, v in sorted(records[i:i + per_txn]):
                    await add_async(conn, q, v)


def start_relay(dsn: str, url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "vqueues", "outbox", "relay", "--dsn", dsn,
                             "--url", url, "--log-format", "text", "--log-level", "warning"])


async def count_rows(conn: psycopg.AsyncConnection[object]) -> int:
    row = await (await conn.execute("SELECT count(*) FROM vqueues_outbox.records")).fetchone()
    return int(row[0]) if row else 0


async def lowest_id(conn: psycopg.AsyncConnection[object]) -> int | None:
    """The lowest row id left (the primary key's first entry: no scan of the table, which a
    count would be, every few milliseconds, beside the relay)."""
    row = await (await conn.execute(
        "SELECT id FROM vqueues_outbox.records ORDER BY id LIMIT 1")).fetchone()
    return None if row is None else int(row[0])


async def relay_rate(dsn: str, url: str) -> float:
    relay = start_relay(dsn, url)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            # From its first delete (the process's start and connections not counted).
            first = await lowest_id(conn)
            while await lowest_id(conn) == first:
                await asyncio.sleep(0.005)
            start = time.perf_counter()
            left = await count_rows(conn)
            while await lowest_id(conn) is not None:
                await asyncio.sleep(0.02)
        return left / (time.perf_counter() - start)
    finally:
        relay.terminate()
        relay.wait(30)


async def commit_lag(dsn: str, url: str, samples: int) -> list[float]:
    q = f"lag-{uuid.uuid4().hex[:6]}"
    relay = start_relay(dsn, url)
    out: list[float] = []
    try:
        async with AsyncClient(url) as vq, \
                await psycopg.AsyncConnection.connect(dsn) as conn:
            await asyncio.sleep(1.0)  # the relay holds its buckets and waits
            offset = 0
            for i in range(samples + 5):
                async with conn.transaction():
                    await add_async(conn, q, f"r{i}")
                committed = time.perf_counter()
                while True:
                    page = await vq.read(q, offset=offset, wait_ms=5000)
                    if page.records:
                        break
                arrived = time.perf_counter()
                offset = page.next_offset
                if i >= 5:  # the first few warm the connections up
                    out.append((arrived - committed) * 1000)
                await asyncio.sleep(0.05)
    finally:
        relay.terminate()
        relay.wait(30)
    return out


async def idle_enqueue(url: str, samples: int) -> tuple[list[float], list[float]]:
    q = f"idle-{uuid.uuid4().hex[:6]}"
    trips, visible = [], []
    async with AsyncClient(url) as vq:
        for i in range(samples + 5):
            start = time.perf_counter()
            res = await vq.enqueue(q, f"r{i}")
            sent = time.perf_counter()
            assert res.offsets is not None
            await vq.read(q, offset=res.offsets[0], limit=1)
            if i >= 5:
                trips.append((sent - start) * 1000)
                visible.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0.05)
    return trips, visible


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--lag-samples", type=int, default=200)
    args = ap.parse_args()
    bin_dir = server_bin()
    if bin_dir is None:
        sys.exit("PostgreSQL's server binaries are not installed (Debian's postgresql)")
    broker = EmbeddedBroker().start()
    pg = PostgresServer(bin_dir).start()
    prefix = f"bo{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": broker.bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", PARTITIONS))
    procs, urls = bench.start_nodes(broker.bootstrap, prefix, 1)
    try:
        await bench.wait_ready(urls, PARTITIONS)
        dsn = pg.create_database("bench")
        with psycopg.connect(dsn) as conn:
            install(conn)
        value = "x" * args.value_bytes
        tag = uuid.uuid4().hex[:6]

        def records(kind: str) -> list[tuple[str, str]]:
            return [(f"{kind}-{tag}-{i % args.queues}", value) for i in range(args.rows)]

        direct = await producer_rate(urls[0], records("bp"))
        print(f"BatchProducer        {direct:10,.0f} records/s", flush=True)
        start = time.perf_counter()
        await commit_rows(dsn, records("ob"))
        writes = args.rows / (time.perf_counter() - start)
        print(f"outbox inserts       {writes:10,.0f} rows/s (100 per transaction, one "
              "connection)", flush=True)
        relayed = await relay_rate(dsn, urls[0])
        print(f"relay drain          {relayed:10,.0f} rows/s   = {relayed / direct:.2f}x "
              "BatchProducer", flush=True)
        lag = await commit_lag(dsn, urls[0], args.lag_samples)
        print(f"commit -> enqueued   {pcts(lag)}", flush=True)
        trips, visible = await idle_enqueue(urls[0], args.lag_samples)
        print(f"idle enqueue         {pcts(trips)}", flush=True)
        print(f"idle enqueue + read  {pcts(visible)}", flush=True)
    finally:
        bench.stop_nodes(procs)
        pg.stop()
        broker.stop()


if __name__ == "__main__":
    asyncio.run(main())
