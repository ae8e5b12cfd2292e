"""Any Kafka producer can enqueue: key = queue name, murmur2 partitioner."""

import time
import uuid
from urllib.parse import quote

from confluent_kafka import Producer

from tests.support import http
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
