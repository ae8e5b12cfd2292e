#!/usr/bin/env python3
"""Work queues beside the cursor path and beside Redis Streams, in one run (issue 34).

One node on the embedded broker (or --bootstrap), one asyncio aiohttp client process, 10
queues prefilled with 100-byte records unless said:
  healthz              bare GET /healthz, 16 in flight: the client's and the node's floor
  cursor enqueue       batches of 100 records, 16 in flight over 10 queues
  lease -> complete    16 workers over 10 queues, 100 and 10 records per lease
  lease + riding complete  the same, each worker's completions riding on its next lease
  many workers         256 workers over 1,000 queues, 10 per lease
  per-key order        the 16-worker run over records carrying 100 distinct ordering keys
  Worker               vqueues_client.Worker, 16 slots, a no-op handler, 200,000 records
  lease end to end     enqueue -> a lease long-polling the queue (p50/p99) beside enqueue -> a
                       cursor read long-polling it (rounds alternating), and where it goes:
                       an HTTP exchange, the broker's acknowledgement (a raw produce), the
                       node's own work on the write, the lease's answer after the writer's
  dead letters         2,000 consumers' last leases expiring together: how long after the
                       deadline each record reached the dead-letter queue (p50/p99)
  idle queue memory    bytes per queue a prefix consumer leased from once and left idle
For each: records/s, requests/s, the node's CPU per record (user + system, all threads), and
records per server CPU-second (node + broker); and the lease window's memory per in-flight
record. With redis-server on the PATH and redis-py
installed, Redis 7 Streams (AOF everysec) drained the same way (16 asyncio workers in one
process, XREADGROUP COUNT 10/100 + XACK; 200,000 records over 10 streams) beside them.
--baseline CHECKOUT runs an older vqueues (a git worktree) first, then this one, each on a
broker of its own, and prints the older figures beside the new.
Usage: .venv/bin/python scripts/bench_work.py [--seconds 5] [--records 200000]
       [--baseline /tmp/before]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402
from peers.redis_peer import xreadgroup_drain  # noqa: E402
from peers.vqueues_peer import drain_with_worker  # noqa: E402
from vqueues_client import AsyncClient  # noqa: E402

from vqueues.hashing import partition_for  # noqa: E402
from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402

VALUE = "x" * 100
PARTITIONS = 16


class Cpu:
    """User + system seconds of some processes over a window."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start = sum(bench.cpu_seconds(p) for p in pids)

    def used(self) -> float:
        return sum(bench.cpu_seconds(p) for p in self.pids) - self.start


async def measured(name: str, node: int, broker: int | None,
                   run: Callable[[], Awaitable[tuple[int, int]]]) -> dict[str, Any]:
    """Run `run` (returns records, requests) and time it and the servers' CPU."""
    node_cpu = Cpu([node])
    server_cpu = Cpu([node] + ([broker] if broker else []))
    t0 = time.perf_counter()
    records, requests = await run()
    el = time.perf_counter() - t0
    out = {"name": name, "records": records / el, "requests": requests / el,
           "node_us": node_cpu.used() / max(records, 1) * 1e6,
           "per_server_cpu_s": records / max(server_cpu.used(), 1e-9)}
    print(f"  {name}: {out['records']:,.0f} rec/s, {out['requests']:,.0f} req/s", flush=True)
    return out


async def prefill(s: aiohttp.ClientSession, route: Callable[[str], str], names: list[str],
                  per_queue: int, keys: int = 0) -> None:
    for q in names:
        for start in range(0, per_queue, 500):
            recs: list[dict[str, Any]] = [{"value": VALUE} for _ in range(500)]
            if keys:
                for i, r in enumerate(recs):
                    r["headers"] = {"vq-ordering-key": f"k{(start + i) % keys}"}
            async with s.post(route(q) + f"/v1/queues/{q}/records",
                              json={"records": recs}) as r:
                assert r.status == 200, await r.text()


