#!/usr/bin/env python3
"""A node restarted in place: SIGTERM, then started again with the same node id, on a data topic
holding --records records over --queues queues (1,000,000 over 10,000 by default).

Measured from the new process's spawn: its first read of an old record (`GET` of a queue's
first page answered 200 with records) and every partition ready (`/readyz` 200), beside how
long the SIGTERM took. Each variant runs on the same topics, in this order:
  without a snapshot at stop   VQ_SNAPSHOT_ON_STOP=false: the new process replays the topics
  with a snapshot at stop      the default: the stopping node snapshots what changed, and the
                               new process loads the snapshots
On the embedded broker (the default) nodes join the group as dynamic members (tansu does not
honour static membership), so a restart costs a rebalance, whose first join tansu holds for
half the session timeout; with --broker kafka, a local three-broker Apache Kafka cluster, they
are static members (`static_membership` auto) and take their partitions back at once.
Usage: .venv/bin/python scripts/bench_restart.py [--records 1000000] [--queues 10000]
       [--broker embedded|kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import free_port  # noqa: E402

NODE_LOG: list[str] = []  # --node-log: where the nodes' logs go (info level)


def start(bootstrap: str, prefix: str, port: int, env: dict[str, str]) -> subprocess.Popen:
    full = {**os.environ, "VQ_BOOTSTRAP": bootstrap, "VQ_HTTP_PORT": str(port),
            "VQ_NODE_ID": "restarting", "VQ_DATA_TOPIC": f"{prefix}-data",
            "VQ_OFFSET_TOPIC": f"{prefix}-offsets", "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assign",
            "VQ_SNAPSHOT_TOPIC": f"{prefix}-snapshots", "VQ_GROUP_ID": f"{prefix}-g",
            "VQ_LOG_LEVEL": "info" if NODE_LOG else "warning", **env}
    if not NODE_LOG:
        return subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=full)
    with open(NODE_LOG[0], "ab") as out:
        out.write(f"--- spawn at {time.time():.3f}\n".encode())
        return subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=full,
                                stdout=out, stderr=subprocess.STDOUT)


async def until(s: aiohttp.ClientSession, url: str, ok, deadline_s: float = 120) -> float:
    """Seconds until GET `url` answers 200 and `ok(body)`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < deadline_s:
        try:
            async with s.get(url) as r:
                if r.status == 200 and ok(await r.json()):
                    return time.perf_counter() - t0
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.01)
    raise TimeoutError(url)


async def restart(bootstrap: str, prefix: str, env: dict[str, str], label: str) -> str:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    first = f"{base}/v1/queues/rq-0/records?limit=1"
    async with aiohttp.ClientSession() as s:
        proc = start(bootstrap, prefix, port, env)
        try:
            initial = await until(s, f"{base}/readyz", lambda b: True, 600)
        finally:
            t0 = time.perf_counter()
            proc.terminate()
            proc.wait(120)
            stop_s = time.perf_counter() - t0
        proc = start(bootstrap, prefix, port, env)
        try:
            t0 = time.perf_counter()
            first_read = await until(s, first, lambda b: bool(b["records"]))
            ready = await until(s, f"{base}/readyz", lambda b: True)
            ready = max(ready + first_read, time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(120)
    return (f"{label}: SIGTERM took {stop_s:.2f} s; restarted in place: first read of an old "
            f"record {first_read:.2f} s, every partition ready {ready:.2f} s after the spawn "
            f"(the first start took {initial:.1f} s to ready)")


async def run(args: argparse.Namespace) -> None:
    async with bench.broker_of(args.broker) as bootstrap:
        prefix = f"restart{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assign", args.partitions,
            snapshot_topic=f"{prefix}-snapshots"))
        t0 = time.perf_counter()
        await asyncio.to_thread(bench.prefill, bootstrap, f"{prefix}-data", args.queues,
                                args.records // args.queues, "rq-")
        print(f"# restart in place, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
              f"{args.records:,} records over {args.queues:,} queues, {args.partitions} "
              f"partitions, broker {args.broker} (filled in {time.perf_counter() - t0:.0f} s); "
              f"session timeout {args.session_ms} ms", flush=True)
        common = {"VQ_SESSION_TIMEOUT_MS": str(args.session_ms)}
        print(await restart(bootstrap, prefix, {**common, "VQ_SNAPSHOT_ON_STOP": "false"},
                            "without a snapshot at stop"), flush=True)
        print(await restart(bootstrap, prefix, common, "with a snapshot at stop"), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--session-ms", type=int, default=10_000,
                    help="the nodes' session timeout (their default: 10000)")
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    ap.add_argument("--node-log", help="write the nodes' logs (info level) to this file")
    args = ap.parse_args()
    if args.node_log:
        NODE_LOG.append(args.node_log)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
