"""Any Kafka producer can enqueue: key = queue name, murmur2 partitioner."""

import time
import uuid
from urllib.parse import quote

import pytest
from confluent_kafka import Producer

from tests.support import NodeProcess, create_topics, http
from vqueues.hashing import partition_for


def produce(bootstrap, topic, records, **conf):
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", **conf})
    delivered = []
    for kw in records:
        p.produce(topic, on_delivery=lambda e, m: delivered.append((e, m.partition())), **kw)
    assert p.flush(30) == 0
    assert all(e is None for e, _ in delivered)
    return [part for _, part in delivered]


def read_until(node, queue, count, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = http("GET", f"{node.url}/v1/queues/{queue}/records?wait_ms=500")
        assert status == 200, body
        if len(body["records"]) >= count or time.monotonic() > deadline:
            return body["records"]


@pytest.mark.both_brokers
def test_a_plain_kafka_producers_records_are_served_as_the_queues_records(bootstrap, topics,
                                                                          node):
    q = f"interop/{uuid.uuid4().hex[:6]}-ü"
    parts = produce(bootstrap, topics.data, [
        {"key": q.encode(), "value": b"from kafka 1", "headers": [("origin", b"java")]},
        {"key": q.encode(), "value": b"from kafka 2"},
    ])
    assert parts == [partition_for(q, topics.partitions)] * 2
    records = read_until(node, quote(q, safe=""), 2)
    assert [r["value"] for r in records] == ["from kafka 1", "from kafka 2"]
    assert records[0]["headers"] == {"origin": "java"}


def test_records_without_a_key_or_in_the_wrong_partition_are_not_served(bootstrap, topics,
                                                                        node):
    q = f"misrouted-{uuid.uuid4().hex[:6]}"
    right = partition_for(q, topics.partitions)
    wrong = (right + 1) % topics.partitions
    produce(bootstrap, topics.data, [
        {"key": q.encode(), "value": b"misrouted", "partition": wrong},
        {"key": None, "value": b"keyless", "partition": right},
        {"key": q.encode(), "value": b"good"},
    ])
    records = read_until(node, q, 1)
    assert [r["value"] for r in records] == ["good"]
    status, body = http("GET", f"{node.url}/v1/queues?prefix={q}")
    assert status == 200 and body["queues"] == [q]


def test_own_writes_and_another_producers_writes_to_one_queue_stay_in_offset_order(
        bootstrap, topics, node):
    """The node indexes its own writes at their acknowledgement and the raw producer's through
    its tail; whichever path comes first, the queue's offsets come out sorted, each record once,
    and every enqueue is readable as soon as it is answered."""
    q = f"mixed-{uuid.uuid4().hex[:6]}"
    raw = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", "linger.ms": 0})
    mine: list[int] = []
    for i in range(40):
        raw.produce(topics.data, key=q.encode(), value=f"raw-{i}".encode())
        if i % 3 == 0:
            raw.flush(10)  # sometimes the raw record is in Kafka before ours, sometimes not
        status, body = http("POST", f"{node.url}/v1/queues/{q}/records",
                            {"records": [{"value": f"own-{i}"}]})
        assert status == 200, body
        mine.append(body["offsets"][0])
        status, page = http("GET", f"{node.url}/v1/queues/{q}/records?offset={mine[-1]}&limit=1")
        assert [r["value"] for r in page["records"]] == [f"own-{i}"]  # read-your-writes
    assert raw.flush(30) == 0
    records = read_until(node, q, 80)
    offsets = [r["offset"] for r in records]
    assert len(records) == 80 and offsets == sorted(set(offsets))
    values = [r["value"] for r in records]
    assert [v for v in values if v.startswith("own-")] == [f"own-{i}" for i in range(40)]
    assert [v for v in values if v.startswith("raw-")] == [f"raw-{i}" for i in range(40)]
    status, info = http("GET", f"{node.url}/v1/queues/{q}")
    assert info["records"] == 80


def tail_pauses(node) -> float:
    status, text = http("GET", f"{node.url}/metrics")
    assert status == 200
    for line in text.decode().splitlines():
        if line.startswith('vq_tail_pauses_total{topic="data"}'):
            return float(line.split()[-1])
    raise AssertionError("no vq_tail_pauses_total for the data topic")


def test_the_tail_pauses_after_own_writes_and_still_serves_other_producers(bootstrap):
    """With `tail_pace_ms`, a fetch that brought only the node's own writes pauses the tail:
    own writes stay readable as soon as they are answered (ADR 6), and another producer's
    record is still served, after at most the fetch wait and the pause. With 0 it never
    pauses."""
    q = f"paced-{uuid.uuid4().hex[:6]}"
    topics = create_topics(bootstrap, partitions=4)  # not the module's: its node owns those
    paced = NodeProcess(topics, extra_env={"VQ_TAIL_PACE_MS": "300"}).start()
    try:
        deadline = time.monotonic() + 15
        i = 0
        while i < 10 or (tail_pauses(paced) == 0 and time.monotonic() < deadline):
            status, body = http("POST", f"{paced.url}/v1/queues/{q}/records",
                                {"records": [{"value": f"own-{i}"}]})
            assert status == 200, body
            status, page = http(
                "GET", f"{paced.url}/v1/queues/{q}/records?offset={body['offsets'][0]}&limit=1")
            assert [r["value"] for r in page["records"]] == [f"own-{i}"]  # read-your-writes
            i += 1
            time.sleep(0.02)
        assert tail_pauses(paced) > 0
        produce(bootstrap, topics.data, [{"key": q.encode(), "value": b"from kafka"}])
        records = read_until(paced, q, i + 1)
        assert [r["value"] for r in records] == [f"own-{k}" for k in range(i)] + ["from kafka"]
    finally:
        paced.terminate()
    unpaced = NodeProcess(topics, extra_env={"VQ_TAIL_PACE_MS": "0"}).start()
    try:
        for k in range(10):
            status, body = http("POST", f"{unpaced.url}/v1/queues/{q}/records",
                                {"records": [{"value": f"more-{k}"}]})
            assert status == 200, body
            time.sleep(0.02)
        assert len(read_until(unpaced, q, i + 11)) == i + 11
        assert tail_pauses(unpaced) == 0
    finally:
        unpaced.terminate()
