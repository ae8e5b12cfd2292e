#!/usr/bin/env python3
"""How vqueues holds up at scale, measured in one run on the embedded broker (or --bootstrap).

For each partition size (--records, default 1M,4M,8M; one partition, so the whole topic is one
owner's replay) and queue count (--queues, default 10 and 1M), it fills a fresh data topic with
a plain producer, starts one node and measures:
  replay        assignment -> partition ready (the node's own `partition_ready replay_ms`)
  /healthz      p99 and max latency while the node replays, as a client sees it, and the
                node's own worst event-loop lag (vq_event_loop_lag_max_seconds): on 2 cores
                busy with a replay, the client's figure also counts CPU the probe waited for
  memory        live heap (glibc mallinfo2, on a second node run with PYTHONMALLOC=malloc so
                that it sees every Python allocation) and resident set after the replay, per
                record and per queue, against an empty node, with the cache off (the cache's
                own accounting is tested within 20% of real memory); glibc gives each
                allocation an 8 B header and rounds it to 16 B, so a queue's array and its
                buffer count 32 B more here than under pymalloc, which a node runs
                (scripts/bench_index_memory.py counts what pymalloc hands out)
  raw read      a plain confluent-kafka consumer reading the same records (the limit)
Then, on the 1M-queue topic: GET /v1/queues page latency (1000 names, random `after`), and on a
node with a tiny cache: 100-record pages older than the cache (beside a raw consumer reading
what each page spans), and a sparse queue's records far apart. Last, --sustain-s of enqueue load
with the default cache, sampling resident memory, /healthz latency, the node's loop lag and its
garbage-collection pauses, then --create-s of load that creates a new queue per request (the
same figures, and the freezes of what it created), then --polls-s of --polls long polls that
come and go (they must not set off freezes).
After the full replay the node writes a snapshot and stops; new nodes then take the partition
over from that snapshot, --takeovers times (medians of takeover time, load and build time),
beside a fresh plain consumer going from the snapshot's position to the end (the broker's
share). --baseline CHECKOUT takes it over as often with that checkout's package too,
alternating with this one's: before and after on the same snapshot, in one run.

Usage: .venv/bin/python scripts/bench_scale.py [--records 1000000,4000000,8000000]
       [--queues 10,1000000] [--sustain-s 60] [--create-s 60] [--polls-s 60]
       [--polls 3000] [--takeovers 3] [--baseline /tmp/old]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster  # noqa: E402

DEV_ENV = {"VQ_SESSION_TIMEOUT_MS": "6000", "VQ_HEARTBEAT_INTERVAL_MS": "500",
           "VQ_LOG_LEVEL": "info", "VQ_LOG_FORMAT": "json"}
VALUE = b"v" * 100


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] * 1000 if s else float("nan")


def fill(bootstrap: str, topic: str, records: int, queues: int) -> None:
    """`records` 100-byte records round-robin over `queues` queue names, one partition."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})
    keys = [f"q{i}".encode() for i in range(min(queues, records))]
    for i in range(records):
        while True:
            try:
                p.produce(topic, key=keys[i % len(keys)], value=VALUE, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(300) == 0


def raw_read_rate(bootstrap: str, topic: str, records: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "queued.min.messages": 200000})
    c.assign([TopicPartition(topic, 0, 0)])
    got, t0 = 0, time.perf_counter()
    while got < records:
        for m in c.consume(10000, 1):
            if m.error() is None:
                got += 1
    rate = got / (time.perf_counter() - t0)
    c.close()
    return rate


