#!/usr/bin/env python3
"""A cluster's partitions grown under load (docs/growing.md, ADR 19).

Two nodes serve --queues queues holding --records records (100 B each, written first with a
plain producer), on --partitions partitions. The same load runs twice for --seconds each, in
one run: writers (the Python client's enqueue, 10 records a call, to random queues) and lease
workers (lease 10 from a random queue, then complete them), first as it is, then with
`vqueues topics grow --partitions 2 x --partitions` started a quarter of the way in. Printed:
records/s enqueued and completed, the calls' p50 and p99 latency (retries inside the client
included) and every error that reached the caller, for both; the ratios over the whole run
and over the growth alone; the growth's duration (from the command to every partition of the
new layout ready), beside how long the nodes' first start took to replay the same records
(the takeover's replay).
Usage: .venv/bin/python scripts/bench_growth.py [--records 1000000] [--queues 100000]
       [--partitions 8] [--seconds 40] [--writers 8] [--workers 8] [--broker embedded|kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "clients" / "python"))
_spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

from vqueues_client import AsyncClient  # noqa: E402

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import free_port  # noqa: E402

NAME = "gq-"


def topic_args(prefix: str) -> list[str]:
    return ["--data-topic", f"{prefix}-data", "--offset-topic", f"{prefix}-offsets",
            "--assignment-topic", f"{prefix}-assign", "--snapshot-topic", f"{prefix}-snap"]


def start(bootstrap: str, prefix: str, i: int, log: Path | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VQ_BOOTSTRAP": bootstrap, "VQ_HTTP_PORT": str(port),
           "VQ_NODE_ID": f"grow-{i}", "VQ_DATA_TOPIC": f"{prefix}-data",
           "VQ_OFFSET_TOPIC": f"{prefix}-offsets", "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assign",
           "VQ_SNAPSHOT_TOPIC": f"{prefix}-snap", "VQ_GROUP_ID": f"{prefix}-g",
           "VQ_LOG_LEVEL": "info" if log else "warning"}
    out = open(log, "ab") if log else None  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env,
                            stdout=out, stderr=subprocess.STDOUT if out else None)
    return proc, f"http://127.0.0.1:{port}"


async def ready(urls: list[str], partitions: int, layout: int, deadline_s: float = 900
                ) -> float:
    """Seconds until every node serves `layout` and all its partitions are ready."""
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as s:
        while time.perf_counter() - t0 < deadline_s:
            owned: set[int] = set()
            ok = True
            for u in urls:
                try:
                    async with s.get(f"{u}/v1/partitions") as r:
                        body = await r.json()
                        ok &= r.status == 200 and body.get("layout", 0) == layout
                        owned.update(body.get("ready", []))
                except (aiohttp.ClientError, ValueError):
                    ok = False
            if ok and owned == set(range(partitions)):
                return time.perf_counter() - t0
            await asyncio.sleep(0.05)
    raise TimeoutError(f"layout {layout} not ready")


class Load:
    def __init__(self) -> None:
        self.enqueued = 0
        self.completed = 0
        self.latency: dict[str, list[float]] = {"enqueue": [], "lease": [], "complete": []}
        self.errors: Counter[str] = Counter()
        self.window: tuple[float, float] | None = None  # rec/s from the command to ready

    async def _timed(self, kind: str, call):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            out = await call
        except Exception as exc:  # every error that reached the caller is counted
            self.errors[f"{kind}: {type(exc).__name__}: {str(exc)[:80]}"] += 1
            return None
        self.latency[kind].append(time.perf_counter() - t0)
        return out

    async def writer(self, vq: AsyncClient, queues: int, stop: asyncio.Event) -> None:
        rnd = random.Random()
        value = "x" * 100
        while not stop.is_set():
            q = f"{NAME}{rnd.randrange(queues)}"
            if await self._timed("enqueue", vq.enqueue(q, [value] * 10)) is not None:
                self.enqueued += 10

    async def worker(self, vq: AsyncClient, queues: int, stop: asyncio.Event) -> None:
        rnd = random.Random()
        while not stop.is_set():
            q = f"{NAME}{rnd.randrange(queues)}"
            got = await self._timed("lease", vq.lease(q, "w", max_records=10,
                                                       visibility_ms=60_000))
            if got and await self._timed("complete", vq.complete(q, "w", got)) is not None:
                self.completed += len(got)

    def report(self, label: str, seconds: float) -> dict[str, float]:
        out = {"enqueued_per_s": self.enqueued / seconds,
               "completed_per_s": self.completed / seconds}
        line = [f"{label}: enqueued {out['enqueued_per_s']:,.0f} rec/s, completed "
                f"{out['completed_per_s']:,.0f} rec/s"]
        for kind, samples in self.latency.items():
            if samples:
                out[f"{kind}_p50"] = bench.pct(samples, 0.50)  # ms
                out[f"{kind}_p99"] = bench.pct(samples, 0.99)
                line.append(f"{kind} p50 {out[f'{kind}_p50']:.1f} / p99 "
                            f"{out[f'{kind}_p99']:.1f} ms")
        line.append(f"errors {sum(self.errors.values())}"
                    + (f" {dict(self.errors)}" if self.errors else ""))
        print("; ".join(line), flush=True)
        return out


async def load(urls: list[str], args: argparse.Namespace, grow_with: list[str] | None,
               partitions: int) -> tuple[dict[str, float], float | None]:
    result = Load()
    stop = asyncio.Event()
    grown: float | None = None
    async with AsyncClient(urls, deadline_s=120) as vq:
        tasks = [asyncio.create_task(result.writer(vq, args.queues, stop))
                 for _ in range(args.writers)]
        tasks += [asyncio.create_task(result.worker(vq, args.queues, stop))
                  for _ in range(args.workers)]
        t0 = time.perf_counter()
        if grow_with is not None:
            await asyncio.sleep(args.seconds / 4)
            started = time.perf_counter()
            at_start = (result.enqueued, result.completed)
            done = await asyncio.to_thread(subprocess.run, grow_with, capture_output=True,
                                           text=True)
            if done.returncode != 0:
                raise SystemExit(f"grow failed: {done.stderr}")
            await ready(urls, partitions * 2, 1)
            grown = time.perf_counter() - started
            result.window = ((result.enqueued - at_start[0]) / grown,
                             (result.completed - at_start[1]) / grown)
        await asyncio.sleep(max(0.0, args.seconds - (time.perf_counter() - t0)))
        stop.set()
        await asyncio.gather(*tasks)
        seconds = time.perf_counter() - t0
    label = "with a growth" if grow_with is not None else "without a growth"
    out = result.report(label, seconds)
    if result.window is not None:
        out["window_enqueued_per_s"], out["window_completed_per_s"] = result.window
    return out, grown


async def run(args: argparse.Namespace) -> None:
    procs: list[subprocess.Popen] = []
    log = Path(args.node_log) if args.node_log else None
    async with bench.broker_of(args.broker) as bootstrap:
        try:
            prefix = f"grow{uuid.uuid4().hex[:6]}"
            Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
                f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assign", args.partitions,
                snapshot_topic=f"{prefix}-snap"))
            t0 = time.perf_counter()
            await asyncio.to_thread(bench.prefill, bootstrap, f"{prefix}-data", args.queues,
                                    args.records // args.queues, NAME)
            print(f"# growth under load, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
                  f"{args.records:,} records over {args.queues:,} queues, {args.partitions} -> "
                  f"{args.partitions * 2} partitions, 2 nodes, broker {args.broker}, "
                  f"{args.writers} writers and {args.workers} lease workers for {args.seconds} s "
                  f"a run (filled in {time.perf_counter() - t0:.0f} s)", flush=True)
            urls = []
            for i in range(2):
                proc, url = start(bootstrap, prefix, i, log)
                procs.append(proc)
                urls.append(url)
            replay = await ready(urls, args.partitions, 0)
            print(f"first start, replaying the records: every partition ready {replay:.1f} s "
                  "after the spawn", flush=True)
            base, _ = await load(urls, args, None, args.partitions)
            grow = [sys.executable, "-m", "vqueues", "topics", "grow", "--bootstrap", bootstrap,
                    "--partitions", str(args.partitions * 2), *topic_args(prefix)]
            during, grown = await load(urls, args, grow, args.partitions)
            assert grown is not None
            print(f"growth: {grown:.1f} s from `vqueues topics grow` to every partition of the "
                  "new layout ready (the first start's replay of the same records: "
                  f"{replay:.1f} s)", flush=True)
            for key in ("enqueued_per_s", "completed_per_s"):
                print(f"{key}: {during[key] / base[key]:.2f}x over the run that holds the growth, "
                      f"{during['window_' + key] / base[key]:.2f}x from the command to every "
                      "new partition ready", flush=True)
            for kind in ("enqueue", "lease", "complete"):
                if f"{kind}_p99" in base and f"{kind}_p99" in during:
                    print(f"{kind} p99: {during[f'{kind}_p99'] / base[f'{kind}_p99']:.2f}x",
                          flush=True)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    ap.add_argument("--node-log", help="write the nodes' logs (info level) to this file")
    args = ap.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
