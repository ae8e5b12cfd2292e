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

With --broker kafka, on the local three-broker Apache Kafka cluster: the broker frozen is the
node's group coordinator (which also leads a share of the data partitions); the node joins as a
static member (`static_membership` auto), and so does the raw member, in a group with the same
coordinator.
Usage: .venv/bin/python scripts/bench_freeze.py [--freeze-s 15] [--queues 20] [--writers 4]
       [--broker embedded|kafka]
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
import urllib.request
import uuid
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vqueues.kafka import topics as vq_topics  # noqa: E402
from vqueues.kafka.admin import Admin  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from vqueues.kafka.local_cluster import LocalKafkaCluster  # noqa: E402
from vqueues.settings import Settings  # noqa: E402


class RawMember:
    """A raw consumer group member in a thread: when it lost and got partitions."""

    def __init__(self, bootstrap: str, topic: str, session_ms: int, group: str,
                 static: bool = False) -> None:
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                            **({"group.instance.id": "raw-0"} if static else {}),
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


def wait_for_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not 200 in {timeout_s} s")


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


def coordinator(cluster: LocalKafkaCluster, group: str) -> int:
    """The broker coordinating `group`: the leader of its `__consumer_offsets` partition,
    Java's `String.hashCode` of the id, made positive, modulo the topic's partitions."""
    h = 0
    for unit in group.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    meta = cluster.admin().list_topics("__consumer_offsets", timeout=10)
    count = len(meta.topics["__consumer_offsets"].partitions)
    return cluster.leader("__consumer_offsets", (h & 0x7FFFFFFF) % count)


def raw_group(cluster: LocalKafkaCluster, broker_id: int) -> str:
    """A fresh group id that `broker_id` coordinates."""
    for _ in range(500):
        group = f"raw-{uuid.uuid4().hex}"
        if coordinator(cluster, group) == broker_id:
            return group
    raise RuntimeError(f"no group id found that broker {broker_id} coordinates")


async def run(args: argparse.Namespace) -> None:
    session_ms = Settings().session_timeout_ms
    cluster = broker = None
    if args.broker == "kafka":
        cluster = await asyncio.to_thread(LocalKafkaCluster().start)
        bootstrap = cluster.bootstrap
    else:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    node = None
    raw = None
    try:
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
        if cluster is not None:  # __consumer_offsets, which the look-ups read, comes with it
            await asyncio.to_thread(wait_for_http, f"{url}/readyz")
            frozen_id = await asyncio.to_thread(coordinator, cluster, f"{prefix}-g")
            frozen_pid = cluster.process(frozen_id).process.pid  # type: ignore[union-attr]
            raw = RawMember(bootstrap, f"{prefix}-data", session_ms,
                            await asyncio.to_thread(raw_group, cluster, frozen_id), static=True)
            what = (f"Kafka broker {frozen_id} of 3 (the node's and the raw member's group "
                    "coordinator)")
        else:
            assert broker is not None and broker.process is not None
            frozen_pid = broker.process.pid
            raw = RawMember(bootstrap, f"{prefix}-data", session_ms, f"raw-{uuid.uuid4().hex}")
            what = "tansu"
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
            os.kill(frozen_pid, signal.SIGSTOP)
            await asyncio.sleep(args.freeze_s)
            answers.clear()
            os.kill(frozen_pid, signal.SIGCONT)
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
        # Its first assignment after its last loss; before SIGCONT (negative) when another
        # broker took the coordination over during the freeze.
        back = [t - resumed for t, what in raw.events
                if lost and t >= lost[-1] and what == "assigned"]
        rejoin = back[0] if lost and back else 0.0
        print(f"# broker frozen, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {what} "
              f"SIGSTOPped {args.freeze_s:.0f} s under load ({args.writers} writers, "
              f"{args.queues} queues, {args.partitions} partitions), session timeout "
              f"{session_ms} ms; times from SIGCONT")
        print(f"node: first enqueue {first:.2f} s, every queue {every:.2f} s; answers meanwhile "
              f"{dict(answers)}")
        kept = "lost its partitions during the freeze" if lost else "kept its partitions"
        print(f"raw consumer: {kept}, held them again {rejoin:.2f} s after SIGCONT"
              + (" (during the freeze: another broker took the group over)" if rejoin < 0
                 else ""))
        if rejoin > 0:
            print(f"node (every queue) / raw rejoin: {every / rejoin:.2f}x; the node adds "
                  f"{every - rejoin:.2f} s (replaying the partitions it got back)")
    finally:
        if raw is not None:
            raw.stop()
        if node is not None:
            node.terminate()
            node.wait(30)
        if broker is not None:
            broker.stop()
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--freeze-s", type=float, default=15.0)
    ap.add_argument("--queues", type=int, default=20)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