class Node:
    """A node on `prefix`'s topics; `code`: the vqueues package of that checkout instead."""

    def __init__(self, bootstrap: str, prefix: str, code: str | None = None, **env: str
                 ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(f"/tmp/vq-bench-scale-{prefix}-{self.port}.log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vqueues", "serve"],
            env={**os.environ, **DEV_ENV, "VQ_BOOTSTRAP": bootstrap,
                 "VQ_HTTP_PORT": str(self.port), "VQ_DATA_TOPIC": f"{prefix}-data",
                 "VQ_OFFSET_TOPIC": f"{prefix}-offsets",
                 "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assignments", "VQ_GROUP_ID": f"{prefix}-g",
                 "VQ_SNAPSHOT_TOPIC": f"{prefix}-snapshots", **env,
                 **({"PYTHONPATH": code} if code else {})},
            # `-m` puts the working directory first on the path, before PYTHONPATH.
            cwd=code or None, stdout=subprocess.DEVNULL, stderr=self.log_path.open("wb"))

    def event(self, name: str) -> dict[str, object] | None:
        for line in self.log_path.read_text().splitlines():
            if f'"{name}"' in line:
                return dict(json.loads(line))
        return None

    def events(self, name: str) -> list[dict[str, object]]:
        return [dict(json.loads(line)) for line in self.log_path.read_text().splitlines()
                if f'"{name}"' in line]

    def event_ms(self, name: str) -> list[float]:
        """The `ms` of each `name` event logged (gc_pause, gc_frozen)."""
        return [float(str(e.get("ms", 0))) for e in self.events(name)]

    def replay_ms(self) -> float | None:
        ready = self.event("partition_ready")
        return float(str(ready["replay_ms"])) if ready else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def raw_reach_end(bootstrap: str, topic: str, start: int) -> float:
    """Seconds a fresh plain consumer takes from `assign` at `start` to the partition's EOF:
    the broker's share of a takeover that resumes at a snapshot's position."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.wait.max.ms": int(DEV_ENV.get("VQ_FETCH_WAIT_MAX_MS", "100"))})
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, 0, start)])
    try:
        while True:
            m = c.poll(1)
            if m is not None and m.error() is not None:
                return time.perf_counter() - t0
    finally:
        c.close()


async def metric(s: aiohttp.ClientSession, url: str, name: str) -> float:
    async with s.get(f"{url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


async def watch_replay(s: aiohttp.ClientSession, node: Node) -> tuple[list[float], float]:
    """Probe /healthz every 10 ms until /readyz answers 200: latencies, and seconds taken."""
    lat: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 600:
        t = time.perf_counter()
        try:
            async with s.get(f"{node.url}/healthz") as r:
                await r.read()
            lat.append(time.perf_counter() - t)
            async with s.get(f"{node.url}/readyz") as r:
                if r.status == 200:
                    return lat, time.perf_counter() - t0
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.01)
    raise TimeoutError("node not ready")


async def watch_warming(s: aiohttp.ClientSession, node: Node, lat: list[float]) -> float:
    """Probe /healthz every 10 ms (into `lat`) until the node logs `snapshot_warmed`: the
    seconds its warming took (nan if it logged none in 60 s)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 60:
        warmed = node.event("snapshot_warmed")
        if warmed is not None:
            return float(str(warmed.get("ms", "nan"))) / 1000
        t = time.perf_counter()
        async with s.get(f"{node.url}/healthz") as r:
            await r.read()
        lat.append(time.perf_counter() - t)
        await asyncio.sleep(0.01)
    return float("nan")


def new_topics(bootstrap: str) -> str:
    prefix = f"scale{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", 1,
        snapshot_topic=f"{prefix}-snapshots"))
    return prefix


async def takeover(s: aiohttp.ClientSession, bootstrap: str, prefix: str, code: str | None
                   ) -> dict[str, float]:
    """One node taking the partition over from its latest snapshot."""
    node = Node(bootstrap, prefix, code)
    try:
        lat, _ = await watch_replay(s, node)
        loaded = node.event("snapshot_loaded") or {}
        # The snapshot's queues are built into objects after the node serves, a shard per
        # loop turn (`QueueMap`); /healthz is probed until that is done too. An older node
        # (--baseline) built them before it served and logs no such event.
        warmed = await watch_warming(s, node, lat) if code is None else 0.0
        return {
            "warm_s": warmed,
            "takeover_loop_lag_ms": await metric(
                s, node.url, "vq_event_loop_lag_max_seconds") * 1000,
            "raw_end_s": await asyncio.to_thread(
                raw_reach_end, bootstrap, f"{prefix}-data",
                int(str(loaded.get("data_position", 0)))),
            "takeover_s": (node.replay_ms() or float("nan")) / 1000,
            "snapshot_load_s": float(str(loaded.get("load_ms", "nan"))) / 1000,
            "snapshot_build_s": float(str(loaded.get("build_ms", "nan"))) / 1000,
            "takeover_healthz_p99_ms": pct(lat, .99),
            "takeover_healthz_max_ms": max(lat) * 1000}
    finally:
        node.stop()