async def drain(s: aiohttp.ClientSession, route: Callable[[str], str], names: list[str],
                workers: int, batch: int, seconds: float, riding: bool = False
                ) -> tuple[int, int]:
    """Lease -> complete, `workers` in flight over `names`: (records, requests). `riding`:
    each worker stays on one queue and sends its finished tokens with its next lease (one
    call per cycle, ADR 16), completing the last ones alone."""
    count = calls = 0
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal count, calls
        k = i
        done: list[str] = []
        base = ""
        while time.perf_counter() < stop:
            if not riding or not base:
                q = names[k % len(names)]
                k += 1
                base = route(q) + f"/v1/queues/{q}/consumers/bench"
            body: dict[str, Any] = {"max_records": batch}
            if riding:
                body["complete"] = done
            async with s.post(base + "/lease", json=body) as r:
                page = await r.json()
                assert r.status == 200, page
            calls += 1
            got = page["records"]
            if riding:
                count += len(page.get("completed", ()))
                done = [x["token"] for x in got]
            elif got:
                async with s.post(base + "/complete",
                                  json={"tokens": [x["token"] for x in got]}) as r:
                    assert r.status == 200, await r.text()
                calls += 1
                count += len(got)
        if done:
            async with s.post(base + "/complete", json={"tokens": done}) as r:
                assert r.status == 200, await r.text()
            calls += 1
            count += len(done)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    return count, calls


async def rides(s: aiohttp.ClientSession, url: str) -> bool:
    """Whether the node takes completions on a lease (an older checkout answers 400)."""
    async with s.post(url + "/v1/queues/probe-rides/consumers/bench/lease",
                      json={"complete": []}) as r:
        return r.status == 200


async def healthz(s: aiohttp.ClientSession, url: str, seconds: float) -> tuple[int, int]:
    n = 0
    stop = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal n
        while time.perf_counter() < stop:
            async with s.get(url + "/healthz") as r:
                await r.read()
            n += 1

    await asyncio.gather(*(one() for _ in range(16)))
    return n, n


async def worker_drain(url: str, names: list[str], total: int) -> tuple[int, int]:
    async with AsyncClient(url) as vq:
        return await drain_with_worker(vq, names, total, 16)


async def expiry_lateness(s: aiohttp.ClientSession, route: Callable[[str], str],
                          consumers: int = 2000) -> list[float]:
    """`consumers` queues, each with a consumer of max_attempts 1 and a dead-letter queue and
    one record leased for 3 s: how long after its lease's deadline each record was written to
    the dead letters (its timestamp there), in seconds."""
    tag = uuid.uuid4().hex[:6]
    names, dlq = [f"x-{tag}-{i}" for i in range(consumers)], f"x-{tag}-dead"
    limit = asyncio.Semaphore(16)
    deadlines: dict[str, int] = {}

    async def setup(q: str) -> None:
        async with limit:
            async with s.put(f"{route(q)}/v1/queues/{q}/consumers/w", json={
                    "max_attempts": 1, "dead_letter_queue": dlq}) as r:
                assert r.status == 200, await r.text()
            async with s.post(f"{route(q)}/v1/queues/{q}/records",
                              json={"records": [{"value": "x"}]}) as r:
                assert r.status == 200, await r.text()
            async with s.post(f"{route(q)}/v1/queues/{q}/consumers/w/lease",
                              json={"max_records": 1, "visibility_ms": 3000}) as r:
                deadlines[q] = (await r.json())["records"][0]["deadline"]

    await asyncio.gather(*(setup(q) for q in names))
    await asyncio.sleep(max(0.0, max(deadlines.values()) / 1000 - time.time()) + 2)
    late: list[float] = []
    offset = 0
    while len(late) < consumers:
        async with s.get(f"{route(dlq)}/v1/queues/{dlq}/records", params={
                "limit": "1000", "offset": str(offset), "wait_ms": "5000"}) as r:
            page = await r.json()
        if not page["records"]:
            break
        late += [(x["timestamp"] - deadlines[x["headers"]["vq-dlq-source-queue"]]) / 1000
                 for x in page["records"]]
        offset = page["next_offset"]
    assert len(late) == consumers, f"{len(late)} of {consumers} dead-lettered"
    return late


