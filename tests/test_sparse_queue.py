"""A per-queue index, never a partition scan: a sparse queue in a busy partition is read whole."""

import time

from confluent_kafka import Producer

from tests.support import NodeProcess, create_topics, http, queues_in_partition
from vqueues.hashing import partition_for

OTHERS = 200_000


def fill(bootstrap, topic, names, count):
    """Write `count` 100-byte records round-robin over `names` with a plain producer."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2",
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 500000})
    value = b"v" * 100
    keys = [n.encode() for n in names]
    for i in range(count):
        while True:
            try:
                p.produce(topic, key=keys[i % len(keys)], value=value)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def enqueue(node, queue, value):
    status, body = http("POST", f"{node.url}/v1/queues/{queue}/records",
                        {"records": [{"value": value}]})
    assert status == 200, body
    return body["offsets"][0]


def test_three_records_after_200k_of_other_queues_are_read_in_one_request(bootstrap):
    t = create_topics(bootstrap, partitions=4)
    target = "sparse-target"
    p = partition_for(target, t.partitions)
    fill(bootstrap, t.data, queues_in_partition(p, t.partitions, 50, "busy"), OTHERS)
    node = NodeProcess(t).start()
    try:
        offsets = [enqueue(node, target, f"r{i}") for i in range(3)]
        assert offsets[0] >= OTHERS
        status, body = http("GET", f"{node.url}/v1/queues/{target}/records?limit=10")
        assert status == 200
        assert [r["value"] for r in body["records"]] == ["r0", "r1", "r2"]
        assert body["next_offset"] == offsets[-1] + 1
    finally:
        node.terminate()


def test_records_older_than_the_cache_are_fetched_by_offset_during_and_after_replay(bootstrap):
    """Spread over 200k records with a tiny cache: the read fetches exactly those offsets.

    The node starts after the data is written, so it replays: until the partition reached the
    end seen at assignment, requests get 503 with Retry-After.
    """
    t = create_topics(bootstrap, partitions=4)
    target = "sparse-spread"
    p = partition_for(target, t.partitions)
    busy = queues_in_partition(p, t.partitions, 50, "busy")
    writer = NodeProcess(t).start()
    try:
        enqueue(writer, target, "first")
        fill(bootstrap, t.data, busy, OTHERS // 2)
        enqueue(writer, target, "middle")
        fill(bootstrap, t.data, busy, OTHERS // 2)
        enqueue(writer, target, "last")
    finally:
        writer.terminate()
    node = NodeProcess(t, extra_env={"VQ_CACHE_MAX_BYTES": "100000"}).start(wait_ready=False)
    try:
        seen = set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            status, body = http("GET", f"{node.url}/v1/queues/{target}/records")
            if status == 0:  # not listening yet
                time.sleep(0.01)
                continue
            if status in (409, 503):
                seen.add((status, body["error"]["code"]))
                time.sleep(0.01)
                continue
            break
        assert status == 200, body
        assert (503, "partition_replaying") in seen, f"never saw the replay: {seen}"
        assert [r["value"] for r in body["records"]] == ["first", "middle", "last"]
    finally:
        node.terminate()