async def measure_replay(s: aiohttp.ClientSession, bootstrap: str, records: int, queues: int,
                         empty: tuple[float, float], takeovers: int = 1,
                         baseline: str | None = None, after: int = 0) -> dict[str, Any]:
    prefix = new_topics(bootstrap)
    await asyncio.to_thread(fill, bootstrap, f"{prefix}-data", records, queues)
    raw = await asyncio.to_thread(raw_read_rate, bootstrap, f"{prefix}-data", records)
    # A full replay; the node then writes a snapshot (interval 1 s) and stops.
    node = Node(bootstrap, prefix, VQ_SNAPSHOT_INTERVAL_S="1", VQ_SNAPSHOT_MIN_RECORDS="1")
    try:
        lat, _ = await watch_replay(s, node)
        out: dict[str, Any] = {
            "replay_s": (node.replay_ms() or float("nan")) / 1000, "raw_rate": raw,
            "healthz_p99_ms": pct(lat, .99), "healthz_max_ms": max(lat) * 1000,
            "loop_lag_ms": await metric(s, node.url, "vq_event_loop_lag_max_seconds") * 1000}
        if queues >= 100_000:
            out.update(await listing_latency(s, node.url, queues))
        for _ in range(1200):
            if await metric(s, node.url, "vq_snapshots_total") >= 1:
                break
            await asyncio.sleep(0.1)
        written = node.event("snapshot_written") or {}
        out["snapshot_mb"] = float(str(written.get("bytes", "nan"))) / 1e6
        out["snapshot_write_s"] = float(str(written.get("ms", "nan"))) / 1000
    finally:
        node.stop()
    if after:
        # Records the snapshot does not hold, round-robin over the same queues: a takeover
        # replays them, one batch touching hundreds of queues the snapshot holds.
        await asyncio.to_thread(fill, bootstrap, f"{prefix}-data", after, queues)
    # Takeover from the snapshot by a new node, `takeovers` times (medians: single takeovers
    # of a few hundred ms swing by 2x on these machines).
    runs: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    for _ in range(takeovers):
        for code in ([baseline] if baseline else []) + [None]:
            (before if code else runs).append(await takeover(s, bootstrap, prefix, code))
    for key in runs[0]:
        out[key] = statistics.median(r[key] for r in runs)
        if before:
            out[f"before_{key}"] = statistics.median(r[key] for r in before)
    out["takeovers"] = [r["takeover_s"] for r in runs]
    out["before_takeovers"] = [r["takeover_s"] for r in before]
    # Memory, on a second node: with PYTHONMALLOC=malloc every Python allocation goes through
    # glibc, so mallinfo2 counts all live memory (pymalloc's arenas are invisible to it).
    node = Node(bootstrap, prefix, PYTHONMALLOC="malloc", VQ_GROUP_ID=f"{prefix}-m",
                VQ_CACHE_MAX_BYTES="0")  # the index alone: the cache is measured on its own
    try:
        await watch_replay(s, node)
        await asyncio.sleep(2)  # the post-replay malloc_trim
        live = await metric(s, node.url, "vq_heap_in_use_bytes")
        rss = await metric(s, node.url, "process_resident_memory_bytes")
        out.update({"live_bytes": live - empty[0], "rss_bytes": rss - empty[1],
                    "live_total": live, "rss_total": rss})
        return out
    finally:
        node.stop()


async def listing_latency(s: aiohttp.ClientSession, url: str, queues: int) -> dict[str, float]:
    names = sorted(f"q{i}" for i in random.sample(range(queues), 200))
    lat = []
    for after in names:
        t = time.perf_counter()
        async with s.get(f"{url}/v1/queues", params={"after": after, "limit": "1000"}) as r:
            body = await r.json()
        lat.append(time.perf_counter() - t)
        assert len(body["queues"]) == 1000 or body["next_after"] is None
    return {"list_p50_ms": pct(lat, .5), "list_p99_ms": pct(lat, .99)}


async def empty_node_memory(s: aiohttp.ClientSession, bootstrap: str) -> tuple[float, float]:
    node = Node(bootstrap, new_topics(bootstrap), PYTHONMALLOC="malloc")
    try:
        await watch_replay(s, node)
        await asyncio.sleep(2)
        return (await metric(s, node.url, "vq_heap_in_use_bytes"),
                await metric(s, node.url, "process_resident_memory_bytes"))
    finally:
        node.stop()


