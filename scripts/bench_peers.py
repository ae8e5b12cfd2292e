#!/usr/bin/env python3
"""vqueues beside the queues users would pick instead, on one machine, in one run (issue 39).

Each system is started fresh by this script on loopback (its data in a new temporary folder,
wiped after), driven through its mainstream client from this one asyncio process, and stopped
by PID:
  vqueues          one node as `scripts/run` starts it, on the embedded broker (tansu)
  vqueues-kafka    the same node on the local three-broker Apache Kafka cluster
  redis            Redis Streams (AOF everysec), redis-py with hiredis
  nats             NATS JetStream (file storage), nats-py
  rabbitmq         RabbitMQ (durable queues, persistent messages, publisher confirms), aio-pika
  kafka            Apache Kafka itself on the local cluster: confluent-kafka, and Kafka's
                   ShareConsumerPerformance (share groups) for the work queue
Workloads, each with the server's and the client's CPU seconds:
  enqueue          100-record batches, 16 producers, over 10 queues and over 100,000 queues
  small writes     one record to each of 100,000 queues: one call each, 16 in flight (stopped
                   at --small-cap-s, the rest written untimed), and through the client's own
                   batching where it has one (vqueues BatchProducer, Kafka's producer)
  end to end       a write, to a reader parked on the queue: p50 / p99 / p99.9
  work queue       200,000 records over 10 queues drained by 16 workers taking 10 and 100 per
                   call with acknowledgement (and vqueues_client.Worker, 16 slots)
  memory           server RSS per queue, 100,000 queues x 2 records
  restart          from the spawn to the first read of an old record, and to all queues ready
A system that is not installed is skipped with a line saying so. The tables (markdown), the
figures (JSON) and one chart per workload (PNG, with matplotlib) go to --report.
Usage: .venv/bin/python scripts/bench_peers.py [--systems vqueues,redis,...]
       [--report docs/comparison] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from peers import kafka_peer, nats_peer, rabbit_peer, redis_peer  # noqa: E402
from peers.base import Peer  # noqa: E402
from peers.common import (  # noqa: E402
    SPAWNED,
    Figure,
    Meter,
    Sizes,
    latencies,
    rss_bytes,
    wait_for,
)
from peers.report import charts, machine, tables  # noqa: E402
from peers.vqueues_peer import VQueues  # noqa: E402

SYSTEMS = ["vqueues", "vqueues-kafka", "redis", "nats", "rabbitmq", "kafka"]


def make(key: str) -> tuple[Peer | None, str]:
    """The system, or why it is skipped."""
    if key in ("vqueues-kafka", "kafka") and not shutil.which("java"):
        return None, "java is not installed: no local Kafka cluster"
    if key == "vqueues":
        return VQueues(), ""
    if key == "vqueues-kafka":
        return VQueues(on_kafka=True), ""
    if key == "kafka":
        return kafka_peer.Kafka(), ""
    module = {"redis": redis_peer, "nats": nats_peer, "rabbitmq": rabbit_peer}[key]
    why = module.available()
    if why:
        return None, why
    peer = {"redis": redis_peer.Redis, "nats": nats_peer.Nats,
            "rabbitmq": rabbit_peer.Rabbit}[key]()
    return peer, ""


async def enqueue_run(peer: Peer, names: list[str], sz: Sizes) -> tuple[int, int]:
    """`producers` writers, each a batch of `batch` records to a random queue, for `seconds`."""
    count = calls = 0
    stop = time.perf_counter() + sz.seconds

    async def producer(i: int) -> None:
        nonlocal count, calls
        rng = random.Random(i)
        while time.perf_counter() < stop:
            await peer.put_batch(names[rng.randrange(len(names))], sz.batch)
            count += sz.batch
            calls += 1

    await asyncio.gather(*(producer(i) for i in range(sz.producers)))
    return count, calls


async def one_each(peer: Peer, names: list[str], inflight: int, cap_s: float | None) -> int:
    """One record to each queue, one call each, `inflight` at a time, in order: how many
    were written (a prefix of `names`) before `cap_s`."""
    nxt = 0
    stop = time.perf_counter() + cap_s if cap_s else float("inf")

    async def writer() -> None:
        nonlocal nxt
        while nxt < len(names) and time.perf_counter() < stop:
            i = nxt
            nxt += 1
            await peer.put_one(names[i])

    await asyncio.gather(*(writer() for _ in range(inflight)))
    return nxt


async def phase_queues(peer: Peer, sz: Sizes, out: dict[str, Figure]) -> None:
    """A fresh server: enqueue over few queues, end to end, the work queue."""
    pids = peer.server_pids
    few = [f"t{i}" for i in range(sz.few_queues)]
    await peer.create(few)
    await enqueue_run(peer, few, Sizes(seconds=min(1.0, sz.seconds), batch=sz.batch))  # warm
    async with Meter(pids) as m:
        done = await enqueue_run(peer, few, sz)
    out["enqueue_few"] = m.rate(*done)
    log(peer, "enqueue_few", out)
    await peer.create(["e2e"])
    async with Meter(pids) as m:
        samples = await peer.e2e("e2e", sz.samples)
    out["e2e"] = latencies(samples, m.figure)
    log(peer, "e2e", out)
    per_queue = sz.work_records // sz.work_queues
    for per_call in sz.per_call:
        names = [f"w{per_call}x{i}" for i in range(sz.work_queues)]
        await peer.create(names)
        await peer.fill(names, per_queue)
        peer.last_wall_s = None
        async with Meter(pids) as m:
            done = await peer.work(names, per_queue * len(names), sz.workers, per_call)
        fig = m.rate(*done)
        if peer.last_wall_s:  # Kafka's tool: its own time, not its JVM's start
            fig.value = done[0] / peer.last_wall_s
            fig.note = f"{peer.last_note}; {m.figure.wall_s:.1f} s with the JVM's start"
        out[f"work_{per_call}"] = fig
        log(peer, f"work_{per_call}", out)
    if isinstance(peer, VQueues):
        names = [f"wk{i}" for i in range(sz.work_queues)]
        await peer.fill(names, per_queue)
        async with Meter(pids) as m:
            done = await peer.worker_drain(names, per_queue * len(names), sz.workers)
        out["work_worker"] = m.rate(*done)
        log(peer, "work_worker", out)


async def phase_many(peer: Peer, sz: Sizes, out: dict[str, Figure]) -> None:
    """A fresh server: small writes to many queues, memory per queue, restart, then enqueue
    over many queues."""
    pids = peer.server_pids
    many = [f"m{i:06d}" for i in range(sz.many_queues)]
    before = rss_bytes(pids())
    t0 = time.perf_counter()
    await peer.create(many)
    created = time.perf_counter() - t0
    # Warm up (connections, metadata, a fresh broker's coordinators and partitions): 10
    # records to each of 64 queues.
    await asyncio.gather(*(peer.put_batch(q, 10) for q in many[:64]))
    async with Meter(pids) as m:
        written = await one_each(peer, many, sz.producers, sz.small_cap_s)
    fig = out["small_one"] = m.rate(written)
    if written < len(many):
        fig.note = (f"stopped at the {sz.small_cap_s:.0f} s cap after {written:,} of "
                    f"{len(many):,}")
    log(peer, "small_one", out)
    rest = many[written:]
    if peer.batching_client:
        if rest:
            await peer.put_each_batched(rest)
        async with Meter(pids) as m:
            await peer.put_each_batched(many)
        out["small_batched"] = m.rate(len(many))
        log(peer, "small_batched", out)
        records = 2 * len(many)
    else:
        # One call each, 64 in flight; stopped at 10 minutes (RabbitMQ with 100,000 queues
        # blocks its publishers at its memory alarm and goes slower and slower).
        records = written + await one_each(peer, rest + many, 64, 600)
    await asyncio.sleep(1.0)
    after = rss_bytes(pids())
    out["memory"] = Figure(value=(after - before) / len(many), unit="bytes/queue", extra={
        "rss_before_mb": round(before / 2**20, 1), "rss_after_mb": round(after / 2**20, 1),
        "queues": len(many), "records": records},
        note=f"queues created in {created:.1f} s" if created > 1 else "")
    log(peer, "memory", out)
    await peer.restart()
    t0 = time.perf_counter()
    try:
        await wait_for(lambda: peer.read_first(many[0]), sz.restart_cap_s,
                       f"{peer.label}: first read")
        first = time.perf_counter() - t0
        await wait_for(lambda: peer.all_ready(many), sz.restart_cap_s - first,
                       f"{peer.label}: all queues ready")
    except TimeoutError:
        out["restart"] = Figure(unit="s", note=f"not ready {sz.restart_cap_s:.0f} s after the "
                                               "spawn: the run stopped waiting")
        log(peer, "restart", out)
        return  # still starting: what follows would measure its start
    ready = time.perf_counter() - t0
    out["restart"] = Figure(value=first, unit="s", extra={
        "first_read_s": round(first, 3), "all_ready_s": round(ready, 3)})
    log(peer, "restart", out)
    await peer.after_restart()
    async with Meter(pids) as m:
        done = await enqueue_run(peer, many, sz)
    out["enqueue_many"] = m.rate(*done)
    log(peer, "enqueue_many", out)


def log(peer: Peer, key: str, out: dict[str, Figure]) -> None:
    f = out[key]
    shown = ", ".join(f"{k} {v}" for k, v in f.as_dict().items() if k not in ("unit",))
    print(f"  {peer.key} {key}: {shown}", flush=True)


async def run_system(peer: Peer, sz: Sizes, out: dict[str, Figure]) -> None:
    """Every workload on `peer`, each phase on a fresh server; figures land in `out` as they
    are measured (a failure keeps the ones before it)."""
    for phase in (phase_queues, phase_many):
        await peer.start()
        try:
            await phase(peer, sz, out)
        finally:
            await peer.stop()


def sizes(args: argparse.Namespace) -> Sizes:
    if args.smoke:
        return Sizes(seconds=0.5, many_queues=300, small_cap_s=30, samples=20,
                     work_records=400, work_queues=2, workers=4, per_call=(10,))
    return Sizes(seconds=args.seconds, many_queues=args.many_queues,
                 small_cap_s=args.small_cap_s, samples=args.samples,
                 work_records=args.work_records)


def write_report(report: dict[str, Any], folder: Path, with_charts: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    md = tables(report)
    (folder / "tables.md").write_text(md)
    print("\n" + md, flush=True)
    if with_charts:
        for line in charts(report, folder):
            print(line, flush=True)


async def main_async(args: argparse.Namespace) -> int:
    if args.render:
        report = json.loads(Path(args.render).read_text())
        write_report(report, Path(args.report), not args.no_charts)
        return 0
    sz = sizes(args)
    keys = [k.strip() for k in args.systems.split(",") if k.strip()]
    unknown = set(keys) - set(SYSTEMS)
    if unknown:
        print(f"unknown systems: {', '.join(sorted(unknown))} (known: {', '.join(SYSTEMS)})",
              file=sys.stderr)
        return 2
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "machine": machine(), "sizes": vars(sz), "systems": {}}
    failed = False
    for key in keys:
        peer, why = make(key)
        if peer is None:
            print(f"{key}: skipped: {why}", flush=True)
            report["systems"][key] = {"skipped": why}
            continue
        print(f"{peer.label}:", flush=True)
        entry: dict[str, Any] = {
            "label": peer.label, "settings": peer.settings, "durability": peer.durability,
            "batching_client": peer.batching_client, "few_queues": peer.few_queues_note,
            "many_queues": peer.many_queues_note, "work": peer.work_note,
            "restart": peer.restart_note}
        figures: dict[str, Figure] = {}
        try:
            await run_system(peer, sz, figures)
        except Exception as exc:  # one system failing does not lose the others' figures
            failed = True
            print(f"{key}: failed: {exc!r}", flush=True)
            entry["failed"] = repr(exc)
        entry["figures"] = {k: f.as_dict() for k, f in figures.items()}
        report["systems"][key] = entry
    report["spawned_pids"] = SPAWNED
    write_report(report, Path(args.report), not args.no_charts)
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated, of {', '.join(SYSTEMS)} [default: all]")
    ap.add_argument("--report", default=str(ROOT / "docs" / "comparison"),
                    help="where tables.md, results.json and the charts go")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="run nothing: write the tables and charts of an earlier run again")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    ap.add_argument("--seconds", type=float, default=5.0, help="each enqueue run")
    ap.add_argument("--many-queues", type=int, default=100_000)
    ap.add_argument("--small-cap-s", type=float, default=60.0,
                    help="one-record calls stop here; the rest are written untimed")
    ap.add_argument("--samples", type=int, default=2_000, help="end-to-end samples")
    ap.add_argument("--work-records", type=int, default=200_000)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # The clients log each refused connection while a server starts or restarts: expected.
    for name in ("nats", "aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
