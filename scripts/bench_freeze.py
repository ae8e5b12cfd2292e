#!/usr/bin/env python3
"""The broker frozen (SIGSTOP) for --freeze-s seconds, then resumed (SIGCONT), under load: how
soon one node serves again, beside a raw confluent-kafka group member on the same broker.

On the embedded broker (started here, so that it can be stopped): one node with the settings
`scripts/run` uses (its session timeout included), --writers writers enqueueing 10 records at a
time round-robin over --queues queues. Beside it, in this process, a raw confluent-kafka
Consumer subscribed to the same data topic in a group of its own (cooperative-sticky, the
node's session timeout) polls in a thread. From SIGCONT it prints:
  node      the first successful enqueue, and when every queue had one (every partition served
            again); what it answered meanwhile (status and error code counts)
  raw       whether the raw member lost its partitions (librdkafka's own session timer runs
            while the broker is frozen) and when it held them again: its own rejoin
The ratio node / raw is what the node adds to the broker's and the client library's own
recovery.
Usage: .venv/bin/python scripts/bench_freeze.py [--freeze-s 15] [--queues 20] [--writers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vqueues import topics as vq_topics  # noqa: E402
from vqueues.broker import EmbeddedBroker, free_port  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.settings import Settings  # noqa: E402


class RawMember:
    """A raw consumer group member in a thread: when it lost and got partitions."""

    def __init__(self, bootstrap: str, topic: str, session_ms: int) -> None:
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                            "session.timeout.ms": session_ms,
                            "heartbeat.interval.ms": max(100, session_ms // 10),
                            "partition.assignment.strategy": "cooperative-sticky",
                            "auto.offset.reset": "latest", "enable.auto.commit": False})
        self._c.subscribe([topic], on_assign=lambda c, ps: self._note("assigned", ps),
                          on_revoke=lambda c, ps: self._note("revoked", ps),
                          on_lost=lambda c, ps: self._note("lost", ps))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _note(self, what: str, partitions: list) -> None:
        if partitions:
            self.events.append((time.monotonic(), what))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._c.poll(0.05)

    @property
    def assigned(self) -> bool:
        held = 0
        for _, what in self.events:
            held = 1 if what == "assigned" else 0 if what in ("lost", "revoked") else held
        return bool(held)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._c.close()


async def writer(s: aiohttp.ClientSession, url: str, queues: list[str], stop: asyncio.Event,
                 first_ok: dict[str, float], answers: collections.Counter, since: list[float]
                 ) -> None:
    n = 0
    while not stop.is_set():
        q = queues[n % len(queues)]
        n += 1
        try:
            async with s.post(f"{url}/v1/queues/{q}/records",
                              json={"records": [{"value": f"v{n}"}] * 10}) as r:
                body = await r.json(content_type=None)
                if r.status == 200:
                    if since and q not in first_ok:
                        first_ok[q] = time.monotonic()
                else:
                    answers[f"{r.status} {body.get('error', {}).get('code')}"] += 1
                    await asyncio.sleep(0.05)
        except (aiohttp.ClientError, TimeoutError):
            answers["no answer"] += 1
        await asyncio.sleep(0.005)


async def run(args: argparse.Namespace) -> None:
    session_ms = Settings().session_timeout_ms
    broker = EmbeddedBroker().start()
    node = None
    raw = None
    try:
        bootstrap = broker.bootstrap
        prefix = f"freeze{uuid.uuid4().hex[:6]}"
        Admin({"bootstrap.servers": bootstrap}).create(vq_topics.specs(
            f"{prefix}-data", f"{prefix}-offsets", f"{prefix}-assign", args.partitions,
            snapshot_topic=f"{prefix}-snapshots"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "VQ_BOOTSTRAP": bootstrap, "VQ_HTTP_PORT": str(port),
               "VQ_DATA_TOPIC": f"{prefix}-data", "VQ_OFFSET_TOPIC": f"{prefix}-offsets",
               "VQ_ASSIGNMENT_TOPIC": f"{prefix}-assign",
               "VQ_SNAPSHOT_TOPIC": f"{prefix}-snapshots", "VQ_GROUP_ID": f"{prefix}-g",
               "VQ_NODE_ID": "frozen", "VQ_LOG_LEVEL": "warning"}
        node = subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env)
        raw = RawMember(bootstrap, f"{prefix}-data", session_ms)
        queues = [f"fz-{i}" for i in range(args.queues)]
        first_ok: dict[str, float] = {}
        answers: collections.Counter = collections.Counter()
        since: list[float] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            for _ in range(600):
                try:
                    async with s.get(f"{url}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            while not raw.assigned:
                await asyncio.sleep(0.1)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(writer(s, url, queues[i::args.writers], stop, first_ok,
                                                answers, since))
                     for i in range(args.writers)]
            await asyncio.sleep(3)
            assert broker.process is not None
            os.kill(broker.process.pid, signal.SIGSTOP)
            await asyncio.sleep(args.freeze_s)
            answers.clear()
            os.kill(broker.process.pid, signal.SIGCONT)
            resumed = time.monotonic()
            since.append(resumed)
            deadline = resumed + 120
            while (len(first_ok) < len(queues) or not raw.assigned) and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*tasks)
        first = min(first_ok.values()) - resumed if first_ok else float("nan")
        every = max(first_ok.values()) - resumed if len(first_ok) == len(queues) else float("nan")
        frozen_at = resumed - args.freeze_s
        lost = [t for t, what in raw.events if t >= frozen_at and what != "assigned"]
        back = [t - resumed for t, what in raw.events if t >= resumed and what == "assigned"]
        rejoin = back[0] if lost and back else 0.0
        print(f"# broker frozen, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: tansu "
              f"SIGSTOPped {args.freeze_s:.0f} s under load ({args.writers} writers, "
              f"{args.queues} queues, {args.partitions} partitions), session timeout "
              f"{session_ms} ms; times from SIGCONT")
        print(f"node: first enqueue {first:.2f} s, every queue {every:.2f} s; answers meanwhile "
              f"{dict(answers)}")
        kept = "lost its partitions during the freeze" if lost else "kept its partitions"
        print(f"raw consumer: {kept}, held them again {rejoin:.2f} s after SIGCONT")
        if rejoin:
            print(f"node (every queue) / raw rejoin: {every / rejoin:.2f}x; the node adds "
                  f"{every - rejoin:.2f} s (replaying the partitions it got back)")
    finally:
        if raw is not None:
            raw.stop()
        if node is not None:
            node.terminate()
            node.wait(30)
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--freeze-s", type=float, default=15.0)
    ap.add_argument("--queues", type=int, default=20)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=16)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