async def uncached_reads(s: aiohttp.ClientSession, bootstrap: str) -> dict[str, float]:
    """Pages of 100 records older than a 1 kB cache; a sparse queue's 3 records far apart."""
    prefix = new_topics(bootstrap)
    await asyncio.to_thread(fill, bootstrap, f"{prefix}-data", 200_000, 10)
    node = Node(bootstrap, prefix, VQ_CACHE_MAX_BYTES="1000")
    try:
        await watch_replay(s, node)
        lat = []
        plan = [(f"q{random.randrange(10)}", random.randrange(0, 190_000)) for _ in range(200)]
        for q, offset in plan:
            t = time.perf_counter()
            async with s.get(f"{node.url}/v1/queues/{q}/records",
                             params={"offset": str(offset), "limit": "100"}) as r:
                assert len((await r.json())["records"]) == 100
            lat.append(time.perf_counter() - t)
        # The same spans read by a plain consumer, before the sparse queue's records make the
        # partition bigger (the embedded broker's fetches slow down as a partition grows).
        raw = await asyncio.to_thread(raw_pages, bootstrap, f"{prefix}-data",
                                      [o for _, o in plan])
        # A sparse queue: three records 60,000 records apart.
        sparse = []
        for i in range(3):
            async with s.post(f"{node.url}/v1/queues/sparse/records",
                              json={"records": [{"value": f"s{i}"}]}) as r:
                assert r.status == 200
            await asyncio.to_thread(fill_more, bootstrap, f"{prefix}-data", 60_000)
        for _ in range(30):
            t = time.perf_counter()
            async with s.get(f"{node.url}/v1/queues/sparse/records",
                             params={"offset": "0"}) as r:
                assert len((await r.json())["records"]) == 3
            sparse.append(time.perf_counter() - t)
        return {"uncached_p50_ms": pct(lat, .5), "uncached_p99_ms": pct(lat, .99),
                "uncached_max_ms": max(lat) * 1000,
                "raw_p50_ms": pct(raw, .5), "raw_p99_ms": pct(raw, .99),
                "raw_max_ms": max(raw) * 1000,
                "sparse_p50_ms": pct(sparse, .5), "sparse_p99_ms": pct(sparse, .99)}
    finally:
        node.stop()


