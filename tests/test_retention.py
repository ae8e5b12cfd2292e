"""Records removed from Kafka (retention, delete_records) are skipped by reads: on real Kafka,
since the embedded broker removes nothing."""

import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support import NodeProcess, create_topics, http, kafka_records


def test_records_below_the_log_start_are_skipped_and_next_offset_moves_past_them(
        kafka_bootstrap):
    bootstrap = kafka_bootstrap  # delete_records: the embedded broker does not remove records
    t = create_topics(bootstrap, partitions=1)
    # A tiny cache, so reads of old records go to Kafka.
    node = NodeProcess(t, extra_env={"VQ_CACHE_MAX_BYTES": "1000"}).start()
    try:
        status, body = http("POST", f"{node.url}/v1/queues/old/records",
                            {"records": [{"value": f"v{i}"} for i in range(20)]})
        assert status == 200
        offsets = body["offsets"]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.delete_records([TopicPartition(t.data, 0, offsets[10])])
        for f in futures.values():
            f.result(30)
        status, got = http("GET", f"{node.url}/v1/queues/old/records?offset=0&limit=100")
        assert status == 200
        assert [r["value"] for r in got["records"]] == [f"v{i}" for i in range(10, 20)]
        assert got["next_offset"] == offsets[-1] + 1
    finally:
        node.terminate()


def test_the_index_follows_the_log_start_and_empty_queues_leave_the_listing(kafka_bootstrap):
    bootstrap = kafka_bootstrap
    t = create_topics(bootstrap, partitions=1)
    node = NodeProcess(t, extra_env={"VQ_RETENTION_CHECK_S": "1"}).start()
    try:
        status, _ = http("POST", f"{node.url}/v1/queues/gone/records",
                         {"records": [{"value": "a"}, {"value": "b"}]})
        assert status == 200
        _, kept = http("POST", f"{node.url}/v1/queues/kept/records",
                       {"records": [{"value": "c"}, {"value": "d"}]})
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.delete_records([TopicPartition(t.data, 0, kept["offsets"][1])]).values():
            f.result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, info = http("GET", f"{node.url}/v1/queues/kept")
            if info["records"] == 1:
                break
            time.sleep(0.2)
        assert (info["records"], info["first_offset"]) == (1, kept["offsets"][1])
        assert http("GET", f"{node.url}/v1/queues/gone")[0] == 404
        assert http("GET", f"{node.url}/v1/queues")[1]["queues"] == ["kept"]
    finally:
        node.terminate()


def test_an_idle_consumer_expires_with_a_tombstone_and_stays_gone_after_a_restart(bootstrap):
    t = create_topics(bootstrap, partitions=1)
    env = {"VQ_RETENTION_CHECK_S": "1", "VQ_CONSUMER_RETENTION_MS": "3000"}
    node = NodeProcess(t, extra_env=env).start()
    try:
        assert http("POST", f"{node.url}/v1/queues/q/records",
                    {"records": [{"value": "a"}, {"value": "b"}]})[0] == 200
        for consumer in ("idle", "busy"):
            assert http("POST", f"{node.url}/v1/queues/q/consumers/{consumer}/ack",
                        {"offset": 1})[0] == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert http("POST", f"{node.url}/v1/queues/q/consumers/busy/ack",
                        {"offset": 1})[0] == 200
            consumers = [c["consumer"] for c in http("GET", f"{node.url}/v1/queues/q")[1]
                         ["consumers"]]
            if consumers == ["busy"]:
                break
            time.sleep(0.5)
        assert consumers == ["busy"]
        assert http("GET", f"{node.url}/v1/queues/q/consumers/idle")[0] == 404
    finally:
        node.terminate()
    tombstones = [key for key, value, _, _ in kafka_records(bootstrap, t.offsets).values()
                  if value is None]
    assert any("idle" in key for key in tombstones)
    # A successor replays the offset topic: the tombstone keeps the consumer gone.
    successor = NodeProcess(t, extra_env={"VQ_CONSUMER_RETENTION_MS": "0"}).start()
    try:
        status, info = http("GET", f"{successor.url}/v1/queues/q")
        assert status == 200
        assert [c["consumer"] for c in info["consumers"]] == ["busy"]
    finally:
        successor.terminate()
