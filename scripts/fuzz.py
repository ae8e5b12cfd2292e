#!/usr/bin/env python3
"""A long run of byte-level mutations of valid requests (tests/mutations.py) against a node with
auth on, on the embedded broker: every answer must be below 500 and, for a refusal, the error
registry's JSON with the registry's status and `retriable`; afterwards the node must be healthy
and its log free of crashes. Prints the counts by status, code and mutation.

Usage: .venv/bin/python scripts/fuzz.py [--requests 20000] [--seed 36] [--concurrency 8]
Exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import mutations
from vqueues.api.auth import token_hash
from vqueues.kafka import topics as vq_topics
from vqueues.kafka.admin import Admin
from vqueues.kafka.broker import EmbeddedBroker, free_port

TOKEN = "fuzz-" + uuid.uuid4().hex


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


async def fuzz(port: int, args: argparse.Namespace) -> tuple[Counter[str], list[str]]:
    stream = mutations.requests(random.Random(args.seed), TOKEN)
    counts: Counter[str] = Counter()
    problems: list[str] = []

    async def worker() -> None:
        while counts["requests"] < args.requests:
            counts["requests"] += 1
            request = next(stream)
            try:
                answer = await mutations.send("127.0.0.1", port, request)
            except (OSError, TimeoutError) as exc:
                problems.append(f"{type(exc).__name__} {request.mutations}")
                continue
            problem = mutations.violation(answer)
            counts[f"status {answer.status}"] += 1
            for name in request.mutations:
                counts[f"mutation {name}"] += 1
            if answer.status >= 400 and problem is None:
                counts[f"code {json.loads(answer.body)['error']['code']}"] += 1
            if problem is not None:
                problems.append(f"{problem} {request.mutations} {request.encode()[:300]!r}")

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return counts, problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    broker = EmbeddedBroker().start()
    proc = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            files = Path(tmp)
            (files / "tokens.json").write_text(json.dumps({"tokens": [
                {"name": "fuzz", "sha256": token_hash(TOKEN),
                 "scopes": {"read": [""], "write": [""], "admin": [""]}}]}))
            prefix = f"fz{uuid.uuid4().hex[:6]}"
            Admin({"bootstrap.servers": broker.bootstrap}).create(vq_topics.specs(
                f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assignments", 4))
            port = free_port()
            log = files / "node.log"
            env = {**os.environ, "VQ_BOOTSTRAP": broker.bootstrap, "VQ_HTTP_PORT": str(port),
                   "VQ_NODE_ID": "fuzz", "VQ_DATA_TOPIC": f"{prefix}-data",
                   "VQ_OFFSET_TOPIC": f"{prefix}-offsets",
                   "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assignments", "VQ_GROUP_ID": f"{prefix}-g",
                   "VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(files / "tokens.json"),
                   "VQ_MAX_WAIT_MS": "50", "VQ_BODY_TIMEOUT_MS": "2000"}
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env,
                                        stdout=out, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while _status(f"{url}/readyz") != 200:
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit("the node did not become ready")
                time.sleep(0.2)
            started = time.monotonic()
            counts, problems = asyncio.run(fuzz(port, args))
            took = time.monotonic() - started
            healthy = _status(f"{url}/healthz") == 200 and _status(f"{url}/readyz") == 200
            crashed = re.findall(r"request_crashed|Traceback", log.read_text())
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        broker.stop()
    print(f"{counts['requests']} mutated requests in {took:.1f} s, seed {args.seed}, "
          f"{args.concurrency} at once")
    for key in sorted(k for k in counts if k != "requests"):
        print(f"  {key:40} {counts[key]:6}")
    print(f"violations: {len(problems)}; node healthy after: {healthy}; crashes logged: "
          f"{len(crashed)}")
    for p in problems[:20]:
        print("  ", p)
    sys.exit(1 if problems or crashed or not healthy else 0)


if __name__ == "__main__":
    main()
