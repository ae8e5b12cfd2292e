"""What only real Kafka does, and vqueues relies on: compaction of the offset and snapshot topics,
time retention trimming the index, and latest-offset look-ups under batching producers.

The embedded broker compacts and removes nothing (docs/embedded-broker.md), so these run on the
local Apache Kafka cluster (`kafka_bootstrap`). Topics here get settings that make Kafka roll and
clean segments within seconds; the broker's cleaner backs off 1 s (vqueues/kafka/local_cluster.py).
"""

import json
import time
import uuid

from confluent_kafka import Producer

from tests.support import (
    SNAPSHOT_FAST,
    NodeProcess,
    create_topics,
    events,
    http,
    kafka_records,
    observe,
)
from vqueues.state.window_writes import CHECKPOINT_EVERY

# Roll a segment every 200 ms and clean it at once; drop tombstones 1 s after cleaning.
COMPACT_FAST = {"segment.ms": "200", "min.cleanable.dirty.ratio": "0.01",
                "min.compaction.lag.ms": "0", "delete.retention.ms": "1000"}


def test_the_offset_topic_compacts_and_a_successor_keeps_every_consumer(kafka_bootstrap):
    """Acks rewrite a cursor consumer's key; a lease consumer's calls write one window delta
    each and a checkpoint now and then supersedes them (ADR 12). Compaction keeps the last
    ack, and a checkpoint with at most `CHECKPOINT_EVERY` deltas per lease consumer, and what
    it keeps is the state a successor answers from."""
    t = create_topics(kafka_bootstrap, partitions=1, configs={"offsets": COMPACT_FAST})
    node = NodeProcess(t).start()
    jobs = f"{node.url}/v1/queues/jobs"
    try:
        offsets = http("POST", f"{node.url}/v1/queues/q/records",
                       {"records": [{"value": f"v{i}"} for i in range(10)]})[1]["offsets"]
        for consumer in ("kept", "gone"):
            assert http("POST", f"{node.url}/v1/queues/q/consumers/{consumer}/ack",
                        {"offset": offsets[0] + 1})[0] == 200
        assert http("DELETE", f"{node.url}/v1/queues/q/consumers/gone")[0] == 200
        # A lease consumer with one record held for long and one waiting for a retry.
        assert http("POST", f"{jobs}/records",
                    {"records": [{"value": f"j{i}"} for i in range(3)]})[0] == 200
        held = http("POST", f"{jobs}/consumers/w/lease",
                    {"max_records": 1, "visibility_ms": 600_000})[1]["records"][0]
        later = http("POST", f"{jobs}/consumers/w/lease", {"max_records": 1})[1]["records"][0]
        assert http("POST", f"{jobs}/consumers/w/retry",
                    {"tokens": [later["token"]], "delay_ms": 600_000})[0] == 200
        written, windows, acked_to = 0, 3, 0

        def write(acks: int, leases: int) -> None:
            nonlocal written, windows, acked_to
            # Every ack writes the consumer's key again; compaction keeps the last one.
            offsets = http("POST", f"{node.url}/v1/queues/q/records",
                           {"records": [{"value": "more"}] * acks})[1]["offsets"]
            for offset in offsets:
                assert http("POST", f"{node.url}/v1/queues/q/consumers/kept/ack",
                            {"offset": offset + 1})[0] == 200
                written, acked_to = written + 1, offset + 1
            for _ in range(leases):
                assert http("POST", f"{jobs}/records",
                            {"records": [{"value": "more"}] * 5})[0] == 200
                got = http("POST", f"{jobs}/consumers/w/lease", {"max_records": 5})[1]
                assert http("POST", f"{jobs}/consumers/w/complete",
                            {"tokens": [r["token"] for r in got["records"]]})[0] == 200
                windows += 2

        # What compaction has to show, written at once: then a little more each turn (a write
        # rolls the segment the cleaner may then clean).
        while windows <= 4 * CHECKPOINT_EVERY or written < 100:
            write(10, 10)
        deadline = time.monotonic() + 90
        while True:
            records = kafka_records(kafka_bootstrap, t.offsets)
            live = [k for k, value, _, _ in records.values()
                    if json.loads(k)[0] in ("w", "W") and value is not None]
            if len(records) < written // 2 and windows > 4 * CHECKPOINT_EVERY and \
                    len(live) <= CHECKPOINT_EVERY + 2:
                break
            assert time.monotonic() < deadline, \
                f"no compaction: {len(records)} of {written}, {len(live)} of {windows} windows"
            time.sleep(0.5)
            write(2, 1)
        kept = [k for k, value, _, _ in records.values() if "kept" in k and value is not None]
        assert len(kept) < written // 2
        before = http("GET", jobs)[1]["consumers"]
        assert (before[0]["in_flight"], before[0]["delayed"]) == (1, 1)
        assert before[0]["offset"] == held["offset"]
    finally:
        assert node.kill() == -9
    successor = NodeProcess(t).start()
    jobs = f"{successor.url}/v1/queues/jobs"
    try:
        status, info = http("GET", f"{successor.url}/v1/queues/q")
        assert status == 200
        assert [(c["consumer"], c["offset"]) for c in info["consumers"]] == [("kept", acked_to)]
        assert http("GET", f"{successor.url}/v1/queues/q/consumers/gone")[0] == 404
        assert http("GET", jobs)[1]["consumers"] == before
        # The lease granted before all that compaction is still current.
        status, done = http("POST", f"{jobs}/consumers/w/complete", {"tokens": [held["token"]]})
        assert status == 200 and done["done"] == [held["token"]]
    finally:
        successor.terminate()


