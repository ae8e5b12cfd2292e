#!/usr/bin/env python3
"""Lease -> complete of this checkout beside an older one, in alternating rounds on one broker.

One broker (the embedded one, or the local three-broker Kafka cluster with --broker kafka), one
node of each checkout on topics of its own, 16 workers over 10 queues prefilled with 100-byte
records, N records per lease. A checkout whose node takes completions on a lease answers one
call per cycle (ADR 16); an older one is driven lease -> complete, two calls per cycle.

Rounds alternate (A B, B A, ...) so that a slower minute weighs on both alike, after a warm-up
that drains records untimed through both nodes: the brokers' JVMs compile for the first minute
or more (their compiler threads took about half the cluster's CPU in the first 30 s of lease
load, 2026-11-28), which a run that starts measuring at once counts against whichever goes
first. Per round: records/s, calls/s, and CPU per call of the node and of the broker(s).
Usage: .venv/bin/python scripts/bench_lease_ab.py --baseline /tmp/before [--broker kafka]
       [--rounds 6] [--seconds 6] [--warmup-s 60] [--per-call 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402
import bench_work  # noqa: E402

from vqueues.hashing import partition_for  # noqa: E402
from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402
from vqueues.kafka.local_cluster import LocalKafkaCluster  # noqa: E402

PARTITIONS = 16
WORKERS = 16
QUEUES = 10


class Side:
    """One checkout's node and its route."""

    def __init__(self, label: str, code: str | None, bootstrap: str, kafka: bool) -> None:
        self.label = label
        prefix = f"ab{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", PARTITIONS,
            replication_factor=-1 if kafka else 1))
        self.procs, self.urls = bench.start_nodes(bootstrap, prefix, 1, code)
        self.owners: dict[int, str] = {}
        self.riding = False
        self.rounds: list[dict[str, float]] = []

    async def ready(self, s: aiohttp.ClientSession) -> None:
        self.owners = await bench.wait_ready(self.urls, PARTITIONS)
        self.riding = await bench_work.rides(s, self.urls[0])

    def route(self, q: str) -> str:
        return self.owners[partition_for(q, PARTITIONS)]

    async def fill(self, s: aiohttp.ClientSession, per_queue: int) -> list[str]:
        names = [f"ab-{uuid.uuid4().hex[:6]}-{i}" for i in range(QUEUES)]
        await bench_work.prefill(s, self.route, names, per_queue)
        return names

    async def drain(self, s: aiohttp.ClientSession, names: list[str], per_call: int,
                    seconds: float) -> tuple[int, int]:
        return await bench_work.drain(s, self.route, names, WORKERS, per_call, seconds,
                                      riding=self.riding)


async def run(args: argparse.Namespace) -> None:
    kafka = args.broker == "kafka"
    cluster = LocalKafkaCluster().start() if kafka else None
    broker = None if kafka else EmbeddedBroker().start()
    if cluster is not None:
        bootstrap = cluster.bootstrap
        broker_pids = [p.process.pid for p in cluster.processes if p.process]
    else:
        assert broker is not None and broker.process is not None
        bootstrap, broker_pids = broker.bootstrap, [broker.process.pid]
    sides: list[Side] = []
    # Enough records that no round goes dry: 16 workers at up to ~3,000 calls/s (2,000 left
    # the fastest rounds on the embedded broker leasing from nearly empty queues at the end).
    per_queue = max(3_000, int(args.seconds * 3_000 * args.per_call / QUEUES))
    try:
        sides = [Side("this checkout", None, bootstrap, kafka),
                 Side(f"baseline {args.baseline}", args.baseline, bootstrap, kafka)]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=300)) as s:
            for side in sides:
                await side.ready(s)
                shape = ("one call per cycle (riding)" if side.riding
                         else "lease -> complete, two calls per cycle")
                print(f"{side.label}: {shape}", flush=True)
            warm_until = time.monotonic() + args.warmup_s
            while time.monotonic() < warm_until:
                for side in sides:
                    names = await side.fill(s, per_queue)
                    await side.drain(s, names, args.per_call, min(5.0, args.seconds))
            print(f"warm-up: {args.warmup_s:.0f} s of the same load through both, untimed",
                  flush=True)
            for rnd in range(args.rounds):
                for side in (sides if rnd % 2 == 0 else sides[::-1]):
                    names = await side.fill(s, per_queue)
                    await asyncio.sleep(1)  # the fill's writes settled
                    node = side.procs[0].pid
                    n0, b0 = bench.cpu_seconds(node), bench.cpu_of(broker_pids)
                    t0 = time.perf_counter()
                    records, calls = await side.drain(s, names, args.per_call, args.seconds)
                    wall = time.perf_counter() - t0
                    n1, b1 = bench.cpu_seconds(node), bench.cpu_of(broker_pids)
                    fig = {"rate": records / wall, "calls": calls / wall,
                           "node_us_call": (n1 - n0) / max(calls, 1) * 1e6,
                           "broker_us_call": (b1 - b0) / max(calls, 1) * 1e6,
                           "server_us_record": (n1 - n0 + b1 - b0) / max(records, 1) * 1e6}
                    side.rounds.append(fig)
                    print(f"round {rnd} {side.label}: {fig['rate']:,.0f} rec/s, "
                          f"{fig['calls']:,.0f} calls/s, node {fig['node_us_call']:.0f} µs/call, "
                          f"broker(s) {fig['broker_us_call']:.0f} µs/call, server "
                          f"{fig['server_us_record']:.1f} µs/record", flush=True)
    finally:
        for side in sides:
            bench.stop_nodes(side.procs)
        if cluster is not None:
            cluster.stop(True)
        if broker is not None:
            broker.stop()
    report(sides)


def report(sides: list[Side]) -> None:
    if len(sides) < 2 or not sides[0].rounds or not sides[1].rounds:
        return
    med: list[dict[str, Any]] = [{k: statistics.median(r[k] for r in side.rounds)
                                  for k in side.rounds[0]} for side in sides]
    ratios = [a["rate"] / b["rate"] for a, b in zip(sides[0].rounds, sides[1].rounds, strict=True)]
    print("\n| | records/s (median) | calls/s | node µs/call | broker(s) µs/call | "
          "server µs/record |")
    print("|---|---:|---:|---:|---:|---:|")
    for side, m in zip(sides, med, strict=True):
        print(f"| {side.label} | {m['rate']:,.0f} | {m['calls']:,.0f} | "
              f"{m['node_us_call']:.0f} | {m['broker_us_call']:.0f} | "
              f"{m['server_us_record']:.1f} |")
    print(f"\nthis checkout / baseline: {med[0]['rate'] / med[1]['rate']:.2f}x of the medians; "
          f"round by round {min(ratios):.2f}x-{max(ratios):.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, metavar="CHECKOUT",
                    help="an older vqueues checkout (a git worktree)")
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each, alternating")
    ap.add_argument("--seconds", type=float, default=6.0, help="each round")
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="untimed load through both nodes first")
    ap.add_argument("--per-call", type=int, default=10, help="records per lease")
    asyncio.run(run(ap.parse_args()))