async def measure_vqueues(args: argparse.Namespace, code: str | None = None
                         ) -> list[dict[str, Any]]:
    broker = None if args.bootstrap else EmbeddedBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
    broker_pid = broker.process.pid if broker and broker.process else None
    prefix = f"bw{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", PARTITIONS))
    procs, urls = bench.start_nodes(bootstrap, prefix, 1, code)
    out = []
    try:
        owners = await bench.wait_ready(urls, PARTITIONS)

        def route(q: str) -> str:
            return owners[partition_for(q, PARTITIONS)]

        node = procs[0].pid
        secs = args.seconds
        conn = aiohttp.TCPConnector(limit=300)
        async with aiohttp.ClientSession(connector=conn) as s:
            print(f"vqueues, one node{' of ' + code if code else ''}:", flush=True)
            out.append(await measured("healthz", node, broker_pid,
                                      lambda: healthz(s, urls[0], secs)))

            async def enqueue() -> tuple[int, int]:
                rate = await bench.vq_throughput(s, urls, secs, 16, route, queues=10)
                return int(rate * secs), int(rate * secs / 100)
            out.append(await measured("cursor enqueue, 100 per request", node, broker_pid,
                                      enqueue))
            # Enough records that neither run goes dry within its window (40,000 per queue
            # capped the run of 100 per call at 80,000 records/s).
            riding = await rides(s, urls[0])
            for batch, per_queue in ((100, 100_000), (10, 15_000)):
                names = [f"l{batch}-{uuid.uuid4().hex[:6]}-{i}" for i in range(10)]
                await prefill(s, route, names, per_queue)
                out.append(await measured(
                    f"lease -> complete, {batch} per call", node, broker_pid,
                    lambda names=names, batch=batch: drain(s, route, names, 16, batch, secs)))
                if riding:  # the same, each completion riding on the worker's next lease
                    names = [f"r{batch}-{uuid.uuid4().hex[:6]}-{i}" for i in range(10)]
                    await prefill(s, route, names, per_queue)
                    out.append(await measured(
                        f"lease + riding complete, {batch} per call", node, broker_pid,
                        lambda names=names, batch=batch: drain(s, route, names, 16, batch,
                                                               secs, riding=True)))
            many = [f"m-{uuid.uuid4().hex[:6]}-{i}" for i in range(1000)]
            await prefill(s, route, many, 500)
            out.append(await measured("256 workers over 1,000 queues, 10 per call", node,
                                      broker_pid,
                                      lambda: drain(s, route, many, 256, 10, secs)))
            keyed = [f"k-{uuid.uuid4().hex[:6]}-{i}" for i in range(10)]
            await prefill(s, route, keyed, 8_000, keys=100)
            out.append(await measured("per-key order (100 keys), 10 per call", node,
                                      broker_pid,
                                      lambda: drain(s, route, keyed, 16, 10, secs)))
            wq = [f"w-{uuid.uuid4().hex[:6]}-{i}" for i in range(10)]
            await prefill(s, route, wq, args.records // 10)
            out.append(await measured("Worker, 16 slots, no-op handler", node, broker_pid,
                                      lambda: worker_drain(urls[0], wq, args.records)))
            # The lease's end to end and the cursor read's, in alternating rounds of the same
            # shape, so a slower minute weighs on both alike.
            after: list[float] = []
            e2e: list[float] = []
            cursor: list[float] = []
            rounds = max(1, args.samples // 50)
            for i in range(rounds):  # a queue per round: a read starts at its end
                e2e += await bench.vq_lease_e2e(s, route("le2e"), "le2e",
                                                args.samples // rounds, after)
                cursor += (await bench.vq_e2e(s, route(f"ce2e-{i}"), f"ce2e-{i}",
                                              args.samples // rounds))[0]
            # Its parts, each after the same 5 ms pause as the end to end's writes: an HTTP
            # exchange alone, a write alone, the broker's acknowledgement of a raw produce.
            http = await bench.vq_http_floor(s, urls[0], args.samples, bench.IDLE_S)
            write = await bench.vq_latency(s, route("le2e-w"), "le2e-w", args.samples,
                                           bench.IDLE_S)
            ack = await asyncio.to_thread(bench.raw_latency, bootstrap, f"{prefix}-data",
                                          args.samples, bench.IDLE_S)
            out.append({"name": "enqueue -> long-polling lease", "p50": bench.pct(e2e, .5),
                        "p99": bench.pct(e2e, .99), "http": bench.pct(http, .5),
                        "write": bench.pct(write, .5), "ack": bench.pct(ack, .5),
                        "after": bench.pct(after, .5), "cursor_p50": bench.pct(cursor, .5),
                        "cursor_p99": bench.pct(cursor, .99)})
            late = await expiry_lateness(s, route)
            out.append({"name": "dead letters after the deadline", "p50": bench.pct(late, .5),
                        "p99": bench.pct(late, .99)})
    finally:
        bench.stop_nodes(procs)
        if broker:
            broker.stop()
    return out


async def measure_redis(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Redis Streams drained like the lease runs above: 16 asyncio workers, one process."""
    server = shutil.which("redis-server")
    try:
        import redis.asyncio as aredis
    except ImportError:
        print("redis-py is not installed: no Redis Streams rows", flush=True)
        return []
    if server is None:
        print("redis-server is not installed (Debian: apt-get install redis-server): "
              "no Redis Streams rows", flush=True)
        return []
    folder = tempfile.mkdtemp(prefix="vq-redis-")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder,
                             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        r = aredis.Redis(host="127.0.0.1", port=port, max_connections=64)
        for _ in range(100):
            try:
                await r.ping()
                break
            except Exception:
                await asyncio.sleep(0.05)
        print("Redis Streams (AOF everysec):", flush=True)

        for count in (100, 10):
            streams = [f"s{count}-{i}" for i in range(10)]
            per_stream = args.records // 10 // 1000 * 1000
            for st in streams:
                await r.xgroup_create(st, "g", id="0", mkstream=True)
                for _ in range(per_stream // 1000):
                    pipe = r.pipeline(transaction=False)
                    for _ in range(1000):
                        pipe.xadd(st, {"v": VALUE})
                    await pipe.execute()

            async def run(streams: list[str] = streams, count: int = count,
                          total: int = per_stream * 10) -> tuple[int, int]:
                return await xreadgroup_drain(r, streams, total, 16, count)
            out.append(await measured(f"XREADGROUP COUNT {count} + XACK", proc.pid, None, run))
        await r.aclose()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def report(vq: list[dict[str, Any]], rd: list[dict[str, Any]],
           base: list[dict[str, Any]] | None = None) -> None:
    rows = {r["name"]: r for r in vq}
    before = {r["name"]: r for r in base or []}
    cursor = rows["cursor enqueue, 100 per request"]
    hz = rows["healthz"]
    print(f"\n# bench_work {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: one node, "
          f"broker {'given' if ARGS.bootstrap else 'embedded tansu'}, {PARTITIONS} partitions")
    extra = f" {ARGS.baseline}: records/s, node µs/record |" if base else ""
    print("| measure | records/s | requests/s | ratio | node CPU µs/record | "
          "records per server CPU-s |" + extra)
    print("|---|---|---|---|---|---|" + ("---|" if base else ""))
    for r in vq:
        if "records" not in r:
            continue
        if r["name"] == "healthz":
            ratio = "1 (requests)"
        elif "lease" in r["name"] or "workers" in r["name"] or "per-key" in r["name"]:
            ratio = (f"{r['records'] / cursor['records']:.2f}× cursor; "
                     f"{r['requests'] / hz['requests']:.2f}× healthz requests")
        elif r["name"].startswith("Worker"):
            ratio = f"{r['records'] / cursor['records']:.2f}× cursor"
        else:
            ratio = "1 (records)"
        was = before.get(r["name"])
        then = (f" {was['records']:,.0f}, {was['node_us']:.0f} |" if was and "records" in was
                else " |" if base else "")
        print(f"| {r['name']} | {r['records']:,.0f} | {r['requests']:,.0f} | {ratio} | "
              f"{r['node_us']:.0f} | {r['per_server_cpu_s']:,.0f} |" + then)
    for r in rd:
        print(f"| Redis Streams: {r['name']} | {r['records']:,.0f} | {r['requests']:,.0f} | | | "
              f"{r['per_server_cpu_s']:,.0f} |")
    e2e = rows["enqueue -> long-polling lease"]
    print(f"enqueue -> long-polling lease: p50 {e2e['p50']:.2f} ms, p99 {e2e['p99']:.2f} ms")
    if "cursor_p50" in e2e:
        print(f"  enqueue -> long-polling cursor read, rounds alternating with it: p50 "
              f"{e2e['cursor_p50']:.2f} ms, p99 {e2e['cursor_p99']:.2f} ms; the lease "
              f"{e2e['p50'] / e2e['cursor_p50']:.2f}x at p50, "
              f"{e2e['p99'] / e2e['cursor_p99']:.2f}x at p99")
    # p50s of separate measures: they add up only roughly to the end to end's p50.
    print(f"  where it goes, p50s: the HTTP exchange (GET /healthz) {e2e['http']:.2f} ms + the "
          f"broker's acknowledgement (raw produce) {e2e['ack']:.2f} ms + the node's own work "
          f"on the write (a single enqueue, {e2e['write']:.2f} ms, less those two) "
          f"{e2e['write'] - e2e['http'] - e2e['ack']:.2f} ms + the lease's answer after the "
          f"writer's (the grant's write to the offset topic, the wake-up, the answer) "
          f"{e2e['after']:.2f} ms = {e2e['write'] + e2e['after']:.2f} ms")
    if "enqueue -> long-polling lease" in before:
        e2e = before["enqueue -> long-polling lease"]
        print(f"  {ARGS.baseline}: p50 {e2e['p50']:.2f} ms, p99 {e2e['p99']:.2f} ms")
    late = rows["dead letters after the deadline"]
    print(f"2,000 consumers' last leases expiring together, written to the dead letters after "
          f"the deadline: p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms")
    if "dead letters after the deadline" in before:
        late = before["dead letters after the deadline"]
        print(f"  {ARGS.baseline}: p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms")
    red = {r["name"]: r for r in rd}
    for batch in (10, 100):
        ours, theirs = rows[f"lease -> complete, {batch} per call"], red.get(
            f"XREADGROUP COUNT {batch} + XACK")
        if theirs:
            print(f"records per server CPU-second at {batch} per call: vqueues "
                  f"{ours['per_server_cpu_s']:,.0f}, Redis {theirs['per_server_cpu_s']:,.0f} "
                  f"({ours['per_server_cpu_s'] / theirs['per_server_cpu_s']:.2f}×)")
    worker, r10 = rows["Worker, 16 slots, no-op handler"], red.get("XREADGROUP COUNT 10 + XACK")
    if r10:
        print(f"Worker (16 slots) {worker['records']:,.0f} rec/s beside redis-py (16 workers, "
              f"10 per call) {r10['records']:,.0f} rec/s "
              f"({worker['records'] / r10['records']:.2f}×)")


def window_memory(n: int = 100_000) -> float:
    """Bytes per in-flight record of a lease window holding `n` leased records (tracemalloc:
    the deliveries, their dict, the index's heap)."""
    import gc
    import tracemalloc
    from array import array

    from vqueues.state.window import LeaseWindow
    offsets = array("q", range(0, 2 * n, 2))
    work = LeaseWindow(0)
    work.ensure_index(0, 5)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for off in offsets:
        work.join(off, None, 0)
    for off in offsets:
        work.put(off, True, 10**13, 1, 12345, None, 0)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / n


def idle_queue_memory(n: int = 20_000) -> float:
    """Bytes per queue a prefix consumer leased from once and left idle (its records done):
    its consumer's settings, committed offset and empty window, as its partition holds them
    (tracemalloc; the queues and their records are made before counting). The state is built
    through the offset entries the lease and the completion wrote, as a successor replays
    them, with the window indexed for the lease as its owner had it."""
    import gc
    import tracemalloc

    from vqueues.records import (
        ConsumerAcked,
        ConsumerConfigured,
        DeliveryGroup,
        Record,
        WindowDelta,
    )
    from vqueues.state.cache import RecordCache
    from vqueues.state.consumer_config import LEASE
    from vqueues.state.partition_state import PartitionState
    state = PartitionState(0, RecordCache(1 << 20))
    names = [f"tenant-{i:06d}" for i in range(n)]
    for i, q in enumerate(names):
        state.index.append(q, [Record(i, 0, VALUE.encode(), ())])
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, q in enumerate(names):
        state.apply_offset_entries([
            ConsumerAcked(q, "pool", i, 1),
            ConsumerConfigured(q, "pool", LEASE, 5, None, 30_000, None, "tenant-"),
            WindowDelta(q, "pool", 1, 1, [DeliveryGroup(True, 10**13, 1, 7, None, [i])])])
        state.windows[(q, "pool")].ensure_index(1, 5)  # the lease had it indexed
        state.apply_offset_entries([WindowDelta(q, "pool", 1, 2, [], [i], i + 1)])
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / n


ARGS = argparse.Namespace()


async def main() -> None:
    base = await measure_vqueues(ARGS, ARGS.baseline) if ARGS.baseline else None
    vq = await measure_vqueues(ARGS)
    rd = await measure_redis(ARGS)
    report(vq, rd, base)
    print(f"lease window memory: {window_memory():.0f} bytes per in-flight record "
          "(100,000 leased records, tracemalloc)")
    print(f"an idle queue a prefix consumer leased from: {idle_queue_memory():.0f} bytes "
          "(its consumer's settings, committed offset and empty window; 20,000 queues, "
          "tracemalloc); one it never leased from: none beyond the queue's own")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: the embedded broker)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--records", type=int, default=200_000,
                    help="records the Worker and Redis drain")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="an older vqueues checkout (git worktree) measured first, beside")
    ARGS = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main())
