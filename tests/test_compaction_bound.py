"""The offset topic's size stays bounded under a steady lease/complete load (docs/kafka.md,
"The compacted topics' segments"), on the local Apache Kafka cluster.

The topics are made by `vqueues topics create` with the compacted-topic settings shortened so
that the bound shows within seconds: `--compacted-segment-ms 1000` and
`--compacted-delete-retention-ms 2000` (production: 1 h each); segment.bytes (100 MiB) is never
reached here, and the dirty ratio is Kafka's default 0.5. The broker's cleaner looks for work
every second (`log.cleaner.backoff.ms`, vqueues/kafka/local_cluster.py).

The bound, per partition: 2 x (what is written in segment.ms + delete.retention.ms + the
cleaner's lag), plus twice the live state. Bytes written are counted by a plain consumer that
tails the partition (key, value and headers, plus 80 bytes per record for Kafka's record and
batch framing); the size is the partition's log files on disk, the largest of its replicas.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support import NodeProcess, Topics, http, vqueues_cli
from vqueues.kafka.local_cluster import LocalKafkaCluster

SEGMENT_MS, DELETE_RETENTION_MS = 1000, 2000
CLEANER_LAG_S = 2.0  # the cleaner's 1 s back-off and a cleaning's own time
WINDOW_S = (SEGMENT_MS + DELETE_RETENTION_MS) / 1000 + CLEANER_LAG_S
LIVE_SLACK = 64 * 1024  # twice the live state: a checkpoint and at most 64 window writes
LOAD_S = 24
FRAMING = 80


class Written:
    """Tails one partition from its start, counting the bytes of every record as written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.times: list[float] = []
        self.total: list[int] = [0]
        self._stop = threading.Event()
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                            "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        self._c.assign([TopicPartition(topic, 0, 0)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(500, 0.1):
                if m.error():
                    continue
                headers = cast(list[tuple[str, bytes | None]], m.headers() or [])
                size = FRAMING + len(m.key() or b"") + len(m.value() or b"") + sum(
                    len(k) + len(v or b"") for k, v in headers)
                self.times.append(m.timestamp()[1] / 1000)
                self.total.append(self.total[-1] + size)
        self._c.close()

    def since(self, t: float) -> int:
        """Bytes written from wall-clock time `t` on."""
        return self.total[-1] - self.total[bisect.bisect_left(self.times, t)]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def on_disk(cluster: LocalKafkaCluster, topic: str) -> int:
    """The partition's log files on its largest replica."""
    return max(sum(f.stat().st_size for f in Path(p.folder, "data", f"{topic}-0").glob("*.log")
                   if f.exists())
               for p in cluster.processes)


def test_the_offset_topic_stays_within_its_bound_under_lease_and_complete(
        kafka_cluster, kafka_bootstrap):
    if kafka_cluster is None:
        pytest.skip("reads the partition's files on the local cluster's disks; "
                    "VQ_TEST_KAFKA_BOOTSTRAP names an external cluster")
    t = Topics(kafka_bootstrap, f"bound{uuid.uuid4().hex[:6]}", 1)
    out = vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "1",
                  "--data-topic", t.data, "--offset-topic", t.offsets, "--assignment-topic",
                  t.assignments, "--snapshot-topic", t.snapshots,
                  "--compacted-segment-ms", str(SEGMENT_MS),
                  "--compacted-delete-retention-ms", str(DELETE_RETENTION_MS))
    assert out.returncode == 0, out.stderr
    written = Written(kafka_bootstrap, t.offsets)
    node = NodeProcess(t).start()
    jobs = f"{node.url}/v1/queues/jobs"
    samples: list[tuple[float, int, int]] = []  # (time, on disk, bound)
    cycles = 0
    try:
        began = time.time()
        next_sample = began + WINDOW_S * 2  # the bound holds once a window has passed twice
        while time.time() < began + LOAD_S:
            assert http("POST", f"{jobs}/records",
                        {"records": [{"value": "job"}] * 10})[0] == 200
            got = http("POST", f"{jobs}/consumers/w/lease", {"max_records": 10})[1]
            assert http("POST", f"{jobs}/consumers/w/complete",
                        {"tokens": [r["token"] for r in got["records"]]})[0] == 200
            cycles += 1
            now = time.time()
            if now >= next_sample:
                time.sleep(0.3)  # the tail has counted what the disk holds
                now = time.time()
                bound = 2 * written.since(now - WINDOW_S) + LIVE_SLACK
                samples.append((now - began, on_disk(kafka_cluster, t.offsets), bound))
                next_sample = now + 1
    finally:
        node.terminate()
        written.stop()
    total = written.total[-1]
    print(f"\n{cycles} lease/complete cycles in {LOAD_S} s; {total} bytes written to the offset "
          f"partition; on disk / bound (bytes) at s: "
          + ", ".join(f"{s:.0f}: {d}/{b}" for s, d, b in samples))
    assert len(samples) >= 5
    over = [(s, d, b) for s, d, b in samples if d > b]
    assert not over, f"over the bound: {over}"
    assert samples[-1][1] < total / 2, "the partition was not compacted"
