#!/usr/bin/env python3
"""Every broker connection dropped, --drops times, 4 s apart: how long until a node serves again,
beside a raw confluent-kafka producer with the node's producer settings through the same proxy.

The embedded broker advertises a fault proxy (tests/faults/proxy.py), so every connection of
the node and of the raw producer goes through it; a drop closes them all at once. Measured from
each drop:
  raw    an idempotent producer with the node's producer settings (acks all, linger 5 ms,
         lz4, the node's message timeout, metadata.recovery.strategy none)
         writing continuously, 20 in flight: its first acknowledged write after the drop
  node   one node under the fault tier's load (cursor enqueue/ack, lease/complete, keyed and
         scheduled enqueues): the first success of every kind of call after the drop (the
         slowest kind)
Usage: .venv/bin/python scripts/bench_drop.py [--drops 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults.proxy import FaultProxy  # noqa: E402
from tests.faults.test_network_faults import Load  # noqa: E402
from tests.support import NodeProcess, create_topics, http  # noqa: E402
from vqueues.kafka import client_config  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from vqueues.settings import Settings  # noqa: E402

APART_S = 4.0
T = TypeVar("T")


def raw_drops(proxy: FaultProxy, bootstrap: str, topic: str, drops: int) -> list[float]:
    """Seconds from each drop to the raw producer's first acknowledged write."""
    p = Producer(client_config(bootstrap, None, **{
        "acks": "all", "enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4",
        "message.timeout.ms": Settings().broker_timeout_ms,
        "metadata.recovery.strategy": "none"}))  # as the node sets it on the embedded broker
    acked: list[float] = []
    stop = threading.Event()

    def run() -> None:
        def note(err: object, _msg: object) -> None:
            if err is None:
                acked.append(time.monotonic())

        while not stop.is_set():
            for _ in range(20):
                p.produce(topic, key=b"k", value=b"v", partition=0, on_delivery=note)
            p.poll(0.002)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        time.sleep(2)
        return each_drop(proxy, drops, lambda at: min(
            (t for t in acked if t > at), default=at + APART_S) - at)
    finally:
        stop.set()
        thread.join(10)
        p.flush(10)


def node_drops(proxy: FaultProxy, url: str, drops: int) -> list[tuple[float, str]]:
    """Seconds from each drop until every kind of call had succeeded again, and the slowest
    kind."""
    assert http("PUT", f"{url}/v1/queues/fault-w/consumers/w",
                {"mode": "lease", "visibility_ms": 2000})[0] == 200
    load = Load(url)
    threads = load.run()

    def slowest(at: float) -> tuple[float, str]:
        firsts = {kind: min((t for t in times if t > at), default=at + APART_S) - at
                  for kind, times in load.successes.items()}
        kind = max(firsts, key=lambda k: firsts[k])
        return firsts[kind], kind

    try:
        time.sleep(3)
        return each_drop(proxy, drops, slowest)
    finally:
        load.stop.set()
        for th in threads:
            th.join(20)


def each_drop(proxy: FaultProxy, drops: int, since: Callable[[float], T]) -> list[T]:
    """Drop every connection `drops` times, APART_S apart; after each, what `since` measures
    from the drop's time."""
    out = []
    for _ in range(drops):
        at = time.monotonic()
        proxy.drop()
        time.sleep(APART_S)
        out.append(since(at))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drops", type=int, default=5)
    args = ap.parse_args()
    proxy_port, broker_port = free_port(), free_port()
    proxy = FaultProxy("127.0.0.1", proxy_port, broker_port).start()
    broker = EmbeddedBroker(port=broker_port, advertised_port=proxy_port).start()
    try:
        bootstrap = f"127.0.0.1:{proxy_port}"
        topics = create_topics(bootstrap, partitions=4)
        raw = raw_drops(proxy, bootstrap, topics.data, args.drops)
        node = NodeProcess(create_topics(bootstrap, partitions=4), node_id="drops").start()
        try:
            served = node_drops(proxy, node.url, args.drops)
        finally:
            node.terminate()
    finally:
        broker.stop()
        proxy.stop()
    print(f"# every connection dropped, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"{args.drops} drops {APART_S:.0f} s apart, embedded broker behind the fault proxy")
    print("raw producer, first acknowledged write after each drop: "
          + ", ".join(f"{s:.2f}" for s in raw) + " s")
    print("node, every kind of call served again after each drop: "
          + ", ".join(f"{s:.2f} ({k})" for s, k in served) + " s")
    print(f"medians: node {statistics.median(s for s, _ in served):.2f} s, raw "
          f"{statistics.median(raw):.2f} s")


if __name__ == "__main__":
    main()