def _snapshot_ids(bootstrap: str, topic: str) -> set[int]:
    """The ids of the snapshots whose chunks are still in the topic."""
    out = set()
    for key, value, _, _ in kafka_records(bootstrap, topic).values():
        parts = json.loads(key)
        if parts[0] == "c" and value is not None:
            out.add(parts[2])
    return out


def test_the_snapshot_topic_compacts_to_the_latest_snapshot_which_a_successor_loads(
        kafka_bootstrap):
    t = create_topics(kafka_bootstrap, partitions=1, configs={"snapshots": COMPACT_FAST})
    node = NodeProcess(t, extra_env=SNAPSHOT_FAST).start()
    queues = [f"s{i}" for i in range(4)]
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 90
        while True:
            for q in queues:
                assert http("POST", f"{node.url}/v1/queues/{q}/records",
                            {"records": [{"value": f"{q}-{k}"} for k in range(5)]})[0] == 200
            seen |= {e["id"] for e in events(node, "snapshot_written")}
            present = _snapshot_ids(kafka_bootstrap, t.snapshots)
            # Several snapshots written, and older ones' chunks removed by compaction.
            if len(seen) >= 3 and len(present) <= 2:
                break
            assert time.monotonic() < deadline, f"written {seen}, still present {present}"
            time.sleep(1)
        before = observe(node, queues)
    finally:
        assert node.kill() == -9
    # What the compacted topic kept is enough for a successor: the latest snapshot, then the rest.
    successor = NodeProcess(t).start()
    try:
        assert [e["partition"] for e in events(successor, "snapshot_loaded")] == [0]
        assert observe(successor, queues) == before
    finally:
        successor.terminate()


def test_time_retention_trims_the_index_and_empties_the_listing(kafka_bootstrap):
    # Records older than 3 s are deleted a segment at a time (segments roll every 500 ms).
    t = create_topics(kafka_bootstrap, partitions=1,
                      configs={"data": {"retention.ms": "3000", "segment.ms": "500"}})
    node = NodeProcess(t, extra_env={"VQ_RETENTION_CHECK_S": "1"}).start()
    try:
        assert http("POST", f"{node.url}/v1/queues/old/records",
                    {"records": [{"value": "a"}, {"value": "b"}]})[0] == 200
        assert http("GET", f"{node.url}/v1/queues")[1]["queues"] == ["old"]
        deadline = time.monotonic() + 60
        while http("GET", f"{node.url}/v1/queues/old")[0] != 404:
            assert time.monotonic() < deadline, "the queue outlived its records"
            # A new record rolls the segment, so the old one can be deleted.
            assert http("POST", f"{node.url}/v1/queues/new/records",
                        {"records": [{"value": "c"}]})[0] == 200
            time.sleep(0.5)
        assert "old" not in http("GET", f"{node.url}/v1/queues")[1]["queues"]
        page = http("GET", f"{node.url}/v1/queues/new/records?offset=0&limit=1000")[1]
        assert page["records"] and page["records"][0]["offset"] > 1
    finally:
        node.terminate()


def test_a_successor_indexes_every_record_a_batching_producer_wrote(kafka_bootstrap):
    """The embedded broker answers latest-offset look-ups wrongly when producers batch (ADR 3);
    Kafka answers them right, and replay must end exactly at the end of the log."""
    t = create_topics(kafka_bootstrap, partitions=4)
    node = NodeProcess(t).start()
    node.terminate()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2",
                         "linger.ms": 50, "batch.num.messages": 500})
    queues = [f"b{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    for i in range(5000):
        # Keyed by queue name, as vqueues writes: Kafka's partitioner places it.
        producer.produce(t.data, key=queues[i % 20].encode(), value=f"v{i}".encode())
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0
    del producer
    successor = NodeProcess(t).start()
    try:
        counts = {q: http("GET", f"{successor.url}/v1/queues/{q}")[1]["records"]
                  for q in queues}
        assert counts == {q: 250 for q in queues}
        last = http("GET", f"{successor.url}/v1/queues/{queues[-1]}/records?offset=0&limit=1000")
        assert [r["value"] for r in last[1]["records"]][-1] == "v4999"
    finally:
        successor.terminate()

