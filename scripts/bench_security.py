#!/usr/bin/env python3
"""What security costs: the same workloads on a plain node, a node with auth (token file), and
a node with auth, TLS and a quota that admits everything (so every enqueue is charged), in one
run on one broker, alternating rounds, medians reported.

  enqueue throughput   batches of 100 records of 100 bytes, --concurrency requests in flight
  enqueue latency      one record per request, sequential (p50/p99)
  read latency         100 cached records per request, sequential (p50/p99)

Usage: .venv/bin/python scripts/bench_security.py [--seconds 4] [--rounds 2] [--samples 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402

from tests.support import make_certificates  # noqa: E402
from vqueues.api.auth import token_hash  # noqa: E402
from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402

TOKEN = "bench-" + uuid.uuid4().hex


def node_env(mode: str, files: Path) -> dict[str, str]:
    if mode == "plain":
        return {}
    env = {"VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(files / "tokens.json")}
    if mode == "auth+tls+quota":
        env |= {"VQ_TLS_CERT": str(files / "server.pem"),
                "VQ_TLS_KEY": str(files / "server-key.pem"),
                "VQ_QUOTA_FILE": str(files / "quotas.json")}
    return env


async def measure(mode: str, bootstrap: str, files: Path, args: argparse.Namespace
                  ) -> dict[str, float]:
    prefix = f"sec{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
        f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", args.partitions))
    port = free_port()
    env = {**os.environ, **bench.DEV_ENV, **node_env(mode, files), "VQ_BOOTSTRAP": bootstrap,
           "VQ_HTTP_PORT": str(port), "VQ_NODE_ID": f"sec-{mode}",
           "VQ_DATA_TOPIC": f"{prefix}-data", "VQ_OFFSET_TOPIC": f"{prefix}-offsets",
           "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assignments", "VQ_GROUP_ID": f"{prefix}-g",
           "VQ_LOG_LEVEL": "error"}
    proc = subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env)
    tls = mode == "auth+tls+quota"
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    ctx: ssl.SSLContext | bool = ssl.create_default_context(
        cafile=str(files / "ca.pem")) if tls else True
    headers = {"Authorization": f"Bearer {TOKEN}"} if mode != "plain" else {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx),
                                         headers=headers) as s:
            for _ in range(600):
                try:
                    async with s.get(f"{url}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
            await bench.vq_throughput(s, [url], 1.0, args.concurrency, lambda q: url)  # warm
            out = {"throughput": await bench.vq_throughput(s, [url], args.seconds,
                                                           args.concurrency, lambda q: url)}
            lat = await bench.vq_latency(s, url, "lat", args.samples)
            read = await bench.vq_read_latency(s, url, "rd", args.samples)
        out |= {"enqueue_p50": bench.pct(lat, .5), "enqueue_p99": bench.pct(lat, .99),
                "read_p50": bench.pct(read, .5), "read_p99": bench.pct(read, .99)}
        return out
    finally:
        proc.terminate()
        proc.wait(30)


async def run(args: argparse.Namespace) -> None:
    modes = ("plain", "auth", "auth+tls+quota")
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp)
        make_certificates(files)
        (files / "tokens.json").write_text(json.dumps({"tokens": [
            {"name": "bench", "sha256": token_hash(TOKEN),
             "scopes": {"read": [""], "write": [""], "admin": [""]}}]}))
        (files / "quotas.json").write_text(json.dumps({"quotas": [
            {"prefix": "", "records_per_s": 1e9, "bytes_per_s": 1e12}]}))
        broker = EmbeddedBroker().start()
        try:
            rounds: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for _ in range(args.rounds):
                for mode in modes:
                    rounds[mode].append(await measure(mode, broker.bootstrap, files, args))
        finally:
            broker.stop()
    med: dict[str, dict[str, Any]] = {
        m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rounds.items()}
    print(f"# vqueues security bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"1 node, {args.partitions} partitions, embedded broker, medians of {args.rounds} "
          "alternating rounds")
    print("| measure | " + " | ".join(modes) + " |")
    print("|---" * (1 + len(modes)) + "|")
    base = med["plain"]
    rows = (("throughput", "enqueue, batches of 100 x 100 B, records/s", "{:,.0f}"),
            ("enqueue_p50", "enqueue 1 record, p50 ms", "{:.2f}"),
            ("enqueue_p99", "enqueue 1 record, p99 ms", "{:.2f}"),
            ("read_p50", "read 100 cached records, p50 ms", "{:.2f}"),
            ("read_p99", "read 100 cached records, p99 ms", "{:.2f}"))
    for key, label, fmt in rows:
        cells = [fmt.format(med[m][key]) + ("" if m == "plain"
                                             else f" ({med[m][key] / base[key]:.2f}x)")
                 for m in modes]
        print(f"| {label} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=16)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
