#!/usr/bin/env python3
"""The two clients side by side, in one run against one node on the embedded broker: enqueue
throughput (100-record batches of 100 B, --concurrency calls in flight over 10 queues, for
--seconds), enqueue -> a reader long-polling the queue (p50 / p99, --samples), and each
client's `Worker` (16 slots, a no-op handler) draining --worker-records records of 100 B over
10 queues, through the Python client (`AsyncClient`) and the TypeScript client
(clients/typescript, built with `npm ci && npm run build`; skipped, saying so, where node is
missing), each in its own process's event loop, one after the other. The client's own CPU is
printed beside each figure.
Usage: .venv/bin/python scripts/bench_clients.py [--seconds 4] [--concurrency 16]
       [--samples 200] [--worker-records 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from vqueues_client import AsyncClient, Worker  # noqa: E402

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402

TS = ROOT / "clients" / "typescript"
BATCH = ["x" * 100] * 100


async def python_worker(vq: AsyncClient, total: int) -> float:
    """A `Worker` (16 slots, a no-op handler) draining `total` records over 10 queues."""
    names = [f"pyw-{uuid.uuid4().hex[:6]}-{i}" for i in range(10)]
    fill = ["x" * 100] * 500
    for q in names:
        for _ in range(0, total // 10, len(fill)):
            await vq.enqueue(q, fill)
    done = 0

    async def handle(lease: object) -> None:
        nonlocal done
        done += 1

    t0 = time.perf_counter()
    worker = Worker(vq, names, "bench", handle, concurrency=16, wait_ms=200)
    runner = asyncio.create_task(worker.run())
    while done < total:
        await asyncio.sleep(0.005)
    rate = done / (time.perf_counter() - t0)
    await worker.stop()
    await runner
    return rate


async def python_client(url: str, seconds: float, concurrency: int, samples: int,
                        worker_records: int) -> dict[str, float]:
    async with AsyncClient(url) as vq:
        await vq.refresh_map()
        await vq.enqueue("pyb-warm", BATCH)
        records = 0
        until = time.monotonic() + seconds

        async def worker(i: int) -> None:
            nonlocal records
            while time.monotonic() < until:
                await vq.enqueue(f"pyb-{i % 10}", BATCH)
                records += len(BATCH)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        rate = records / (time.perf_counter() - t0)
        q = f"pye2e-{uuid.uuid4().hex[:6]}"
        nxt = (await vq.read(q)).next_offset
        out = []
        for _ in range(samples):
            reader = asyncio.create_task(vq.read(q, offset=nxt, wait_ms=5000))
            await asyncio.sleep(0.005)
            t0 = time.perf_counter()
            page, _ = await asyncio.gather(reader, vq.enqueue(q, "x" * 100))
            out.append(time.perf_counter() - t0)
            nxt = page.next_offset
        drained = await python_worker(vq, worker_records) if worker_records else 0.0
    return {"throughput": rate, "e2e_p50": bench.pct(out, 0.5), "e2e_p99": bench.pct(out, 0.99),
            "worker": drained}


def typescript_client(url: str, args: argparse.Namespace) -> dict[str, float] | str:
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "skipped: node and npm are not installed"
    # Built every time: a dist/ left from an older checkout would measure that code.
    if not (TS / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True,
                       capture_output=True)
    subprocess.run(["npm", "run", "build"], cwd=TS, check=True, capture_output=True)
    t0 = os.times()
    out = subprocess.run(["node", "dist/bench/bench.js", url, str(args.seconds),
                          str(args.concurrency), str(args.samples), str(args.worker_records)],
                         cwd=TS, check=True, capture_output=True, text=True)
    t1 = os.times()
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    figures["cpu_s"] = (t1.children_user + t1.children_system
                        - t0.children_user - t0.children_system)
    return figures


async def run(args: argparse.Namespace) -> None:
    broker = EmbeddedBroker().start()
    procs = []
    try:
        prefix = f"clients{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": broker.bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", 16))
        procs, urls = bench.start_nodes(broker.bootstrap, prefix, 1)
        await bench.wait_ready(urls, 16)
        t0 = time.process_time()
        py = await python_client(urls[0], args.seconds, args.concurrency, args.samples,
                                 args.worker_records)
        py["cpu_s"] = time.process_time() - t0
        ts = await asyncio.to_thread(typescript_client, urls[0], args)
    finally:
        bench.stop_nodes(procs)
        broker.stop()
    print(f"# clients, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: one node, embedded "
          f"broker; {args.concurrency} calls in flight, 100-record batches, {args.seconds:.0f} s; "
          f"{args.samples} end-to-end samples")
    print("| client | enqueue | enqueue -> long-polling reader p50 / p99 | `Worker`, 16 slots, "
          "no-op handler | client CPU |")
    print("|---|---|---|---|---|")
    for name, res in (("Python (AsyncClient)", py), ("TypeScript (vqueues-client)", ts)):
        if isinstance(res, str):
            print(f"| {name} | {res} | | | |")
            continue
        print(f"| {name} | {res['throughput']:,.0f} rec/s | {res['e2e_p50']:.2f} / "
              f"{res['e2e_p99']:.2f} ms | {res['worker']:,.0f} rec/s | {res['cpu_s']:.1f} s |")
    if not isinstance(ts, str):
        print(f"TypeScript / Python enqueue: {ts['throughput'] / py['throughput']:.2f}x; "
              f"Worker: {ts['worker'] / max(py['worker'], 1e-9):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--worker-records", type=int, default=50_000,
                    help="records each client's Worker drains (0: skip)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