def raw_pages(bootstrap: str, topic: str, starts: list[int]) -> list[float]:
    """The limit of a page older than the cache: a plain consumer reading what such a page spans
    (1,000 records of 10 queues from each start: assign, consume, unassign), seconds each."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.queue.backoff.ms": 10, "queued.min.messages": 2000,
                  "fetch.wait.max.ms": 100})  # as the node's fetchers (fetch_wait_max_ms)
    try:
        c.list_topics(topic, timeout=10)
        took = []
        for start in starts:
            t = time.perf_counter()
            c.assign([TopicPartition(topic, 0, start)])
            got = 0
            while got < 1000:
                got += len(c.consume(1000, 0.05))
            c.unassign()
            took.append(time.perf_counter() - t)
        return took
    finally:
        c.close()


def fill_more(bootstrap: str, topic: str, records: int) -> None:
    fill(bootstrap, topic, records, 10)


async def probe_healthz(s: aiohttp.ClientSession, url: str, stop: float, probes: list[float]
                        ) -> None:
    """/healthz every 50 ms until `stop` (perf_counter), each latency appended to `probes`."""
    while time.perf_counter() < stop:
        t = time.perf_counter()
        async with s.get(f"{url}/healthz") as r:
            await r.read()
        probes.append(time.perf_counter() - t)
        await asyncio.sleep(0.05)


async def sustained(s: aiohttp.ClientSession, bootstrap: str, seconds: float,
                    creating: bool = False
                    ) -> tuple[list[tuple[float, float, float, float]], dict[str, float]]:
    """Enqueue load (batches of 100 x 100 B, 16 in flight, 1,000 queues; `creating`: one 100 B
    record per request, each to a new queue) for `seconds`; (elapsed s, resident MB, live MB,
    records enqueued so far, millions) every 5 s, and the responsiveness meanwhile: /healthz
    every 50 ms (p99, max), the node's worst loop lag, its longest garbage collection (the node
    logs each one over 50 ms) and its freezes of long-lived objects (`gc_frozen`)."""
    node = Node(bootstrap, new_topics(bootstrap))
    curve: list[tuple[float, float, float, float]] = []
    probes: list[float] = []
    try:
        await watch_replay(s, node)
        body = json.dumps({"records": [{"value": "x" * 100}] * (1 if creating else 100)})
        stop = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            k = i
            while time.perf_counter() < stop:
                queue = f"new{k}" if creating else f"q{k % 1000}"
                async with s.post(f"{node.url}/v1/queues/{queue}/records", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                k += 16

        async def sample() -> None:
            t0 = time.perf_counter()
            while time.perf_counter() < stop:
                await asyncio.sleep(5)
                curve.append((time.perf_counter() - t0,
                              await metric(s, node.url, "process_resident_memory_bytes") / 1e6,
                              await metric(s, node.url, "vq_heap_in_use_bytes") / 1e6,
                              await metric(s, node.url, "vq_records_enqueued_total") / 1e6))

        await asyncio.gather(sample(), probe_healthz(s, node.url, stop, probes),
                             *(worker(i) for i in range(16)))
        pauses = node.event_ms("gc_pause")
        frozen = node.event_ms("gc_frozen")
        return curve, {"freezes": len(frozen), "freeze_max_ms": max(frozen, default=0.0),
                       "queues": await metric(s, node.url, "vq_queues") if creating else 0.0,
                       "healthz_p99_ms": pct(probes, .99), "healthz_max_ms": max(probes) * 1000,
                       "loop_lag_ms": await metric(s, node.url,
                                                   "vq_event_loop_lag_max_seconds") * 1000,
                       "gc_pauses": len(pauses), "gc_max_ms": max(pauses, default=0.0)}
    finally:
        node.stop()


async def long_polls(bootstrap: str, seconds: float, readers: int) -> dict[str, float]:
    """`readers` long polls (wait_ms 300, each again as soon as it returns empty) over 20 queues
    that get no record, for `seconds`: requests in flight that come and go, which must not set
    off a freeze of long-lived objects every second. The node's collections over 50 ms, its
    freezes, its live memory before and after, and /healthz meanwhile."""
    node = Node(bootstrap, new_topics(bootstrap))
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            await watch_replay(s, node)
            ends = []
            for i in range(20):
                async with s.post(f"{node.url}/v1/queues/lp{i}/records",
                                  json={"records": [{"value": "x"}]}) as r:
                    ends.append((await r.json())["offsets"][-1] + 1)
            heap_before = await metric(s, node.url, "vq_heap_in_use_bytes")
            stop = time.perf_counter() + seconds
            answered = [0]
            probes: list[float] = []

            async def reader(i: int) -> None:
                params = {"offset": str(ends[i % 20]), "wait_ms": "300"}
                while time.perf_counter() < stop:
                    async with s.get(f"{node.url}/v1/queues/lp{i % 20}/records",
                                     params=params) as r:
                        assert not (await r.json())["records"]
                    answered[0] += 1

            await asyncio.gather(probe_healthz(s, node.url, stop, probes),
                                 *(reader(i) for i in range(readers)))
            pauses = node.event_ms("gc_pause")
            frozen = node.event_ms("gc_frozen")
            return {"answered": answered[0], "gc_pauses": len(pauses),
                    "gc_max_ms": max(pauses, default=0.0), "freezes": len(frozen),
                    "freeze_ms": sum(frozen), "freeze_max_ms": max(frozen, default=0.0),
                    "heap_before_mb": heap_before / 1e6,
                    "heap_after_mb": await metric(s, node.url, "vq_heap_in_use_bytes") / 1e6,
                    "healthz_p99_ms": pct(probes, .99), "healthz_max_ms": max(probes) * 1000}
    finally:
        node.stop()


async def run(args: argparse.Namespace) -> None:
    broker: EmbeddedBroker | LocalKafkaCluster | None = None
    bootstrap = args.bootstrap
    label = bootstrap
    if not bootstrap:
        if args.broker == "kafka":
            broker = await asyncio.to_thread(LocalKafkaCluster().start)
            label = f"Apache Kafka {KAFKA_VERSION}, 3 brokers (replication 3)"
        else:
            broker = EmbeddedBroker().start()
            label = "embedded tansu"
        bootstrap = broker.bootstrap
    lines = [f"# vqueues bench_scale, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"broker {label}, one partition"
             + (f"; takeovers replay {args.after_snapshot:,} records written after the "
                "snapshot" if args.after_snapshot else "")]
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            empty = await empty_node_memory(s, bootstrap)
            lines.append(f"empty node: live {empty[0] / 1e6:.0f} MB, resident "
                         f"{empty[1] / 1e6:.0f} MB")
            lines += ["| records | queues | full replay to ready | raw consumer read | /healthz "
                      "p99 / max during replay (the node's worst loop lag) | snapshot size, "
                      "write time | takeover from the "
                      "snapshot, median (load, build; a raw consumer from its position to the "
                      "end; every takeover) | "
                      "/healthz p99 / max then, until its queues are built (loop lag) | "
                      "live per record | live per "
                      "queue | resident / live (whole process; above an empty node) | "
                      "GET /v1/queues p50 / p99 |", "|---" * 12 + "|"]
            per_record: float | None = None
            takeovers: dict[str, dict[str, Any]] = {}
            for queues in args.queues:
                for records in args.records:
                    r = await measure_replay(s, bootstrap, records, queues, empty,
                                            args.takeovers, args.baseline, args.after_snapshot)
                    if queues <= 100:
                        per_record = r["live_bytes"] / records
                    per_queue = ("" if per_record is None or queues <= 100 else
                                 f"{(r['live_bytes'] - per_record * records) / queues:.0f} B")
                    listing = (f"{r['list_p50_ms']:.1f} / {r['list_p99_ms']:.1f} ms"
                               if "list_p50_ms" in r else "")
                    lines.append(
                        f"| {records:,} | {queues:,} | {r['replay_s']:.1f} s | "
                        f"{r['raw_rate'] / 1e3:,.0f}k rec/s ({records / r['raw_rate']:.1f} s) | "
                        f"{r['healthz_p99_ms']:.0f} / {r['healthz_max_ms']:.0f} ms "
                        f"({r['loop_lag_ms']:.0f} ms) | "
                        f"{r['snapshot_mb']:.1f} MB, {r['snapshot_write_s']:.1f} s | "
                        f"{r['takeover_s'] * 1000:.0f} ms ({r['snapshot_load_s'] * 1000:.0f} "
                        f"ms, build {r['snapshot_build_s'] * 1000:.0f} ms; queues built "
                        f"{r['warm_s'] * 1000:.0f} ms after it served; raw "
                        f"{r['raw_end_s'] * 1000:.0f} ms; all: " + ", ".join(
                            f"{t * 1000:.0f}" for t in r["takeovers"]) + ") | "
                        f"{r['takeover_healthz_p99_ms']:.0f} / "
                        f"{r['takeover_healthz_max_ms']:.0f} ms "
                        f"({r['takeover_loop_lag_ms']:.0f} ms) | "
                        f"{r['live_bytes'] / records:.1f} B | {per_queue} | "
                        f"{r['rss_total'] / r['live_total']:.2f}; "
                        f"{r['rss_bytes'] / r['live_bytes']:.2f} | {listing} |")
                    print(lines[-1], flush=True)
                    if args.baseline:
                        takeovers[f"{records:,} records, {queues:,} queues"] = r
            for size, r in takeovers.items():
                lines.append(
                    f"takeover, {size}: median {r['takeover_s'] * 1000:.0f} ms (load "
                    f"{r['snapshot_load_s'] * 1000:.0f} ms; all: "
                    + ", ".join(f"{t * 1000:.0f}" for t in r["takeovers"])
                    + f"); before ({args.baseline}), same snapshot, alternating: median "
                    f"{r['before_takeover_s'] * 1000:.0f} ms (load "
                    f"{r['before_snapshot_load_s'] * 1000:.0f} ms; all: "
                    + ", ".join(f"{t * 1000:.0f}" for t in r["before_takeovers"]) + ")")
            u = await uncached_reads(s, bootstrap)
            lines.append(f"100-record pages older than the cache: p50 {u['uncached_p50_ms']:.1f} "
                         f"ms, p99 {u['uncached_p99_ms']:.1f} ms, slowest "
                         f"{u['uncached_max_ms']:.0f} ms (a raw consumer reading what each "
                         f"spans: p50 {u['raw_p50_ms']:.1f} ms, p99 {u['raw_p99_ms']:.1f} ms, "
                         f"slowest {u['raw_max_ms']:.0f} ms); a sparse queue's 3 records "
                         f"60,000 apart: p50 {u['sparse_p50_ms']:.1f} ms, p99 "
                         f"{u['sparse_p99_ms']:.1f} ms")
            if args.sustain_s:
                curve, load = await sustained(s, bootstrap, args.sustain_s)
                lines.append("sustained enqueue load, default cache (s: resident MB / live MB / "
                             "records enqueued, M): " + ", ".join(
                                 f"{t:.0f}: {r:.0f}/{h:.0f}/{n:.1f}" for t, r, h, n in curve))
                if len(curve) > 4:  # after the cache filled (about 15 s): growth per record
                    (_, r0, h0, n0), (_, r1, h1, n1) = curve[3], curve[-1]
                    per = 1e6 / max((n1 - n0) * 1e6, 1)
                    lines.append(f"from {curve[3][0]:.0f} s to the end: resident "
                                 f"{(r1 - r0) * per:.1f} B, live {(h1 - h0) * per:.1f} B per "
                                 "record enqueued (the index: no retention on tansu)")
                lines.append(f"under that load: /healthz p99 {load['healthz_p99_ms']:.1f} ms, max "
                             f"{load['healthz_max_ms']:.0f} ms; the node's worst loop lag "
                             f"{load['loop_lag_ms']:.0f} ms; {load['gc_pauses']:.0f} garbage "
                             f"collections over 50 ms (longest {load['gc_max_ms']:.0f} ms); "
                             f"{load['freezes']:.0f} freezes (longest "
                             f"{load['freeze_max_ms']:.0f} ms)")
            if args.create_s:
                curve, load = await sustained(s, bootstrap, args.create_s, creating=True)
                lines.append(f"creating queues for {args.create_s:.0f} s (one 100 B record per "
                             f"request, each to a new queue, 16 in flight): {load['queues']:,.0f} "
                             f"queues, resident {curve[-1][1]:.0f} MB, live {curve[-1][2]:.0f} "
                             f"MB at the end; /healthz p99 {load['healthz_p99_ms']:.1f} ms, max "
                             f"{load['healthz_max_ms']:.0f} ms; the node's worst loop lag "
                             f"{load['loop_lag_ms']:.0f} ms; {load['gc_pauses']:.0f} garbage "
                             f"collections over 50 ms (longest {load['gc_max_ms']:.0f} ms); "
                             f"{load['freezes']:.0f} freezes of what they created (longest "
                             f"{load['freeze_max_ms']:.0f} ms)")
            if args.polls_s:
                p = await long_polls(bootstrap, args.polls_s, args.polls)
                lines.append(f"{args.polls:,} long polls (wait_ms 300) for {args.polls_s:.0f} s "
                             f"over queues that get no record: {p['answered']:,} answered; "
                             f"{p['freezes']} freezes ({p['freeze_ms']:.0f} ms in all, longest "
                             f"{p['freeze_max_ms']:.0f} ms); {p['gc_pauses']} garbage "
                             f"collections over 50 ms (longest {p['gc_max_ms']:.0f} ms); live "
                             f"{p['heap_before_mb']:.1f} MB before, {p['heap_after_mb']:.1f} MB "
                             f"after; /healthz p99 {p['healthz_p99_ms']:.1f} ms, max "
                             f"{p['healthz_max_ms']:.0f} ms (client and node share the cores)")
    finally:
        if broker:
            broker.stop()
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing Kafka/Redpanda (default: embedded broker)")
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded",
                    help="kafka: a local three-broker Apache Kafka cluster (needs Java, Maven)")
    ap.add_argument("--records", default="1000000,4000000,8000000")
    ap.add_argument("--queues", default="10,1000000")
    ap.add_argument("--sustain-s", type=float, default=60.0)
    ap.add_argument("--create-s", type=float, default=60.0,
                    help="seconds of load that creates a queue per request (0: none)")
    ap.add_argument("--polls-s", type=float, default=60.0,
                    help="seconds of --polls long polls that come and go (0: none)")
    ap.add_argument("--polls", type=int, default=3000)
    ap.add_argument("--takeovers", type=int, default=3,
                    help="takeovers from the same snapshot per size (medians reported)")
    ap.add_argument("--after-snapshot", type=int, default=0, metavar="RECORDS",
                    help="records written after the snapshot, which each takeover replays")
    ap.add_argument("--baseline", metavar="CHECKOUT",
                    help="also take over with an older checkout's package (a git worktree), "
                         "alternating with this one's, from the same snapshots")
    args = ap.parse_args()
    args.records = [int(x) for x in args.records.split(",")]
    args.queues = [int(x) for x in args.queues.split(",")]
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
